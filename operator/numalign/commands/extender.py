"""``numalign extender``: the kube-scheduler extender (filter, prioritize and bind by each pod's
own topology policy). See :mod:`numalign.extender` and the README section "Scheduler
extender"."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

PROG = "numalign extender"


def parser() -> argparse.ArgumentParser:
    from numalign.extender.guard import Limits
    from numalign.extender.reservations import DEFAULT_TIMEOUT
    from numalign.extender.server import (
        DECIDE_BUDGET,
        DEFAULT_MAX_BODY,
        DEFAULT_PORT,
        DEFAULT_PROBE_PORT,
    )

    limits = Limits()

    p = argparse.ArgumentParser(prog=PROG, description=(
        "A kube-scheduler extender: filter refuses the nodes that would reject the pod "
        "with TopologyAffinityError under the policy that node applies to it; prioritize "
        "ranks the others by alignment (0-10); bind binds the pods it approved. Serves POST "
        "/filter, POST /prioritize, POST /bind (and the probes) on --port, GET /healthz, "
        "/readyz and /metrics on --probe-port. It decides and binds only the pods the API "
        "server has, unbound, of the schedulers it serves (--scheduler-name)."))
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, "
                   "~/.kube/config, else in-cluster)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--addr", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port of the verbs (default {DEFAULT_PORT}; 0: any free port)")
    p.add_argument("--probe-addr", default="0.0.0.0", help="address of the probes' listener")
    p.add_argument("--probe-port", type=int, default=DEFAULT_PROBE_PORT,
                   help="port of GET /healthz, /readyz and /metrics, plain HTTP (default "
                   f"{DEFAULT_PROBE_PORT}; 0: any free port; -1: none)")
    p.add_argument("--scheduler-name", action="append", metavar="NAME",
                   help="a scheduler whose pods this extender decides and binds (repeat "
                   "for several; default default-scheduler); other pods are refused")
    p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate "
                   "(PEM; with --tls-key)")
    p.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    p.add_argument("--client-ca", metavar="FILE", help="with HTTPS, accept only clients "
                   "presenting a certificate this CA signed (kube-scheduler's "
                   "tlsConfig.certFile/keyFile): nobody else can filter or bind")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY,
                   help=f"largest request accepted (default {DEFAULT_MAX_BODY}, enough for "
                   "nodeCacheCapable requests of 5,000 nodes; it also bounds the JSON values "
                   "of one request to one per 16 bytes of it)")
    p.add_argument("--request-timeout", type=float, default=limits.body_timeout,
                   metavar="SECONDS", help="time a client has to send a request's head, "
                   f"and again its body, or a TLS handshake (default {limits.body_timeout:g})")
    p.add_argument("--max-connections", type=int, default=limits.max_connections,
                   help="connections served at once per listener; more are closed "
                   f"(default {limits.max_connections})")
    p.add_argument("--decide-budget", type=float, default=DECIDE_BUDGET, metavar="SECONDS",
                   help="time one pod's filter may spend deciding; the nodes left pass "
                   f"undecided (default {DECIDE_BUDGET:g}, below the scheduler's 5s "
                   "httpTimeout)")
    p.add_argument("--reservation-timeout", type=float, default=DEFAULT_TIMEOUT,
                   metavar="SECONDS", help="drop a reservation its node has not published "
                   f"after this long (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--port-file", metavar="FILE", help="write the verbs' port (and on a "
                   "second line the probes' port) here once serving (with --port 0)")
    p.add_argument("--verbose", "-v", action="store_true", help="log every refusal")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if bool(args.tls_cert) != bool(args.tls_key):
        print(f"{PROG}: give both --tls-cert and --tls-key, or neither", file=sys.stderr)
        return 2
    if args.client_ca and not args.tls_cert:
        print(f"{PROG}: --client-ca needs HTTPS (--tls-cert and --tls-key)", file=sys.stderr)
        return 2
    if args.max_body_bytes < 1024:
        print(f"{PROG}: --max-body-bytes must be at least 1024", file=sys.stderr)
        return 2
    for flag, value in (("--reservation-timeout", args.reservation_timeout),
                        ("--request-timeout", args.request_timeout),
                        ("--decide-budget", args.decide_budget),
                        ("--max-connections", args.max_connections)):
        if not value > 0:
            print(f"{PROG}: {flag} must be positive", file=sys.stderr)
            return 2
    if args.probe_port < -1:
        print(f"{PROG}: --probe-port must be a port, 0 (any free one) or -1 (none)",
              file=sys.stderr)
        return 2
    schedulers = args.scheduler_name or ["default-scheduler"]
    if any(not n or len(n) > 253 for n in schedulers):
        print(f"{PROG}: --scheduler-name must be a scheduler name of 1-253 characters",
              file=sys.stderr)
        return 2
    from numalign.commands.logs import configure

    configure(logging.DEBUG if args.verbose else logging.INFO)
    from numalign.api.kube import load_config
    from numalign.extender.guard import Limits
    from numalign.extender.server import Settings, serve

    try:
        config = load_config(args.kubeconfig, args.context)
    except Exception as e:  # ConfigError, missing file, bad YAML ...
        print(f"{PROG}: cannot load the Kubernetes credentials: {e}", file=sys.stderr)
        return 1
    t = args.request_timeout
    settings = Settings(addr=args.addr, port=args.port, probe_addr=args.probe_addr,
                        probe_port=None if args.probe_port == -1 else args.probe_port,
                        tls_cert=args.tls_cert, tls_key=args.tls_key, client_ca=args.client_ca,
                        limits=Limits(args.max_body_bytes, t, t, t, args.max_connections),
                        reservation_timeout=args.reservation_timeout,
                        schedulers=frozenset(schedulers), decide_budget=args.decide_budget)

    def started(port: int, probe_port: int | None) -> None:
        if args.port_file:
            with open(args.port_file, "w") as f:
                f.write(f"{port}\n" + (f"{probe_port}\n" if probe_port is not None else ""))

    async def _main() -> None:
        task = asyncio.create_task(serve(settings, config, started))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    try:
        asyncio.run(_main())
    except KeyboardInterrupt:
        return 130
    except OSError as e:  # the port is taken, the certificate unreadable ...
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    return 0
