"""The extender's HTTP(S) servers and its watches.

The verbs (HTTPS with the scheduler's client certificate where configured):
``POST /filter`` and ``POST /prioritize`` (``ExtenderArgs`` in, see :mod:`.protocol`),
``POST /bind`` (``ExtenderBindingArgs``: creates the pod's Binding, only for a pod this
process approved for that node, so it knows at once where each pod went and stops
counting it in flight elsewhere). The probes, on a listener of their own (plain HTTP):
``GET /healthz`` (the process answers), ``GET /readyz`` (the listings done:
NodeTopologies, then bound and unbound pods), ``GET /metrics`` (Prometheus); the verbs'
listener answers them too.

A request's pod is only a name: the extender decides and binds the pod the API server
has under that uid (:mod:`.pending`), unbound and of a scheduler it serves; anything
else is refused (403) and nothing of it is kept. Bad requests get a 400 (408 too slow,
413 too large: :mod:`.guard`) whose JSON ``Error`` names the field and the problem;
until ready, 503: the scheduler then goes on without the extender (``ignorable:
true``), as it does when the extender is down.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import ssl
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from numalign.api.draclaims import claim_path, uses_claims
from numalign.api.kube import NT_BASE, ApiError, Kube, KubeConfig
from numalign.api.kube.client import pod_path
from numalign.api.kube.listwatch import list_watch

from .bindorder import BindOrder
from .decide import Decider
from .dra import KINDS, PATHS, DraCatalog
from .fleet import Fleet, pod_uid
from .guard import DEFAULT_MAX_BODY, BodyRefused, GuardedSite, Limits
from .metrics import CONTENT_TYPE, Metrics
from .pending import DEFAULT_SCHEDULERS, UNBOUND, PendingPods, Refusal
from .protocol import (
    ArgsError,
    BindingArgs,
    ExtenderArgs,
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
DEFAULT_PROBE_PORT = 8891
BOUND_PODS = {"fieldSelector": "spec.nodeName!="}
EXPIRE_EVERY = 5.0
BIND_TIMEOUT = 4.0  # below the scheduler's httpTimeout (5s): it then binds without us
MAX_CLAIM_READS = 16  # a pod's claims read at bind (more: as the watch has them)
CLAIM_READ_TIMEOUT = 0.8  # each such read (else: as the watch has the claim)
EARLIER_POLL = 0.01  # seconds between looks at the pods a binding waits for
LANDED_TIMEOUT = 0.8  # after a failed binding, the read of whether it landed anyway
DECIDE_BUDGET = 2.0  # seconds one pod's filter may decide; below the httpTimeout (5s)
# One connection per watch: NodeTopologies, bound pods, unbound pods, the DRA kinds.
WATCH_CONNECTIONS = 3 + len(KINDS)
VERB_CONNECTIONS = 32  # the bindings and the reads of pods and claims: a pool of their own
NO_AUTOMATIC_FULL = 1 << 30  # the collector's third threshold under GcPacer

__all__ = ["DEFAULT_MAX_BODY", "DEFAULT_PORT", "DEFAULT_PROBE_PORT", "ExtenderServer",
           "GcPacer", "Settings", "api_clients", "serve", "ssl_context"]

T = TypeVar("T")


@dataclass
class Settings:
    addr: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    probe_addr: str = "0.0.0.0"
    probe_port: int | None = DEFAULT_PROBE_PORT  # None: no probe listener
    tls_cert: str | None = None
    tls_key: str | None = None
    client_ca: str | None = None
    limits: Limits = field(default_factory=Limits)
    reservation_timeout: float = 120.0
    schedulers: frozenset[str] = DEFAULT_SCHEDULERS
    decide_budget: float = DECIDE_BUDGET

    @property
    def max_body(self) -> int:
        return self.limits.max_body


def _same_pod(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Two slim pods decide alike (the same spec and annotations read)."""
    def part(p: Mapping[str, Any]) -> tuple[Any, Any]:
        meta = p.get("metadata") or {}
        return meta.get("annotations"), p.get("spec")
    return part(a) == part(b)


