"""The extender's HTTP(S) server and its watches.

Routes: ``POST /filter`` and ``POST /prioritize`` (``ExtenderArgs`` in, see
:mod:`.protocol`), ``GET /healthz`` (the process answers), ``GET /readyz`` (both
listings done: NodeTopologies, then bound pods), ``GET /metrics`` (Prometheus).

Bad requests get a 400 (413 over ``max_body`` bytes) whose JSON ``Error`` names the
field and the problem; until ready, 503: the scheduler then goes on without the
extender (``ignorable: true``), as it does when the extender is down.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from numalign.api.kube import NT_BASE, Kube, KubeConfig
from numalign.api.kube.listwatch import list_watch

from .fleet import Fleet
from .metrics import CONTENT_TYPE, Metrics
from .protocol import (
    ArgsError,
    ExtenderArgs,
    error_result,
    filter_result,
    parse_args,
    priority_list,
)
from .reservations import Reservations

log = logging.getLogger("numalign.extender")

DEFAULT_PORT = 8890
DEFAULT_MAX_BODY = 16 << 20  # ExtenderArgs with full Node objects of a large cluster
BOUND_PODS = {"fieldSelector": "spec.nodeName!="}
EXPIRE_EVERY = 5.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Settings:
    addr: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    tls_cert: str | None = None
    tls_key: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    reservation_timeout: float = 120.0


class ExtenderServer:
    def __init__(self, fleet: Fleet, metrics: Metrics | None = None,
                 max_body: int = DEFAULT_MAX_BODY) -> None:
        self.fleet = fleet
        self.metrics = metrics if metrics is not None else Metrics()
        self.metrics.reservations.set_function(lambda: len(self.fleet.reservations))
        self.max_body = max_body
        self.ready = False
        self.waiting_for = "the NodeTopology listing"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body)
        app.router.add_post("/filter", self.filter)
        app.router.add_post("/prioritize", self.prioritize)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.render_metrics)
        return app

    async def _args(self, request: web.Request) -> ExtenderArgs | web.Response:
        if not self.ready:
            return web.json_response(error_result(
                f"numalign extender not ready: waiting for {self.waiting_for}"), status=503)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return web.json_response(error_result(
                f"ExtenderArgs: the body is over {self.max_body} bytes"), status=413)
        try:
            return parse_args(body)
        except ArgsError as e:
            log.warning("%s %s: %s", request.method, request.path, e)
            return web.json_response(error_result(str(e)), status=400)

    async def _verb(self, request: web.Request, filtering: bool) -> web.Response:
        """Filter (``filtering``) or prioritize: the verdicts, as the verb's answer."""
        t0 = time.perf_counter()
        args = await self._args(request)
        if isinstance(args, web.Response):
            return args
        try:
            verdicts = self.fleet.filter(args.pod, args.node_names, approve=filtering)
        except Exception as e:  # never take the scheduler down with us: it goes on
            log.exception("%s %s", request.path, args.pod_name)
            return web.json_response(error_result(f"numalign extender: {e}"), status=500)
        if not filtering:
            self.metrics.prioritize_seconds.observe(time.perf_counter() - t0)
            return web.json_response(priority_list(verdicts))
        refused: dict[str, int] = {}
        debug = log.isEnabledFor(logging.DEBUG)
        for v in verdicts:
            if not v.fits:
                refused[v.reason or ""] = refused.get(v.reason or "", 0) + 1
                if debug:
                    log.debug("filter %s: %s refused: %s", args.pod_name, v.node, v.failure)
        for reason, n in refused.items():
            self.metrics.refusals.labels(reason=reason).inc(n)
        result = filter_result(args, verdicts)
        self.metrics.filter_seconds.observe(time.perf_counter() - t0)
        return web.json_response(result)

    async def filter(self, request: web.Request) -> web.Response:
        return await self._verb(request, filtering=True)

    async def prioritize(self, request: web.Request) -> web.Response:
        return await self._verb(request, filtering=False)

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(self, _request: web.Request) -> web.Response:
        if self.ready:
            return web.Response(text="ok")
        return web.Response(text=f"waiting for {self.waiting_for}", status=503)

    async def render_metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": CONTENT_TYPE})

    # ------------------------------------------------------------ watches

    async def watch(self, kube: Kube) -> None:
        """Feed the fleet: NodeTopologies (listed first), then bound pods; expire
        reservations meanwhile. Runs until cancelled."""
        listed = asyncio.Event()

        def nts(items: list[dict[str, Any]]) -> None:
            self.fleet.load_nodetopologies(items)
            if not listed.is_set():
                self.waiting_for = "the listing of bound pods"
            listed.set()

        def pods(items: list[dict[str, Any]]) -> None:
            self.fleet.load_pods(items)
            if not self.ready:
                log.info("ready: %d nodes, %d reservations rebuilt from bound pods",
                         len(self.fleet.decider.views), len(self.fleet.reservations))
            self.ready = True

        async def pod_watch() -> None:
            await listed.wait()
            await list_watch(kube, "/api/v1/pods", pods, self.fleet.pod, params=BOUND_PODS)

        async def expire() -> None:
            while True:
                await asyncio.sleep(EXPIRE_EVERY)
                for r in self.fleet.expire():
                    log.info("reservation of %s/%s on %s expired", r.held.namespace,
                             r.held.name, r.node)

        await asyncio.gather(
            list_watch(kube, NT_BASE, nts, self.fleet.node_topology),
            pod_watch(), expire())


def ssl_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


async def serve(settings: Settings, config: KubeConfig,
                started: Callable[[int], None] | None = None) -> None:
    """Run the extender until cancelled. ``started(port)`` once it listens."""
    fleet = Fleet(reservations=Reservations(settings.reservation_timeout))
    server = ExtenderServer(fleet, max_body=settings.max_body)
    tls = (ssl_context(settings.tls_cert, settings.tls_key)
           if settings.tls_cert and settings.tls_key else None)
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.addr, settings.port, ssl_context=tls)
    await site.start()
    port = int(runner.addresses[0][1]) if runner.addresses else settings.port
    log.info("numalign extender on %s://%s:%d", "https" if tls else "http", settings.addr,
             port)
    if started is not None:
        started(port)
    try:
        async with Kube(config, max_connections=4, user_agent="numalign-extender") as kube:
            await server.watch(kube)
    finally:
        await runner.cleanup()
