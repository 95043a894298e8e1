"""The redeploy records of a namespace stay below the ConfigMap limit: records of quiet
(gone) workloads are pruned, those that still protect a Failed pod or hold new pods are
kept."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from fake_kube import FakeKube
from numalign.api.kube import ApiError
from numalign.api.topologypolicy import RedeployPolicy
from numalign.controller import cache, connection
from numalign.controller.redeploy import rejected, store
from numalign.controller.redeploy.record import (
    MAX_DATA_BYTES,
    RESET_AFTER_S,
    WorkloadState,
    iso,
    prune,
)

LIMIT = 1 << 20  # what the API server accepts in one ConfigMap


def _record(last: float, uids: list[str], exhausted: bool = False) -> str:
    st = WorkloadState(attempts=len(uids), last=iso(last),
                       handled={u: {"action": "delete", "at": iso(last), "node": "n",
                                    "avoid": [], "pod": u} for u in uids})
    if exhausted:
        st.exhausted = iso(last)
    return st.dump()


def test_prune_drops_quiet_records_and_keeps_what_protects_a_pod() -> None:
    now = time.time()
    old = now - RESET_AFTER_S - 60
    data = {"owner-gone": _record(old, ["a"]),
            "owner-young": _record(now - 60, ["b"]),
            "owner-live": _record(old, ["c"]),  # pod c is still Failed
            "owner-held": _record(old, ["d"], exhausted=True)}
    removed = prune(data, now, live={"c"})
    assert removed == ["owner-gone"]
    assert set(data) == {"owner-young", "owner-live", "owner-held"}


def test_prune_past_the_size_bound_drops_the_oldest_young_records() -> None:
    now = time.time()
    data = {f"owner-{i:03d}": _record(now - 600 + i, [f"u{i}-{j}" for j in range(40)])
            for i in range(100)}
    size = sum(len(k) + len(v) for k, v in data.items())
    bound = size // 2
    removed = prune(data, now, live={"u99-0"}, max_bytes=bound)
    assert sum(len(k) + len(v) for k, v in data.items()) <= bound
    assert removed == [f"owner-{i:03d}" for i in range(len(removed))]  # oldest first
    assert "owner-099" in data


class FakeApi(FakeKube):
    """ConfigMaps as the API server keeps them (resourceVersion, 1 MiB limit); pods are
    deleted on request (whether they exist here or not)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.refuse.append(self._limit)

    def _limit(self, method: str, path: str, body: dict[str, Any]) -> ApiError | None:
        size = sum(len(k) + len(v) for k, v in (body.get("data") or {}).items())
        self.largest = max(self.largest, size)
        if size > LIMIT:
            return ApiError(422, {"reason": "Invalid", "message": "ConfigMap too long"})
        return None

    def data(self, ns: str) -> dict[str, str]:
        return dict(self.at(f"/api/v1/namespaces/{ns}/configmaps/numalign-redeploy")["data"])

    async def delete(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        self.deleted.append(path.rsplit("/", 1)[-1])
        return {}


def fresh_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    async def nothing() -> tuple[list[dict[str, Any]], int | None]:
        return [], 0

    monkeypatch.setattr(cache, "STATES", cache.Store("s", nothing, cache._ns_name))
    monkeypatch.setattr(cache, "FAILED", cache.Store("f", nothing, cache._uid))


def owner_replicas(replicas: int, owner: dict[str, Any] | None) -> Any:
    async def read(pod: Any) -> tuple[int, dict[str, Any] | None]:
        return replicas, owner
    return read


def _owned_pod(workload: int, n: int) -> dict[str, Any]:
    return {"metadata": {"name": f"w{workload}-{n}", "namespace": "busy",
                         "uid": f"uid-{workload}-{n}", "ownerReferences": [
                             {"kind": "ReplicaSet", "name": f"w{workload}",
                              "uid": f"rs-{workload}", "controller": True}]},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c"}]},
            "status": {"phase": "Failed", "reason": "TopologyAffinityError"}}


def test_a_namespace_with_500_workloads_stays_under_the_configmap_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """500 Deployments come and go over eight hours, each with 16 rejected pods: without
    pruning their records pass 1 MiB and every later write is refused."""
    api = FakeApi()
    monkeypatch.setattr(connection, "client", lambda: api)
    fresh_stores(monkeypatch)
    settings = RedeployPolicy.model_construct(max_attempts=100, backoff_seconds=0)
    monkeypatch.setattr(rejected, "governing_settings", lambda pod: ("p", settings))
    monkeypatch.setattr(rejected, "owner_replicas", owner_replicas(1, None))
    monkeypatch.setattr(rejected, "with_unfit", lambda pod, avoid: avoid)
    start = time.time() - 500 * 60

    async def run() -> None:
        for w in range(500):
            for n in range(16):
                at = start + w * 60 + n
                assert await rejected.step(_owned_pod(w, n), first_seen=at, now=at) is None

    asyncio.run(run())
    assert api.largest <= LIMIT
    data = api.data("busy")
    assert sum(len(k) + len(v) for k, v in data.items()) <= MAX_DATA_BYTES
    # The newest workloads' records are all there.
    missing = [w for w in range(441, 500) if f"owner-rs-{w}" not in data]
    assert not missing, (missing, len(data))
    # The periodic pass drops the quiet ones (gone workloads) for good.
    asyncio.run(store.prune_records(time.time()))
    kept = api.data("busy")
    assert {f"owner-rs-{w}" for w in range(441, 500)} <= set(kept)
    assert len(kept) <= 61


def test_rejected_pods_of_a_namespace_at_once_write_their_record_without_conflicts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """50 workers deciding at once (one event loop): each decision is written once, none
    meets a stale resourceVersion, and every pod is acted on."""
    api = FakeApi()
    monkeypatch.setattr(connection, "client", lambda: api)
    fresh_stores(monkeypatch)
    settings = RedeployPolicy.model_construct(max_attempts=100, backoff_seconds=0)
    monkeypatch.setattr(rejected, "governing_settings", lambda pod: ("p", settings))
    monkeypatch.setattr(rejected, "owner_replicas", owner_replicas(1, None))
    monkeypatch.setattr(rejected, "with_unfit", lambda pod, avoid: avoid)
    puts: list[str] = []
    conflicts: list[str] = []
    real_put = api.put

    async def put(path: str, body: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)  # let the others run meanwhile
        puts.append(path)
        try:
            return await real_put(path, body)
        except ApiError as e:
            conflicts.append(e.reason)
            raise

    monkeypatch.setattr(api, "put", put)
    now = time.time()

    async def run() -> list[float | None]:
        return await asyncio.gather(*(rejected.step(_owned_pod(w, 0), first_seen=now, now=now)
                                      for w in range(50)))

    assert asyncio.run(run()) == [None] * 50
    assert conflicts == [] and len(puts) == 49  # the first one creates the ConfigMap
    assert len(api.data("busy")) == 50 and len(api.deleted) == 50