class ExtenderServer:
    def __init__(self, fleet: Fleet, metrics: Metrics | None = None,
                 max_body: int | None = None, kube: Kube | None = None,
                 pending: PendingPods | None = None, limits: Limits | None = None) -> None:
        self.fleet = fleet
        self.kube = kube  # the API server (for the bind verb)
        self.pending = pending if pending is not None else PendingPods(kube=kube)
        self.metrics = metrics if metrics is not None else Metrics()
        self.metrics.reservations.set_function(lambda: len(self.fleet.reservations))
        self.metrics.pending.set_function(lambda: len(self.pending))
        self.metrics.pod_reads.set_function(lambda: self.pending.looked_up)
        limits = limits if limits is not None else Limits()
        if max_body is not None:
            limits = replace(limits, max_body=max_body)
        self.limits = limits
        self.ready = False
        self.waiting_for = "the NodeTopology listing"
        self.bind_order = BindOrder()  # a node's bindings land as they were counted

    @property
    def max_body(self) -> int:
        return self.limits.max_body

    def app(self) -> web.Application:
        """The verbs (and the probes)."""
        app = self.probe_app()
        app.router.add_post("/filter", self.filter)
        app.router.add_post("/prioritize", self.prioritize)
        app.router.add_post("/bind", self.bind)
        return app

    def probe_app(self) -> web.Application:
        """The probes and /metrics only."""
        app = web.Application(client_max_size=self.limits.max_body)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.render_metrics)
        return app

    async def _read(self, request: web.Request, parse: Callable[[bytes], T],
                    answer: Callable[[str], Any], what: str) -> T | web.Response:
        """The request's body, read by ``parse``; else the verb's error answer
        (``answer(message)``): 503 until ready, 408/413 past the limits, 400 naming the
        field of ``what`` that is wrong."""
        if not self.ready:
            return web.json_response(answer(
                f"numalign extender not ready: waiting for {self.waiting_for}"), status=503)
        try:
            body = await self.limits.read(request, what)
        except BodyRefused as e:
            self.metrics.requests_refused.labels(verb=request.path, why=str(e.status)).inc()
            refused = web.json_response(answer(e.message), status=e.status)
            refused.force_close()  # what is left of the body is not read: the connection goes
            return refused
        try:
            return parse(body)
        except ArgsError as e:
            self.metrics.requests_refused.labels(verb=request.path, why="400").inc()
            log.debug("%s %s: %s", request.method, request.path, e)
            return web.json_response(answer(str(e)), status=400)

    async def _pod(self, request: web.Request, args: ExtenderArgs
                   ) -> Mapping[str, Any] | web.Response:
        """The API server's pod that ``args`` names (403 when it is not one we decide)."""
        meta = args.pod.get("metadata") or {}
        got = await self.pending.lookup(str(meta.get("uid") or ""),
                                        str(meta.get("namespace") or "default"),
                                        str(meta.get("name")))
        if isinstance(got, Refusal):
            self.metrics.requests_refused.labels(verb=request.path, why="not-pending").inc()
            log.debug("%s: %s", request.path, got.message)
            return web.json_response(error_result(got.message), status=403)
        return got

    async def _verb(self, request: web.Request, filtering: bool) -> web.Response:
        """Filter (``filtering``) or prioritize: the verdicts, as the verb's answer."""
        t0 = time.perf_counter()
        args = await self._read(request, parse_args, error_result, "ExtenderArgs")
        if isinstance(args, web.Response):
            return args
        pod = await self._pod(request, args)
        if isinstance(pod, web.Response):
            return pod
        t1, c1 = time.perf_counter(), time.thread_time()
        try:
            verdicts = self.fleet.filter(pod, args.node_names, approve=filtering)
        except Exception as e:  # never take the scheduler down with us: it goes on
            log.exception("%s %s", request.path, args.pod_name)
            return web.json_response(error_result(f"numalign extender: {e}"), status=500)
        verb = "filter" if filtering else "prioritize"
        self.metrics.decide_seconds.labels(verb=verb).observe(time.perf_counter() - t1)
        self.metrics.decide_cpu_seconds.labels(verb=verb).observe(time.thread_time() - c1)
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
        """Bind a pod this process approved for the node, through the API server: only
        the pod the API server has under that uid, still unbound, of a scheduler we
        serve, as it was when approved, onto a node this process decided. Any error
        (not ready, not approved here, the API server refusing) is answered as an
        ``ExtenderBindingResult`` error: the scheduler (``ignorable: true``) then binds
        the pod itself."""
        t0 = time.perf_counter()
        args = await self._read(request, parse_binding, binding_result, "ExtenderBindingArgs")
        if isinstance(args, web.Response):
            return args
        if self.kube is None:
            return web.json_response(binding_result(
                "numalign extender: no API server to bind with"), status=503)
        approved = self.fleet.approved(args.uid, args.node)
        if approved is None:
            self.metrics.binds.labels(outcome="not-approved").inc()
            log.info("bind %s (%s) to %s: not approved there by this extender; left to the "
                     "scheduler", args.pod_name, args.uid, args.node)
            return web.json_response(binding_result(
                f"numalign extender: pod {args.pod_name} ({args.uid}) was not approved for "
                f"node {args.node} here"))
        # the pods approved after it for other nodes need not wait for it from now on
        self.fleet.in_flight.heading(args.uid, args.node)
        pod = await self.pending.lookup(args.uid, args.namespace, args.name)
        if isinstance(pod, Refusal) or not _same_pod(pod, approved):
            why = (pod.message if isinstance(pod, Refusal) else
                   f"numalign extender: pod {args.pod_name} ({args.uid}) changed since it "
                   "was approved")
            self.metrics.binds.labels(outcome="not-approved").inc()
            log.info("bind %s to %s: %s; left to the scheduler", args.pod_name, args.node, why)
            return web.json_response(binding_result(why))
        await self._read_claims(approved)
        waited = time.perf_counter()
        if not await self._after_earlier(args.uid, args.node):
            self.metrics.bind_turns_missed.inc()
            log.info("bind %s to %s: pods approved there before it are still in flight; "
                     "posted without waiting longer", args.pod_name, args.node)
        async with self.bind_order.turn(args.node) as in_turn:
            if not in_turn:
                self.metrics.bind_turns_missed.inc()
                log.info("bind %s to %s: the binding before it there has not landed; posted "
                         "without waiting longer", args.pod_name, args.node)
            self.fleet.bound_to(approved, args.node)  # counts as bound there from now on
            path = pod_path(args.namespace, args.name, "binding")
            # what the turn took comes off the binding's time: the scheduler's httpTimeout
            # bounds the whole call
            timeout = BIND_TIMEOUT - (time.perf_counter() - waited)
            try:
                await self.kube.request("POST", path, body=args.binding(), timeout=timeout,
                                        decode=False)
            except (ApiError, TimeoutError, aiohttp.ClientError) as e:
                if await self._landed(args, e):
                    self.pending.forget(args.uid)
                    self.metrics.binds.labels(outcome="bound").inc()
                    return web.json_response(binding_result())
                self.fleet.unclaim(args.uid, args.node)
                self.metrics.binds.labels(outcome="error").inc()
                log.warning("bind %s to %s: %s", args.pod_name, args.node, e)
                return web.json_response(binding_result(
                    f"numalign extender: binding {args.pod_name} to {args.node}: {e}"))
        self.pending.forget(args.uid)
        self.metrics.binds.labels(outcome="bound").inc()
        self.metrics.bind_seconds.observe(time.perf_counter() - t0)
        return web.json_response(binding_result())

    async def _after_earlier(self, uid: str, node: str) -> bool:
        """Wait until no pod approved for ``node`` before ``uid`` is still in flight
        (each is bound, here or elsewhere, or gone) unless its own bind verb names another
        node; False if some still are after the turn wait. The pod was decided with
        those landing first: bound before them, it would be admitted first, and one of
        them, decided without it, could be refused
        (a best-effort pod whose devices the allocator spread over two NUMA nodes groups
        them for memory, and the single-numa-node pod approved before it cannot have
        its memory on either). kube-scheduler binds pods at once, and a pod with claims
        waits for its claims' allocation to be written first: the bindings to one node
        can come in another order than their pods were filtered."""
        end = time.monotonic() + self.bind_order.turn_wait
        while self.fleet.in_flight.before(uid, node):
            if time.monotonic() >= end:
                return False
            await asyncio.sleep(EARLIER_POLL)
        return True

    async def _read_claims(self, pod: Mapping[str, Any]) -> None:
        """A pod with claims: read them from the API server before the pod holds its
        room on the node. The scheduler wrote their allocation before asking to bind,
        but the claims' watch may not show it yet; the pod's hold must count the CPUs
        and memory it will get next to the devices it got, not next to any device the
        allocator might have given (the next pods are decided against that hold). A
        claim that cannot be read is left as the watch has it."""
        dra, kube = self.fleet.decider.dra, self.kube
        if dra is None or kube is None or not uses_claims(pod):
            return
        ns = str((pod.get("metadata") or {}).get("namespace") or "default")

        async def read(name: str) -> None:
            try:
                got = await kube.request("GET", claim_path(ns, name),
                                         timeout=CLAIM_READ_TIMEOUT)
            except (ApiError, TimeoutError, aiohttp.ClientError) as e:
                log.info("bind %s/%s: claim %s not read (%s); as the watch has it",
                         ns, (pod.get("metadata") or {}).get("name"), name, e)
                return
            if isinstance(got, Mapping):
                dra.event("resourceclaims", "MODIFIED", got)

        # at once: a pod's claims cost one read's time, not one per claim
        await asyncio.gather(*(read(n) for n in dra.claim_names(pod)[:MAX_CLAIM_READS]))

    async def _landed(self, args: BindingArgs, error: Exception) -> bool:
        """Whether a binding that failed here is there all the same: the API server
        answered too late (it is slow) or says the pod is bound to that very node. Told
        "failed", the scheduler would bind the pod itself, get 409 (already assigned) and
        count an error and retry a pod already placed. One quick read of the pod."""
        if isinstance(error, ApiError):
            return error.status == 409 and f'already assigned to node "{args.node}"' in str(
                error.message)
        assert self.kube is not None
        try:
            got = await self.kube.request("GET", pod_path(args.namespace, args.name),
                                          timeout=LANDED_TIMEOUT)
        except (ApiError, TimeoutError, aiohttp.ClientError):
            return False
        meta, spec = got.get("metadata") or {}, got.get("spec") or {}
        return meta.get("uid") == args.uid and spec.get("nodeName") == args.node

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
        """Feed the fleet: NodeTopologies (listed first), then bound pods, and the
        unbound pods of our schedulers; expire reservations meanwhile. Runs until
        cancelled."""
        listed = asyncio.Event()
        pods_listed = asyncio.Event()
        pending_listed = asyncio.Event()

        def nts(items: list[dict[str, Any]]) -> None:
            self.fleet.load_nodetopologies(items)
            if not listed.is_set():
                self.waiting_for = "the listing of pods"
            listed.set()

        def check_ready() -> None:
            if not self.ready and pods_listed.is_set() and pending_listed.is_set():
                log.info("ready: %d nodes, %d reservations rebuilt from bound pods, %d "
                         "unbound pods", len(self.fleet.decider.views),
                         len(self.fleet.reservations), len(self.pending))
                self.ready = True

        def pods(items: list[dict[str, Any]]) -> None:
            self.fleet.load_pods(items)
            pods_listed.set()
            check_ready()

        def pod(event: str, obj: dict[str, Any]) -> None:
            self.pending.forget(pod_uid(obj))  # bound: no longer a pod to approve
            self.fleet.pod(event, obj)

        def unbound(items: list[dict[str, Any]]) -> None:
            self.pending.load(items)
            pending_listed.set()
            check_ready()

        async def pod_watch() -> None:
            await listed.wait()
            await list_watch(kube, "/api/v1/pods", pods, pod, params=BOUND_PODS)

        async def pending_watch() -> None:
            await listed.wait()
            await list_watch(kube, "/api/v1/pods", unbound, self.pending.event,
                             params=UNBOUND)

        async def expire() -> None:
            pacer = GcPacer()
            try:
                while True:
                    await asyncio.sleep(EXPIRE_EVERY)
                    for r in self.fleet.expire():
                        log.info("reservation of %s/%s on %s expired", r.held.namespace,
                                 r.held.name, r.node)
                    pacer.tick()
            finally:
                pacer.close()

        await asyncio.gather(
            list_watch(kube, NT_BASE, nts, self.fleet.node_topology),
            pod_watch(), pending_watch(), expire(), *self._dra_watches(kube))

    def _dra_watches(self, kube: Kube) -> list[Coroutine[Any, Any, None]]:
        """The watches of the DRA objects (:mod:`.dra`); until each kind is listed, pods
        with claims pass undecided (a cluster without resource.k8s.io/v1 keeps them so)."""
        dra = self.fleet.decider.dra
        if dra is None:
            return []

        def watch(kind: str) -> Coroutine[Any, Any, None]:
            return list_watch(kube, PATHS[kind], lambda items: dra.load(kind, items),
                              lambda event, obj: dra.event(kind, event, obj),
                              max_retry=60.0)

        return [watch(k) for k in KINDS]


