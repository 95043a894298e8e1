"""The extender's HTTP(S) server and its watches.

Routes: ``POST /filter`` and ``POST /prioritize`` (``ExtenderArgs`` in, see
:mod:`.protocol`), ``POST /bind`` (``ExtenderBindingArgs``: creates the pod's Binding,
only for a pod this process approved for that node, so it knows at once where each pod
went and stops counting it in flight elsewhere), ``GET /healthz`` (the process answers),
``GET /readyz`` (both listings done: NodeTopologies, then bound pods), ``GET /metrics``
(Prometheus).

Bad requests get a 400 (413 over ``max_body`` bytes) whose JSON ``Error`` names the
field and the problem; until ready, 503: the scheduler then goes on without the
extender (``ignorable: true``), as it does when the extender is down.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from numalign.api.kube import NT_BASE, ApiError, Kube, KubeConfig
from numalign.api.kube.listwatch import list_watch

from .fleet import Fleet
from .metrics import CONTENT_TYPE, Metrics
from .protocol import (
    ArgsError,
    binding_result,
    error_result,
    filter_result,
    parse_args,
    parse_binding,
    priority_list,
)
from .reservations import Reservations

log = logging.getLogger("numalign.extender")

DEFAULT_PORT = 8890
DEFAULT_MAX_BODY = 16 << 20  # ExtenderArgs with full Node objects of a large cluster
BOUND_PODS = {"fieldSelector": "spec.nodeName!="}
EXPIRE_EVERY = 5.0
BIND_TIMEOUT = 4.0  # below the scheduler's httpTimeout (5s): it then binds without us

T = TypeVar("T")


@dataclass
class Settings:
    addr: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    tls_cert: str | None = None
    tls_key: str | None = None
    client_ca: str | None = None
    max_body: int = DEFAULT_MAX_BODY
    reservation_timeout: float = 120.0


class ExtenderServer:
    def __init__(self, fleet: Fleet, metrics: Metrics | None = None,
                 max_body: int = DEFAULT_MAX_BODY, kube: Kube | None = None) -> None:
        self.fleet = fleet
        self.kube = kube  # the API server (for the bind verb)
        self.metrics = metrics if metrics is not None else Metrics()
        self.metrics.reservations.set_function(lambda: len(self.fleet.reservations))
        self.max_body = max_body
        self.ready = False
        self.waiting_for = "the NodeTopology listing"

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body)
        app.router.add_post("/filter", self.filter)
        app.router.add_post("/prioritize", self.prioritize)
        app.router.add_post("/bind", self.bind)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.render_metrics)
        return app

    async def _read(self, request: web.Request, parse: Callable[[bytes], T],
                    answer: Callable[[str], Any], what: str) -> T | web.Response:
        """The request's body, read by ``parse``; else the verb's error answer
        (``answer(message)``): 503 until ready, 413 over ``max_body``, 400 naming the
        field of ``what`` that is wrong."""
        if not self.ready:
            return web.json_response(answer(
                f"numalign extender not ready: waiting for {self.waiting_for}"), status=503)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return web.json_response(answer(
                f"{what}: the body is over {self.max_body} bytes"), status=413)
        try:
            return parse(body)
        except ArgsError as e:
            log.warning("%s %s: %s", request.method, request.path, e)
            return web.json_response(answer(str(e)), status=400)

    async def _verb(self, request: web.Request, filtering: bool) -> web.Response:
        """Filter (``filtering``) or prioritize: the verdicts, as the verb's answer."""
        t0 = time.perf_counter()
        args = await self._read(request, parse_args, error_result, "ExtenderArgs")
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

    async def bind(self, request: web.Request) -> web.Response:
        """Bind a pod this process approved for the node, through the API server. Any
        error (not ready, not approved here, the API server refusing) is answered as an
        ``ExtenderBindingResult`` error: the scheduler (``ignorable: true``) then binds
        the pod itself."""
        t0 = time.perf_counter()
        args = await self._read(request, parse_binding, binding_result, "ExtenderBindingArgs")
        if isinstance(args, web.Response):
            return args
        if self.kube is None:
            return web.json_response(binding_result(
                "numalign extender: no API server to bind with"), status=503)
        if self.fleet.claim(args.uid, args.node) is None:
            self.metrics.binds.labels(outcome="not-approved").inc()
            log.info("bind %s (%s) to %s: not approved there by this extender; left to the "
                     "scheduler", args.pod_name, args.uid, args.node)
            return web.json_response(binding_result(
                f"numalign extender: pod {args.pod_name} ({args.uid}) was not approved for "
                f"node {args.node} here"))
        path = f"/api/v1/namespaces/{args.namespace}/pods/{args.name}/binding"
        try:
            await self.kube.request("POST", path, body=args.binding(), timeout=BIND_TIMEOUT,
                                    decode=False)
        except (ApiError, TimeoutError, aiohttp.ClientError) as e:
            self.fleet.unclaim(args.uid, args.node)
            self.metrics.binds.labels(outcome="error").inc()
            log.warning("bind %s to %s: %s", args.pod_name, args.node, e)
            return web.json_response(binding_result(
                f"numalign extender: binding {args.pod_name} to {args.node}: {e}"))
        self.metrics.binds.labels(outcome="bound").inc()
        self.metrics.bind_seconds.observe(time.perf_counter() - t0)
        return web.json_response(binding_result())

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
            pacer = GcPacer()
            while True:
                await asyncio.sleep(EXPIRE_EVERY)
                for r in self.fleet.expire():
                    log.info("reservation of %s/%s on %s expired", r.held.namespace,
                             r.held.name, r.node)
                pacer.tick()

        await asyncio.gather(
            list_watch(kube, NT_BASE, nts, self.fleet.node_topology),
            pod_watch(), expire())


