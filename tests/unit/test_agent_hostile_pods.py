"""A pod's content never ends the agent's pod watch: a 2 KB ``numalign.io/resolved`` of
nested brackets (RecursionError in json) and a handler that fails are skipped, the next
pod is still decided."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

import testdata
from numalign.agent.emulate import Emulator, NodeSpec
from numalign.api.allocation import parse_allocation
from numalign.api.errors import WireError
from numalign.api.kube.listwatch import list_watch
from numalign.api.resolved import parse_resolved, resolved_or_none
from numalign.topology.errors import TopologyError
from numalign.topology.gpu import parse_gpu_requests
from numalign.topology.machine import load_machine

NESTED = "[" * 1000 + "]" * 1000  # 2 KB


class FakeKube:
    """The agent's client: a pod watch that yields ``events`` then idles; every write
    succeeds."""

    def __init__(self, events: list[tuple[str, dict[str, Any]]]) -> None:
        self.events = events
        self.writes: list[str] = []

    def lane(self, _n: int) -> FakeKube:
        return self

    async def watch(self, path: str, params: dict[str, str], timeout_seconds: int = 300,
                    metadata_only: bool = False) -> AsyncIterator[dict[str, Any]]:
        for typ, obj in self.events:
            yield {"type": typ, "object": obj}
        await asyncio.Event().wait()

    def __getattr__(self, name: str) -> Any:
        async def write(path: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
            self.writes.append(f"{name} {path}")
            return {}
        return write


def _pod(name: str, node: str, resolved: str | None = None) -> dict[str, Any]:
    ann = {"numalign.io/resolved": resolved} if resolved is not None else {}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "resourceVersion": "5", "annotations": ann},
            "spec": {"nodeName": node, "containers": [
                {"name": "c", "resources": {"limits": {"cpu": "1", "memory": "100Mi"}}}]},
            "status": {"phase": "Pending"}}


def test_poisoned_pods_do_not_end_the_pod_watch() -> None:
    machine = load_machine(testdata.MACHINES / "seed-figure1.yaml")
    node = "seed-figure1-0"
    bad = _pod("bad", node, NESTED)
    good = _pod("good", node)
    # A handler failure for any other reason is skipped too.
    boom = _pod("boom", node)
    kube = FakeKube([("ADDED", bad), ("ADDED", boom), ("ADDED", good)])

    async def scenario() -> Emulator:
        em = Emulator(kube, [NodeSpec(node, machine)])  # type: ignore[arg-type]
        real = em.on_pod

        def on_pod(typ: str, pod: dict[str, Any]) -> None:
            if pod["metadata"]["name"] == "boom":
                raise RecursionError("maximum recursion depth exceeded")
            real(typ, pod)

        # the agent's pod watch (api/kube/listwatch.py) from a listing made at restore
        task = asyncio.create_task(list_watch(kube, "/api/v1/pods",  # type: ignore[arg-type]
                                              lambda items: None, on_pod, since="1"))
        for _ in range(100):
            await asyncio.sleep(0.02)
            if "uid-good" in em.states[node].decided:
                break
        assert not task.done(), task.exception() if task.done() else None
        task.cancel()
        await asyncio.gather(task, *em._tasks, return_exceptions=True)
        return em

    em = asyncio.run(scenario())
    st = em.states[node]
    assert st.decided.get("uid-good") is True
    # The poisoned pod is decided with the node default (its annotation is refused).
    assert "uid-bad" in st.decided


@pytest.mark.parametrize("parse", [parse_resolved, parse_allocation])
def test_annotation_parsers_refuse_deep_and_huge_values(parse: Any) -> None:
    for value, message in ((NESTED, "nested more than 32 levels"),
                           (json.dumps({"x": "a" * 100_000}), "bytes, more than")):
        with pytest.raises(WireError, match=message):
            parse(value)


def test_operator_parser_and_gpu_requests_refuse_deep_values() -> None:
    assert resolved_or_none(NESTED) is None
    assert resolved_or_none('{"policy": "none", "x": ' + NESTED + "}") is None
    with pytest.raises(TopologyError, match=r"^numalign\.io/gpus: is nested more than 32"):
        parse_gpu_requests(NESTED)
