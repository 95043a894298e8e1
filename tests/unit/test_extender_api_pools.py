"""The extender's bindings never wait for a connection its watches hold.

Its watches (NodeTopologies, bound and unbound pods, four DRA kinds) each hold an API
server connection for as long as they run. On one shared pool of ten, the bindings of a
burst queued for the three left until they timed out and kube-scheduler bound the pods
itself after waiting for us (the fleet bench at 250 nodes / 5,000 pods: 2,902 of 5,000
bindings failed). Here a fake API server holds every watch open and answers no binding
until a whole burst of them is in flight at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from numalign.api.kube import KubeConfig
from numalign.extender.decide import Decider
from numalign.extender.dra import DraCatalog
from numalign.extender.fleet import Fleet
from numalign.extender.pending import PendingPods
from numalign.extender.server import VERB_CONNECTIONS, ExtenderServer, api_clients

BURST = VERB_CONNECTIONS  # bindings that must be in flight together


class FakeApi:
    """Empty lists; watches held open until ``stop``; each binding answered only once
    ``BURST`` of them arrived (or ``stop``)."""

    def __init__(self) -> None:
        self.watching: set[str] = set()
        self.bindings = 0
        self.burst = asyncio.Event()
        self.stop = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/{path:.*}", self.get)
        app.router.add_post("/{path:.*}", self.post)
        return app

    async def get(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") not in ("1", "true"):
            return web.json_response({"items": [], "metadata": {"resourceVersion": "1"}})
        key = f"{request.path}?{request.query.get('fieldSelector', '')}"
        self.watching.add(key)
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        await resp.prepare(request)
        await self.stop.wait()
        return resp

    async def post(self, request: web.Request) -> web.Response:
        await request.read()
        self.bindings += 1
        if self.bindings >= BURST:
            self.burst.set()
        await asyncio.wait([asyncio.ensure_future(self.burst.wait()),
                            asyncio.ensure_future(self.stop.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        return web.json_response({"kind": "Status", "status": "Success"}, status=201)


@pytest_asyncio.fixture(loop_scope="function")
async def api() -> AsyncIterator[tuple[FakeApi, KubeConfig]]:
    fake = FakeApi()
    server = TestServer(fake.app())
    await server.start_server()
    try:
        yield fake, KubeConfig(host=str(server.make_url("")).rstrip("/"))
    finally:
        fake.stop.set()
        await server.close()


async def test_a_burst_of_bindings_is_in_flight_while_every_watch_is_open(
        api: tuple[FakeApi, KubeConfig]) -> None:
    fake, config = api
    kube, verbs = api_clients(config)
    server = ExtenderServer(Fleet(Decider(dra=DraCatalog())), kube=verbs,
                            pending=PendingPods(kube=verbs))
    async with kube:
        watches = asyncio.create_task(server.watch(kube))
        try:
            async def all_watching() -> None:
                while len(fake.watching) < 7:  # NodeTopologies, 2 of pods, 4 DRA kinds
                    await asyncio.sleep(0.01)
            await asyncio.wait_for(all_watching(), 20)
            binds = [verbs.request("POST", f"/api/v1/namespaces/default/pods/p{i}/binding",
                                   body={"target": {"kind": "Node", "name": "n"}},
                                   timeout=20, decode=False) for i in range(BURST)]
            await asyncio.wait_for(asyncio.gather(*binds), 20)
            assert fake.bindings == BURST
            assert fake.burst.is_set()  # all of them at once, beside the open watches
            assert len(fake.watching) == 7  # the watches kept theirs
        finally:
            fake.stop.set()
            watches.cancel()
            await asyncio.gather(watches, return_exceptions=True)