class GcPacer:
    """Keeps the cyclic garbage collector's full passes out of filter calls.

    The extender holds many long-lived objects (every node's view and ledger, tens of
    thousands of cached verdicts). Python's full collection walks all of them: measured
    in a burst, 100-200 ms of CPU inside the filter call it happened to start in, the
    slowest 1% of all calls. Every tick (between requests, every few seconds) the young
    generations are collected and the survivors frozen (:func:`gc.freeze`: no later
    collection walks them; their memory is still freed by reference counting when they
    go). Rarely (``full_every`` ticks) everything is unfrozen and collected once, so
    cycles that became garbage after freezing do not accumulate. The collector's own full
    passes are left to the pacer (its third threshold raised out of reach):
    even over the few seconds' survivors not frozen yet, they came every few hundred
    filters in a burst and cost 5-50 ms inside the call they started in (500 nodes, in
    process: filter p99 23 ms with them, 17 ms without). The decisions make no cycles
    (a full pass after a burst finds none); what else does waits for the rare pass."""

    def __init__(self, full_every: int = 120) -> None:
        self.full_every = full_every
        self.ticks = 0
        self.thresholds = gc.get_threshold()
        gc.set_threshold(*self.thresholds[:2], NO_AUTOMATIC_FULL)

    def close(self) -> None:
        """The collector as it was."""
        gc.set_threshold(*self.thresholds)

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


