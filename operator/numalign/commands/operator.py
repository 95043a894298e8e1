"""``numalign operator``: run the operator (Kopf) in this process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from numalign.commands import logs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="numalign operator", description=(
        "Resolve pod topology policies, report TopologyPolicies, push node defaults, "
        "serve admission webhooks and redeploy pods rejected with TopologyAffinityError."))
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, in-cluster, "
                   "~/.kube/config)")
    p.add_argument("--namespace", "-n", action="append", default=[],
                   help="watch only this namespace (repeatable; default: all namespaces)")
    p.add_argument("--all-namespaces", "-A", action="store_true", help="watch all namespaces")
    p.add_argument("--peering", metavar="NAME", help="join the ClusterKopfPeering NAME: one "
                   "replica is active, the others stand by (default: standalone)")
    p.add_argument("--priority", type=int, default=0, help="peering priority (higher wins)")
    p.add_argument("--webhook-port", type=int, default=9443)
    p.add_argument("--webhook-addr", default="127.0.0.1", help="address to listen on")
    p.add_argument("--webhook-host", help="host name or IP the API server uses to reach the "
                   "webhooks (default: the listen address)")
    p.add_argument("--webhook-service", metavar="NAMESPACE/NAME",
                   help="the API server calls the webhooks through this Service (its port "
                   "--webhook-port; the certificate names NAME.NAMESPACE.svc) instead of "
                   "https://HOST:PORT")
    p.add_argument("--cert-dir", help="where the webhook certificates are kept")
    p.add_argument("--cert-secret", metavar="NAMESPACE/NAME",
                   help="keep the webhook CA and certificate in this Secret (for replicas)")
    p.add_argument("--no-webhooks", action="store_true", help="serve no admission webhooks")
    p.add_argument("--webhook-exclude-namespace", metavar="NAMESPACE", action="append",
                   default=[], help="a namespace the webhooks never see (repeatable; "
                   "kube-system always)")
    p.add_argument("--recreate-bare-pods", action="store_true",
                   help="redeploy a rejected pod without a controller by recreating it "
                   "(needs `create` on pods: config/recreate-bare-pods); off: it stays "
                   "Failed with an event")
    p.add_argument("--metrics-port", type=int, default=9090, help="0 disables /metrics")
    p.add_argument("--metrics-addr", default="0.0.0.0")
    p.add_argument("--liveness", metavar="URL", nargs="?", const="http://0.0.0.0:8080/healthz",
                   help="serve a liveness probe (default URL http://0.0.0.0:8080/healthz)")
    p.add_argument("--readiness", metavar="URL", nargs="?", const="http://0.0.0.0:8081/readyz",
                   help="serve a readiness probe, ready when the webhook server answers a "
                   "verified TLS handshake (default URL http://0.0.0.0:8081/readyz)")
    p.add_argument("--verbose", "-v", action="store_true")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    logs.configure(logging.DEBUG if args.verbose else logging.INFO)
    if not args.verbose:
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    from numalign.controller import readiness, webhookconfig
    from numalign.controller.main import Options, run

    try:
        if args.webhook_service:
            webhookconfig.parse_service(args.webhook_service, args.webhook_port)
        if args.readiness:
            readiness.parse_url(args.readiness)
    except ValueError as e:
        print(f"numalign operator: {e}", file=sys.stderr)
        return 2

    opts = Options(
        kubeconfig=args.kubeconfig,
        namespaces=[] if args.all_namespaces else list(args.namespace),
        peering=args.peering, priority=args.priority,
        webhooks=not args.no_webhooks, webhook_addr=args.webhook_addr,
        webhook_host=args.webhook_host, webhook_port=args.webhook_port,
        webhook_service=args.webhook_service,
        cert_dir=args.cert_dir, cert_secret=args.cert_secret,
        webhook_exclude=["kube-system", *args.webhook_exclude_namespace],
        recreate_bare_pods=args.recreate_bare_pods,
        metrics_port=args.metrics_port, metrics_addr=args.metrics_addr,
        liveness=args.liveness, readiness=args.readiness)

    async def _main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run(opts, stop_flag=stop)

    try:
        asyncio.run(_main())
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        print(f"numalign operator: {e}", file=sys.stderr)
        return 1
    return 0
