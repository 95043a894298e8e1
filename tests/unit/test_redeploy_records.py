"""The redeploy records of a namespace stay below the ConfigMap limit: records of quiet
(gone) workloads are pruned, those that still protect a Failed pod or hold new pods are
kept."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from numalign.api.topologypolicy import RedeployPolicy
from numalign.controller import cache, kube
from numalign.controller.redeploy import decide, store
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


class FakeCore:
    """ConfigMaps as the API server keeps them (resourceVersion, 1 MiB limit), pods
    deleted on request."""

    def __init__(self) -> None:
        self.maps: dict[str, dict[str, Any]] = {}
        self.rv = 1
        self.largest = 0

    def _store(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        size = sum(len(k) + len(v) for k, v in (body.get("data") or {}).items())
        self.largest = max(self.largest, size)
        if size > LIMIT:
            raise ApiException(status=422, reason="ConfigMap too long")
        self.rv += 1
        body = {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.rv)},
                "data": dict(body.get("data") or {})}
        self.maps[ns] = body
        return body

    def create_namespaced_config_map(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        if ns in self.maps:
            raise ApiException(status=409, reason="AlreadyExists")
        return self._store(ns, body)

    def replace_namespaced_config_map(self, name: str, ns: str,
                                      body: dict[str, Any]) -> dict[str, Any]:
        if self.maps[ns]["metadata"]["resourceVersion"] != body["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        return self._store(ns, body)

    def read_namespaced_config_map(self, name: str, ns: str) -> dict[str, Any]:
        if ns not in self.maps:
            raise ApiException(status=404, reason="NotFound")
        return self.maps[ns]

    def delete_namespaced_pod(self, name: str, ns: str, body: Any = None) -> None:
        pass


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
    core = FakeCore()
    monkeypatch.setattr(kube, "core", lambda: core)
    monkeypatch.setattr(kube, "to_dict", lambda obj: obj)
    monkeypatch.setattr(kube, "event", lambda *a, **k: None)
    monkeypatch.setattr(cache, "STATES", cache.Store("s", lambda: ([], 0), cache._ns_name))
    monkeypatch.setattr(cache, "FAILED", cache.Store("f", lambda: ([], 0), cache._uid))
    settings = RedeployPolicy.model_construct(max_attempts=100, backoff_seconds=0)
    monkeypatch.setattr(decide, "governing_settings", lambda pod: ("p", settings))
    monkeypatch.setattr(decide, "owner_replicas", lambda pod: (1, None))
    monkeypatch.setattr(decide, "with_unfit", lambda pod, avoid: avoid)
    start = time.time() - 500 * 60
    for w in range(500):
        for n in range(16):
            at = start + w * 60 + n
            assert decide.step(_owned_pod(w, n), first_seen=at, now=at) is None
    assert core.largest <= LIMIT
    data = core.maps["busy"]["data"]
    assert sum(len(k) + len(v) for k, v in data.items()) <= MAX_DATA_BYTES
    # The newest workloads' records are all there.
    missing = [w for w in range(441, 500) if f"owner-rs-{w}" not in data]
    assert not missing, (missing, len(data))
    # The periodic pass drops the quiet ones (gone workloads) for good.
    store.prune_records(time.time())
    kept = core.maps["busy"]["data"]
    assert {f"owner-rs-{w}" for w in range(441, 500)} <= set(kept)
    assert len(kept) <= 61
