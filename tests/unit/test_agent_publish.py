"""The NodeTopology publisher: merge patches of what changed, load-aware spacing."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any

import pytest

import testdata
from agent_helpers import given
from numalign.agent.publish import Publisher, build_status, merge_diff
from numalign.agent.state import NodeState
from numalign.api.kube import JSON_PATCH, MERGE_PATCH, ApiError
from numalign.topology.machine import load_machine

MACHINES = testdata.MACHINES


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies it."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = apply_merge_patch(out.get(k), v)
    return out


class FakeKube:
    """Stores NodeTopology status as the API server would (JSON patch add /status, merge
    patch); fails the next ``fail`` writes."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {}
        self.calls: list[tuple[str, Any]] = []
        self.fail = 0

    async def patch(self, path: str, body: Any, kind: str = MERGE_PATCH, *,
                    decode: bool = True) -> dict[str, Any]:
        self.calls.append((kind, copy.deepcopy(body)))
        if self.fail:
            self.fail -= 1
            raise ApiError(500, {"message": "boom"}, "PATCH", path)
        if kind == JSON_PATCH:
            assert body[0]["op"] == "add" and body[0]["path"] == "/status"
            self.status = copy.deepcopy(body[0]["value"])
        else:
            self.status = apply_merge_patch(self.status, copy.deepcopy(body["status"]))
        return {"status": self.status}

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return body


def test_merge_diff() -> None:
    old = {"a": 1, "b": {"x": 1, "y": [1, 2]}, "gone": "z", "same": {"k": "v"}}
    new = {"a": 2, "b": {"x": 1, "y": [1, 2, 3]}, "same": {"k": "v"}, "added": {"n": 1}}
    diff = merge_diff(old, new)
    assert diff == {"a": 2, "b": {"y": [1, 2, 3]}, "gone": None, "added": {"n": 1}}
    assert apply_merge_patch(old, diff) == new
    assert merge_diff(new, copy.deepcopy(new)) is None
    assert merge_diff({"a": {"b": 1}}, {"a": {}}) == {"a": {"b": None}}


def _pod(name: str, cpu: str) -> dict[str, Any]:
    res = {"cpu": cpu, "memory": "64Mi"}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": res,
                                                               "limits": res}}]}}


async def test_writes_what_changed_and_nothing_when_nothing_did() -> None:
    st = NodeState("n1", load_machine(MACHINES / "seed-figure1.yaml"))
    kube = FakeKube()
    pub = Publisher(kube, {"n1": st})  # type: ignore[arg-type]
    await pub.write("n1")
    assert kube.calls[-1][0] == JSON_PATCH  # the first write: the whole status
    pod = _pod("a", "1")
    st.decide(pod, given(st.default))
    await pub.write("n1")
    kind, body = kube.calls[-1]
    assert kind == MERGE_PATCH
    assert "admitted" in body["status"] and "cpuTopology" not in body["status"]
    assert kube.status == build_status(st, kube.status)  # the same as writing it all
    n = len(kube.calls)
    await pub.write("n1")  # nothing changed: no request
    assert len(kube.calls) == n and pub.skipped == 1
    # A failed write leaves the stored status unknown: the next one sends it all.
    st.release("uid-a")
    kube.fail = 1
    with pytest.raises(ApiError):
        await pub.write("n1")
    await pub.write("n1")
    assert kube.calls[-1][0] == JSON_PATCH
    assert kube.status == build_status(st, kube.status)
    assert kube.status["admitted"] == []


async def test_spaces_writes_out_while_busy_and_flushes_after() -> None:
    states = {f"n{i}": NodeState(f"n{i}", load_machine(MACHINES / "seed-figure1.yaml"))
              for i in range(4)}
    kube = FakeKube()
    busy = True
    pub = Publisher(kube, states, delay=0.01, min_interval=0.05,  # type: ignore[arg-type]
                    busy=lambda: busy, busy_interval=30, busy_concurrency=1)
    for n in states:
        pub._last_write[n] = time.monotonic()  # written just now
    task = asyncio.create_task(pub.run())
    try:
        pub.mark_all()
        await asyncio.sleep(0.3)
        assert pub.writes == 0  # busy: each node waits busy_interval
        busy = False
        for _ in range(100):
            await asyncio.sleep(0.02)
            if pub.writes == len(states):
                break
        assert pub.writes == len(states) and not pub.pending()
    finally:
        task.cancel()


