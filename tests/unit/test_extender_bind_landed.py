"""The bind verb when the API server is slow: a binding that lands after the extender gave
up on it (or that the API server reports as done already, to that node) is answered as
bound. Answered "failed", kube-scheduler binds the pod itself, gets 409 (already assigned),
counts an error and retries a pod that is placed (the fleet bench saw 945 such errors for
2,000 pods)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from test_extender_decide import node, pod, published

from numalign.api.kube import ApiError
from numalign.extender.fleet import Fleet
from numalign.extender.pending import PendingPods
from numalign.extender.server import ExtenderServer

SIX = pod("six", {"cpu": "6", "memory": "1Gi"})
BIND = {"PodName": "six", "PodNamespace": "default", "PodUID": "uid-six", "Node": "big"}


class SlowApi:
    """The binding POST fails as given; a GET of the pod shows where it is."""

    def __init__(self, post_error: Exception, bound_to: str | None) -> None:
        self.post_error = post_error
        self.bound_to = bound_to
        self.calls: list[str] = []

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.calls.append(method)
        if method == "POST":
            raise self.post_error
        return {"metadata": {"name": "six", "uid": "uid-six"},
                "spec": {"nodeName": self.bound_to} if self.bound_to else {}}


Serve = tuple[TestClient[Any, Any], ExtenderServer, SlowApi]


@pytest_asyncio.fixture(loop_scope="function")
async def serve(request: pytest.FixtureRequest) -> AsyncIterator[Serve]:
    fleet = Fleet()
    fleet.load_nodetopologies([published(node("dual-16core", "big"), 1)])
    fleet.load_pods([])
    pending = PendingPods()
    pending.load([SIX])
    api = SlowApi(*request.param)
    server = ExtenderServer(fleet, pending=pending, kube=api)  # type: ignore[arg-type]
    server.ready = True
    async with TestClient(TestServer(server.app())) as c:
        r = await c.post("/filter", json={"Pod": SIX, "Nodes": None, "NodeNames": ["big"]})
        assert (await r.json())["NodeNames"] == ["big"]
        yield c, server, api


LATE = (TimeoutError(), "big")
ASSIGNED = (ApiError(409, {"reason": "Conflict", "message": 'Operation cannot be fulfilled on '
                           'pods/binding "six": pod six is already assigned to node "big"'}),
            None)


@pytest.mark.parametrize("serve", [LATE, ASSIGNED], indirect=True, ids=["late", "assigned"])
async def test_a_binding_that_landed_is_answered_bound(serve: Serve) -> None:
    client, server, _api = serve
    r = await client.post("/bind", json=BIND)
    assert (await r.json())["Error"] == ""
    assert server.fleet.bound.get("uid-six") == "big"  # it holds its room there


ELSEWHERE = (ApiError(409, {"reason": "Conflict", "message": 'Operation cannot be fulfilled on '
                            'pods/binding "six": pod six is already assigned to node "other"'}),
             None)


@pytest.mark.parametrize("serve", [(TimeoutError(), None), ELSEWHERE], indirect=True,
                         ids=["not-bound", "bound-elsewhere"])
async def test_a_binding_that_did_not_land_is_left_to_the_scheduler(serve: Serve) -> None:
    client, server, _api = serve
    r = await client.post("/bind", json=BIND)
    assert "binding default/six to big" in (await r.json())["Error"]
    assert server.fleet.bound.get("uid-six") is None
