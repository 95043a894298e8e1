"""A node's bindings land in the order the extender counted them.

kube-scheduler binds pods at once; the bind verb makes each pod's hold on its node and
posts the Binding. Posted together, the second binding could be stored first: the node
then admits the second pod first and may give it what the first was counted on (the
CPUs next to the first pod's device), refusing the first. Here the API server is slow
to store the first binding and quick with the second."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from test_extender_dra import fleet, pod

from numalign.extender.bindorder import BindOrder
from numalign.extender.fleet import Fleet
from numalign.extender.pending import PendingPods
from numalign.extender.server import ExtenderServer

A = pod("a", "single-numa-node", claims=False)
B = pod("b", "single-numa-node", claims=False)


class Api:
    """Bindings land after ``slow[name]`` seconds (0 by default), in ``landed``."""

    def __init__(self, slow: dict[str, float]) -> None:
        self.slow = slow
        self.landed: list[str] = []

    async def request(self, method: str, path: str, **_: Any) -> Any:
        name = path.split("/")[-2]
        if method == "POST":
            await asyncio.sleep(self.slow.get(name, 0.0))
            self.landed.append(name)
        return {}


@asynccontextmanager
async def _filtered(slow: dict[str, float], turn_wait: float,
                    filtered: tuple[tuple[dict[str, Any], list[str]], ...] = (
                        (A, ["n0"]), (B, ["n0"]))
                    ) -> AsyncIterator[tuple[ExtenderServer, Api, Any]]:
    """The extender with the pods ``filtered`` for their nodes, in order (A then B for
    n0); a ``bind(pod, after, node="n0")`` to call."""
    pods = [p for p, _ in filtered]
    pending = PendingPods()
    pending.load(pods)
    api = Api(slow)
    nodes = sorted({n for _, names in filtered for n in names})
    server = ExtenderServer(Fleet(fleet({n: () for n in nodes}, *pods)), pending=pending,
                            kube=api)  # type: ignore[arg-type]
    server.bind_order = BindOrder(turn_wait)
    server.fleet.load_pods([])
    server.ready = True
    async with TestClient(TestServer(server.app())) as c:
        for p, names in filtered:
            r = await c.post("/filter", json={"Pod": p, "Nodes": None, "NodeNames": names})
            assert (await r.json())["NodeNames"] == names

        async def bind(p: dict[str, Any], after: float, node: str = "n0") -> str:
            await asyncio.sleep(after)
            name = p["metadata"]["name"]
            r = await c.post("/bind", json={"PodName": name, "PodNamespace": "ns",
                                            "PodUID": f"uid-{name}", "Node": node})
            return str((await r.json())["Error"])

        yield server, api, bind


async def _bind_both(slow: dict[str, float], turn_wait: float = 1.0
                     ) -> tuple[ExtenderServer, Api]:
    async with _filtered(slow, turn_wait) as (server, api, bind):
        assert list(await asyncio.gather(bind(A, 0.0), bind(B, 0.05))) == ["", ""]
    return server, api


async def test_a_second_binding_to_a_node_lands_after_the_first() -> None:
    server, api = await _bind_both({"a": 0.3})
    assert api.landed == ["a", "b"]  # b waited for a, though its own POST is quicker
    assert server.bind_order.nodes == 0  # nothing kept once the node's bindings are done
    counted = [r.uid for r in server.fleet.reservations.on_node("n0")]
    assert counted == ["uid-a", "uid-b"]  # as the node sees them bound


async def test_a_binding_stuck_holds_the_next_one_up_no_longer_than_the_turn_wait() -> None:
    server, api = await _bind_both({"a": 0.5}, turn_wait=0.1)
    assert api.landed == ["b", "a"]
    missed = server.metrics.bind_turns_missed._value.get()  # type: ignore[attr-defined]
    assert missed == 1
    assert server.bind_order.nodes == 0


async def _filter_both_bind_second_first(a_after: float | None, turn_wait: float = 1.0
                                         ) -> tuple[ExtenderServer, Api, list[str]]:
    """A then B filtered for n0; B's bind asked first, A's ``a_after`` seconds later
    (None: never: A was bound elsewhere by another scheduler's binder, unseen)."""
    async with _filtered({}, turn_wait) as (server, api, bind):
        calls = [bind(B, 0.0)] + ([bind(A, a_after)] if a_after is not None else [])
        errors = list(await asyncio.gather(*calls))
    return server, api, errors


async def test_a_pod_approved_later_binds_after_the_one_approved_before_it() -> None:
    # B was decided with A landing first; B's binding comes first (its claims' write
    # was quicker, say): it waits for A's, so the node admits them as they were decided
    server, api, errors = await _filter_both_bind_second_first(0.2)
    assert errors == ["", ""]
    assert api.landed == ["a", "b"]
    counted = [r.uid for r in server.fleet.reservations.on_node("n0")]
    assert counted == ["uid-a", "uid-b"]


async def test_an_earlier_pod_that_never_binds_holds_the_next_up_no_longer_than_the_turn_wait(
        ) -> None:
    server, api, errors = await _filter_both_bind_second_first(None, turn_wait=0.1)
    assert errors == [""] and api.landed == ["b"]
    missed = server.metrics.bind_turns_missed._value.get()  # type: ignore[attr-defined]
    assert missed == 1


async def test_a_pod_binding_elsewhere_holds_up_no_binding_to_another_node() -> None:
    # C approved for n1 only, never bound; A then B approved for both nodes. A's bind
    # names n1 and waits there for C; B's names n0: A will not land on n0, so B posts
    # at once instead of waiting behind A (and, through it, behind C)
    c = pod("c", "single-numa-node", claims=False)
    both = ["n0", "n1"]
    async with _filtered({}, 0.3, ((c, ["n1"]), (A, both), (B, both))) as (server, api, bind):
        errors = await asyncio.gather(bind(A, 0.0, "n1"), bind(B, 0.05, "n0"))
    assert list(errors) == ["", ""]
    assert api.landed == ["b", "a"]
    missed = server.metrics.bind_turns_missed._value.get()  # type: ignore[attr-defined]
    assert missed == 1  # A's, behind C; none of B's