def api_clients(config: KubeConfig) -> tuple[Kube, Kube]:
    """The watches' client (a connection for each watch) and the verbs' (bindings, pod
    and claim reads) on a pool of their own, opened and closed with it. Sharing one pool
    of ten, the watches held all but three of its connections: in a burst the bindings
    queued for those three until they timed out, and kube-scheduler bound the pods itself
    after waiting for us (the fleet bench at 250 nodes / 5,000 pods: 2,902 bindings
    failed; a pool of 8 for them: 1,191; of 32: none)."""
    kube = Kube(config, max_connections=WATCH_CONNECTIONS + 1,
                user_agent="numalign-extender")
    return kube, kube.lane(VERB_CONNECTIONS)


async def serve(settings: Settings, config: KubeConfig,
                started: Callable[[int, int | None], None] | None = None) -> None:
    """Run the extender until cancelled. ``started(port, probe_port)`` once it listens."""
    fleet = Fleet(Decider(dra=DraCatalog()),
                  reservations=Reservations(settings.reservation_timeout))
    fleet.budget = settings.decide_budget
    tls = (ssl_context(settings.tls_cert, settings.tls_key, settings.client_ca)
           if settings.tls_cert and settings.tls_key else None)
    kube, verbs = api_clients(config)
    async with kube:
        pending = PendingPods(settings.schedulers, verbs)
        server = ExtenderServer(fleet, kube=verbs, pending=pending, limits=settings.limits)
        runners = [web.AppRunner(server.app(), access_log=None,
                                 **settings.limits.runner_args())]
        if settings.probe_port is not None:
            runners.append(web.AppRunner(server.probe_app(), access_log=None,
                                         **settings.limits.runner_args()))
        for r in runners:
            await r.setup()
        try:
            site = GuardedSite(runners[0], settings.addr, settings.port, settings.limits,
                               ssl_context=tls)
            await site.start()
            port = int(runners[0].addresses[0][1]) if runners[0].addresses else settings.port
            probe_port = None
            if settings.probe_port is not None:
                probe = GuardedSite(runners[1], settings.probe_addr, settings.probe_port,
                                    settings.limits)
                await probe.start()
                probe_port = int(runners[1].addresses[0][1])
            if tls is None or not settings.client_ca:
                log.warning("the verbs are served without client authentication: anyone "
                            "who reaches port %d can filter and bind (give --tls-cert, "
                            "--tls-key and --client-ca)", port)
            log.info("numalign extender on %s://%s:%d (probes: %s)",
                     "https" if tls else "http", settings.addr, port,
                     f"http://{settings.probe_addr}:{probe_port}" if probe_port else "none")
            if started is not None:
                started(port, probe_port)
            await server.watch(kube)
        finally:
            for r in runners:
                await r.cleanup()
