"""Wiring: the Kopf handlers, login, settings, webhook server, metrics; :func:`run`.

Importing this module registers every handler in Kopf's default registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kopf
from aiohttp import web

from numalign.api.names import FINALIZER
from numalign.topology.text import printable

from . import (
    cache,
    claims,
    connection,
    memories,
    metrics,
    nodedefaults,
    pods,
    policies,
    readiness,
    redeploy,
    webhookconfig,
    webhooks,
)

__all__ = ["Options", "cache", "claims", "nodedefaults", "pods", "policies", "redeploy", "run"]

log = logging.getLogger("numalign.operator")


def printable_records(record: logging.LogRecord) -> bool:
    """A logging filter: the record's message as one printable line (control
    characters, bidirectional overrides shown as escapes), for every handler, kopf's
    Event poster included."""
    record.msg = printable(record.getMessage())
    record.args = None
    return True


@dataclass
class Options:
    kubeconfig: str | None = None
    namespaces: list[str] = field(default_factory=list)  # empty: cluster-wide
    peering: str | None = None  # None: standalone
    priority: int = 0
    webhooks: bool = True
    webhook_addr: str = "127.0.0.1"
    webhook_host: str | None = None
    webhook_port: int = 9443
    # The Service the API server calls the webhooks through (NAMESPACE/NAME, port
    # webhook_port); None: at https://webhook_host:webhook_port.
    webhook_service: str | None = None
    cert_dir: str | None = None
    cert_secret: str | None = None
    # Namespaces the webhooks never see (kube-system and numalign's own).
    webhook_exclude: list[str] = field(default_factory=lambda: ["kube-system"])
    recreate_bare_pods: bool = False
    metrics_port: int = 9090
    metrics_addr: str = "0.0.0.0"
    liveness: str | None = None
    readiness: str | None = None  # http://ADDR:PORT/PATH
    resync_interval: float = 5.0


_options = Options()


def current_options() -> Options:
    return _options


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    return connection.connection_info()


async def _periodic_pass() -> None:
    """What changes without an event on the object: node defaults after policy changes,
    policy counts, metrics, released redeploy budgets, Kopf's memories at rest
    (controller.memories). One LIST per cached kind (what watch events missed); the rest
    reads the cache. Idempotent (patches only differences)."""
    await cache.resync()
    await nodedefaults.reconcile_all()
    await policies.reconcile_all()
    await redeploy.periodic_release()
    metrics.refresh_from_node_topologies(cache.node_topologies())
    memories.MEMORIES.prune()


async def _periodic(interval: float) -> None:
    while True:
        try:
            await _periodic_pass()
        except Exception as e:  # keep going whatever happens
            log.warning(f"periodic reconciliation failed: {e}")
        await asyncio.sleep(interval)


async def _renew_certificates(cert_dir: Path, hosts: list[str], secret: str | None,
                              target: webhookconfig.Target, exclude: list[str],
                              interval: float = webhooks.RENEW_CHECK_S) -> None:
    """Renew the serving certificate before it expires, for as long as the operator runs
    (Kopf's server reloads the changed files); rewrite the webhook configurations after."""
    while True:
        await asyncio.sleep(interval)
        try:
            if await webhooks.renew(cert_dir, hosts, secret):
                log.info("webhook certificate renewed")
                ca = (cert_dir / webhooks.CA_FILE).read_bytes()
                await webhookconfig.apply(target, ca, exclude)
        except Exception as e:  # retried at the next check
            log.warning(f"webhook certificate renewal failed: {e}")


class _NoWebhookServer:
    """An admission 'server' that never serves (``--no-webhooks``): the pod backstop
    handler resolves pods instead."""

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        await asyncio.Event().wait()
        yield {}  # never reached


_tasks: list[asyncio.Task[None]] = []
_runners: list[web.AppRunner] = []


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
    opts = _options
    settings.posting.level = logging.WARNING
    # what kopf posts as the objects' Events quotes tenants' names and values: escaped
    logging.getLogger("kopf.objects").addFilter(printable_records)
    settings.watching.server_timeout = 120
    settings.networking.request_timeout = 60
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="numalign.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="numalign.io", key="last-handled-configuration")
    settings.peering.name = opts.peering or "numalign"
    check: readiness.WebhookCheck | None = None
    if opts.webhooks:
        service = (webhookconfig.parse_service(opts.webhook_service, opts.webhook_port)
                   if opts.webhook_service else None)
        host = opts.webhook_host or (service.host if service else opts.webhook_addr)
        cert_dir = Path(opts.cert_dir or tempfile.mkdtemp(prefix="numalign-webhook-"))
        hosts = [host, service.host if service else "", opts.webhook_addr, "127.0.0.1",
                 "localhost"]
        hosts = [h for h in dict.fromkeys(hosts) if h and h not in ("0.0.0.0", "::")]
        await webhooks.certificates(cert_dir, hosts, opts.cert_secret)
        settings.admission.server = webhooks.server(opts.webhook_addr, opts.webhook_port, host,
                                                    cert_dir)
        # Kopf serves the handlers; the configurations are ours (webhookconfig: namespace
        # exclusions, short timeout, nothing removed when a replica stops).
        settings.admission.managed = None
        target: webhookconfig.Target = service or f"https://{host}:{opts.webhook_port}"
        ca = (cert_dir / webhooks.CA_FILE).read_bytes()
        await webhookconfig.apply(target, ca, opts.webhook_exclude)
        _tasks.append(asyncio.create_task(_renew_certificates(
            cert_dir, hosts, opts.cert_secret, target, opts.webhook_exclude)))
        check = readiness.WebhookCheck(opts.webhook_addr, opts.webhook_port, host,
                                       cert_dir / webhooks.CA_FILE)
        logger.info(f"webhooks on https://{host}:{opts.webhook_port} (certificates in "
                    f"{cert_dir}), called at {target}")
    else:
        # Kopf refuses to start with admission handlers and no server: serve nothing.
        settings.admission.server = _NoWebhookServer()
        settings.admission.managed = None
    if opts.readiness:
        _runners.append(await readiness.start(opts.readiness, check))
    _tasks.append(asyncio.create_task(_periodic(opts.resync_interval)))


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    for t in _tasks:
        t.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
    _tasks.clear()
    for r in _runners:
        await r.cleanup()
    _runners.clear()
    await redeploy.stop_workers()
    await connection.close()


async def run(opts: Options, stop_flag: asyncio.Event | None = None,
              ready_flag: asyncio.Event | None = None) -> None:
    """Run the operator in this event loop until ``stop_flag`` is set or it fails."""
    global _options
    _options = opts
    connection.configure(opts.kubeconfig)
    redeploy.rejected.RECREATE_BARE_PODS = opts.recreate_bare_pods
    if opts.metrics_port:  # before Kopf, so that a taken port fails the start at once
        metrics.start_http_server(opts.metrics_port, opts.metrics_addr)
        log.info(f"metrics on http://{opts.metrics_addr}:{opts.metrics_port}/metrics")
    memories.MEMORIES = memories.PrunedMemories()  # a run's own, as Kopf makes them
    await kopf.operator(
        memories=memories.MEMORIES,
        clusterwide=not opts.namespaces,
        namespaces=opts.namespaces,
        standalone=opts.peering is None,
        peering_name=opts.peering,
        priority=opts.priority,
        liveness_endpoint=opts.liveness,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )
