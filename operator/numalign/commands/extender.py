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
    from numalign.extender.reservations import DEFAULT_TIMEOUT
    from numalign.extender.server import DEFAULT_MAX_BODY, DEFAULT_PORT

    p = argparse.ArgumentParser(prog=PROG, description=(
        "A kube-scheduler extender: filter refuses the nodes that would reject the pod "
        "with TopologyAffinityError under the policy that node applies to it; prioritize "
        "ranks the others by alignment (0-10); bind binds the pods it approved. Serves POST "
        "/filter, POST /prioritize, POST /bind, "
        "GET /healthz, /readyz and /metrics."))
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, "
                   "~/.kube/config, else in-cluster)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--addr", default="0.0.0.0", help="address to listen on")
    p.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help=f"port to listen on (default {DEFAULT_PORT}; 0: any free port)")
    p.add_argument("--tls-cert", metavar="FILE", help="serve HTTPS with this certificate "
                   "(PEM; with --tls-key)")
    p.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM)")
    p.add_argument("--client-ca", metavar="FILE", help="with HTTPS, accept only clients "
                   "presenting a certificate this CA signed (kube-scheduler's "
                   "tlsConfig.certFile/keyFile): nobody else can filter or bind")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY,
                   help=f"largest request accepted (default {DEFAULT_MAX_BODY})")
    p.add_argument("--reservation-timeout", type=float, default=DEFAULT_TIMEOUT,
                   metavar="SECONDS", help="drop a reservation its node has not published "
                   f"after this long (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--port-file", metavar="FILE", help="write the port listened on here "
                   "once serving (with --port 0)")
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
    if args.reservation_timeout <= 0:
        print(f"{PROG}: --reservation-timeout must be positive", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from numalign.api.kube import load_config
    from numalign.extender.server import Settings, serve

    try:
        config = load_config(args.kubeconfig, args.context)
    except Exception as e:  # ConfigError, missing file, bad YAML ...
        print(f"{PROG}: cannot load the Kubernetes credentials: {e}", file=sys.stderr)
        return 1
    settings = Settings(addr=args.addr, port=args.port, tls_cert=args.tls_cert,
                        tls_key=args.tls_key, client_ca=args.client_ca,
                        max_body=args.max_body_bytes, reservation_timeout=args.reservation_timeout)

    def started(port: int) -> None:
        if args.port_file:
            with open(args.port_file, "w") as f:
                f.write(f"{port}\n")

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