class VersionedKube:
    """A NodeTopology as the API server keeps it: every write bumps its resourceVersion,
    and a merge patch naming another resourceVersion is refused with 409."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] = {"metadata": {"name": "n1", "resourceVersion": "1"},
                                    "status": {}}
        self.conflicts = 0

    def _bump(self) -> None:
        meta = self.obj["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    async def get(self, path: str) -> dict[str, Any]:
        return copy.deepcopy(self.obj)

    async def patch(self, path: str, body: Any, kind: str = MERGE_PATCH, *,
                    decode: bool = True) -> dict[str, Any]:
        assert kind == MERGE_PATCH
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != self.obj["metadata"]["resourceVersion"]:
            self.conflicts += 1
            raise ApiError(409, {"message": "the object has been modified"}, "PATCH", path)
        self.obj["status"] = apply_merge_patch(self.obj["status"], copy.deepcopy(body["status"]))
        self._bump()
        return copy.deepcopy(self.obj)

    def foreign_write(self, status: dict[str, Any]) -> None:
        """Another writer (a second agent for the node) replaces the status."""
        self.obj["status"] = copy.deepcopy(status)
        self._bump()


async def test_status_writes_carry_the_resource_version_they_were_computed_against() -> None:
    st = NodeState("n1", load_machine(MACHINES / "seed-figure1.yaml"))
    kube = VersionedKube()
    pub = Publisher(kube, {"n1": st}, preconditions=True)  # type: ignore[arg-type]
    await pub.write("n1")
    assert kube.obj["status"] == build_status(st, kube.obj["status"])
    # Someone else writes the status meanwhile (admitted pods of its own, a stale zone).
    foreign = copy.deepcopy(kube.obj["status"])
    foreign["admitted"] = [{"pod": "ghost", "namespace": "ns", "uid": "uid-ghost"}]
    foreign["rejected"] = 99
    kube.foreign_write(foreign)
    pod = _pod("a", "1")
    st.decide(pod, given(st.default))
    await pub.write("n1")
    # Our diff was stale: refused, the object read again, and the status is exactly ours.
    assert kube.conflicts == 1
    assert kube.obj["status"] == build_status(st, kube.obj["status"])
    assert [a["pod"] for a in kube.obj["status"]["admitted"]] == ["a"]


class NrtKube(FakeKube):
    """FakeKube that also stores NodeResourceTopologies (create, get, put)."""

    def __init__(self) -> None:
        super().__init__()
        self.nrts: dict[str, dict[str, Any]] = {}
        self.nrt_puts: list[tuple[float, dict[str, Any]]] = []

    async def get(self, path: str) -> dict[str, Any]:
        name = path.rsplit("/", 1)[-1]
        if name not in self.nrts:
            raise ApiError(404, {"reason": "NotFound"}, "GET", path)
        return self.nrts[name]

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if "noderesourcetopologies" not in path:
            return body
        return await self.put(f"{path}/{body['metadata']['name']}", body)

    async def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(body)
        stored["metadata"]["resourceVersion"] = str(len(self.nrt_puts) + 1)
        self.nrts[path.rsplit("/", 1)[-1]] = stored
        self.nrt_puts.append((time.monotonic(), stored))
        return stored


async def test_nrt_stays_fresh_while_status_writes_wait() -> None:
    from numalign.agent import podfingerprint as pfp
    st = NodeState("n1", load_machine(MACHINES / "seed-figure1.yaml"))
    kube = NrtKube()
    pub = Publisher(kube, {"n1": st}, delay=0.01, min_interval=0.05,  # type: ignore[arg-type]
                    busy=lambda: True, busy_interval=30, nrt=True, nrt_delay=0.01,
                    nrt_interval=0.05)
    pub._last_write["n1"] = time.monotonic()  # NodeTopology written just now: busy, waits
    task = asyncio.create_task(pub.run())
    try:
        for i in range(3):
            pod = _pod(f"p{i}", "1")
            st.decide(pod, given(st.default))
            pub.mark("n1")
            marked = time.monotonic()

            def has(n: int = i) -> bool:
                attrs = {a["name"]: a["value"] for a in
                         (kube.nrts.get("n1") or {}).get("attributes", [])}
                return attrs.get(pfp.ATTRIBUTE) == pfp.sign(
                    [("ns", f"p{k}") for k in range(n + 1)])

            for _ in range(100):
                if has():
                    break
                await asyncio.sleep(0.01)
            assert has(), f"p{i} not in the NodeResourceTopology"
            assert kube.nrt_puts[-1][0] - marked < 0.5
        assert pub.writes == 0  # the status writes still wait for the burst to end
        n = len(kube.nrt_puts)
        pub.mark("n1")  # nothing changed: no write
        await asyncio.sleep(0.2)
        assert len(kube.nrt_puts) == n
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