class GcPacer:
    """Keeps the cyclic garbage collector's full passes out of filter calls.

    The extender holds many long-lived objects (every node's view and ledger, tens of
    thousands of cached verdicts). Python's full collection walks all of them: measured
    in a burst, 100-200 ms of CPU inside the filter call it happened to start in, the
    slowest 1% of all calls. Every tick (between requests, every few seconds) the young
    generations are collected and the survivors frozen (:func:`gc.freeze`: no later
    collection walks them; their memory is still freed by reference counting when they
    go), so full passes only walk what the last seconds allocated. Rarely
    (``full_every`` ticks) everything is unfrozen and collected once, so cycles that
    became garbage after freezing do not accumulate."""

    def __init__(self, full_every: int = 120) -> None:
        self.full_every = full_every
        self.ticks = 0

    def tick(self) -> None:
        self.ticks += 1
        if self.ticks % self.full_every == 0:
            gc.unfreeze()
            gc.collect()
        else:
            gc.collect(1)
        gc.freeze()


def ssl_context(cert: str, key: str, client_ca: str | None = None) -> ssl.SSLContext:
    """HTTPS with ``cert``/``key``; with ``client_ca``, only clients presenting a
    certificate that CA signed (kube-scheduler's ``tlsConfig.certFile``/``keyFile``)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    if client_ca:
        ctx.load_verify_locations(cafile=client_ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


async def serve(settings: Settings, config: KubeConfig,
                started: Callable[[int], None] | None = None) -> None:
    """Run the extender until cancelled. ``started(port)`` once it listens."""
    fleet = Fleet(reservations=Reservations(settings.reservation_timeout))
    tls = (ssl_context(settings.tls_cert, settings.tls_key, settings.client_ca)
           if settings.tls_cert and settings.tls_key else None)
    # the watches hold two connections; the rest are for bindings
    async with Kube(config, max_connections=8, user_agent="numalign-extender") as kube:
        server = ExtenderServer(fleet, max_body=settings.max_body, kube=kube)
        runner = web.AppRunner(server.app(), access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, settings.addr, settings.port, ssl_context=tls)
            await site.start()
            port = int(runner.addresses[0][1]) if runner.addresses else settings.port
            log.info("numalign extender on %s://%s:%d", "https" if tls else "http",
                     settings.addr, port)
            if started is not None:
                started(port)
            await server.watch(kube)
        finally:
            await runner.cleanup()
