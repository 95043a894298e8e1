"""What the mutating webhook's redeploy gating costs the API server: the pods Failed with
TopologyAffinityError are read with one LIST per burst of pods created in a namespace,
never one per pod, and never from a LIST older than the pod's creation (a controller's
replacement made right after a rejection still sees the rejected pod)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fake_kube import FakeKube
from numalign.api.topologypolicy import RedeployPolicy
from numalign.controller import cache, connection
from numalign.controller.redeploy import gating

NS = "busy"
PODS = f"/api/v1/namespaces/{NS}/pods"


class SlowLists(FakeKube):
    """Pod LISTs take a while (as under load) and are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.pod_lists = 0

    async def get(self, path: str, params: Any = None) -> dict[str, Any]:
        answer = await super().get(path, params)  # what was there when it started
        if path == PODS:
            self.pod_lists += 1
            await asyncio.sleep(0.02)
        return answer


def _pod(name: str, owner: str, *, failed_on: str | None = None) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "ownerReferences": [
            {"kind": "ReplicaSet", "name": owner, "uid": f"rs-{owner}", "controller": True}]},
        "spec": {"containers": [{"name": "c"}]}}
    if failed_on:
        pod["spec"]["nodeName"] = failed_on
        pod["status"] = {"phase": "Failed", "reason": "TopologyAffinityError"}
    return pod


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> SlowLists:
    async def nothing() -> tuple[list[dict[str, Any]], int | None]:
        return [], 0

    stores = {name: cache.Store(name, nothing, key) for name, key in (
        ("TOPOLOGY_POLICIES", cache._name), ("NODE_TOPOLOGIES", cache._name),
        ("NODES", cache._name), ("NAMESPACES", cache._name), ("STATES", cache._ns_name),
        ("FAILED", cache._uid))}
    for name, store in stores.items():
        monkeypatch.setattr(cache, name, store)
    monkeypatch.setattr(cache, "ALL", tuple(stores.values()))
    cache.NAMESPACES.put({"metadata": {"name": NS, "labels": {}, "resourceVersion": "1"}})
    fake = SlowLists()
    monkeypatch.setattr(connection, "client", lambda: fake)
    monkeypatch.setattr(gating, "REJECTED", gating.FreshLists())
    return fake


def test_a_burst_of_creations_shares_lists_and_each_sees_the_rejection(api: SlowLists) -> None:
    api.add(PODS, _pod("web-old", "web", failed_on="node-a"))

    async def burst() -> list[gating.Workload | None]:
        return await asyncio.gather(*(gating.workload_of(_pod(f"web-{i}", "web"), NS)
                                      for i in range(200)))

    answers = asyncio.run(burst())
    assert all(wl is not None and wl.failed == {"uid-web-old": "node-a"} for wl in answers)
    assert all(wl is not None and wl.hold(0.0) == "backoff" for wl in answers)
    assert api.pod_lists <= 2, f"{api.pod_lists} LISTs of Failed pods for 200 pods created"


def test_a_pod_created_after_a_rejection_never_gets_an_older_list(api: SlowLists) -> None:
    async def run() -> tuple[gating.Workload | None, gating.Workload | None]:
        early = asyncio.ensure_future(gating.workload_of(_pod("web-1", "web"), NS))
        await asyncio.sleep(0.005)  # its LIST is in flight; now the node rejects a pod
        api.add(PODS, _pod("web-0", "web", failed_on="node-b"))
        late = await gating.workload_of(_pod("web-2", "web"), NS)
        return await early, late

    early, late = asyncio.run(run())
    assert early is not None and early.failed == {}
    assert late is not None and late.failed == {"uid-web-0": "node-b"}
    assert late.hold(0.0) == "backoff"
    assert api.pod_lists == 2


def test_no_list_where_the_governing_policy_does_not_redeploy(
        api: SlowLists, monkeypatch: pytest.MonkeyPatch) -> None:
    api.add(PODS, _pod("web-old", "web", failed_on="node-a"))
    off = RedeployPolicy.model_construct(enabled=False)
    monkeypatch.setattr(gating, "governing_settings", lambda pod: ("p", off))

    async def burst() -> list[gating.Workload | None]:
        return await asyncio.gather(*(gating.workload_of(_pod(f"web-{i}", "web"), NS)
                                      for i in range(20)))

    answers = asyncio.run(burst())
    assert all(wl is not None and wl.hold(0.0) is None and wl.avoid(0.0) == []
               for wl in answers)
    assert api.pod_lists == 0


def test_a_failed_list_fails_its_callers_and_the_next_one_lists_again(
        api: SlowLists, monkeypatch: pytest.MonkeyPatch) -> None:
    from numalign.api.kube import ApiError

    calls = {"n": 0}
    real = gating._list_rejected

    async def flaky(namespace: str) -> gating.Rejected:
        calls["n"] += 1
        if calls["n"] == 1:
            raise ApiError(500, {"reason": "InternalError", "message": "boom"})
        return await real(namespace)

    monkeypatch.setattr(gating, "_list_rejected", flaky)
    api.add(PODS, _pod("web-old", "web", failed_on="node-a"))

    async def run() -> tuple[BaseException | gating.Workload | None, gating.Workload | None]:
        first = await asyncio.gather(gating.workload_of(_pod("a", "web"), NS),
                                     return_exceptions=True)
        return first[0], await gating.workload_of(_pod("b", "web"), NS)

    first, second = asyncio.run(run())
    assert isinstance(first, ApiError)
    assert second is not None and second.failed == {"uid-web-old": "node-a"}
