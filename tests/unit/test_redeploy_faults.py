"""Redeploy under faults, with the API faked at the client: a bare pod is never lost to
a name clash, and without --recreate-bare-pods it is never deleted."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from numalign.api.topologypolicy import RedeployPolicy
from numalign.controller import kube
from numalign.controller.redeploy import (
    WorkloadState,
    build_replacement,
    handlers,
    step,
    workload_key,
)
from numalign.controller.redeploy import decide as redeploy


class FakeCore:
    """Pods by name in one namespace; create/read/delete as the API server answers."""

    def __init__(self, pods: dict[str, dict[str, Any]]) -> None:
        self.pods = pods
        self.created: list[str] = []
        self.deleted: list[str] = []

    def create_namespaced_pod(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        name = body["metadata"]["name"]
        if name in self.pods:
            raise ApiException(status=409, reason="AlreadyExists")
        self.pods[name] = body
        self.created.append(name)
        return body

    def read_namespaced_pod(self, name: str, ns: str) -> dict[str, Any]:
        if name not in self.pods:
            raise ApiException(status=404, reason="NotFound")
        return self.pods[name]

    def delete_namespaced_pod(self, name: str, ns: str, body: Any = None) -> None:
        if name not in self.pods:
            raise ApiException(status=404, reason="NotFound")
        del self.pods[name]
        self.deleted.append(name)


def _bare(name: str = "web", uid: str = "uid-web") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": {}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c"}]},
            "status": {"phase": "Failed", "reason": "TopologyAffinityError"}}


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"data": {}, "events": []}
    monkeypatch.setattr(redeploy, "load_state", lambda ns: (dict(state["data"]), "1"))
    monkeypatch.setattr(redeploy, "save_state",
                        lambda ns, data, rv: state.__setitem__("data", dict(data)))
    monkeypatch.setattr(redeploy, "governing_settings", lambda pod: ("p", RedeployPolicy()))
    monkeypatch.setattr(redeploy, "with_unfit", lambda pod, avoid: avoid)
    monkeypatch.setattr(kube, "to_dict", lambda obj: obj)
    monkeypatch.setattr(kube, "event", lambda obj, type_, reason, message:
                        state["events"].append((reason, message)))
    yield state


def test_a_foreign_pod_under_the_replacement_name_keeps_the_original(
        api: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redeploy, "RECREATE_BARE_PODS", True)
    pod = _bare()
    foreign = {"metadata": {"name": "web-r1", "namespace": "ns", "uid": "other",
                            "annotations": {"numalign.io/redeploy-of": "web"}}}
    core = FakeCore({"web": pod, "web-r1": foreign})
    monkeypatch.setattr(kube, "core", lambda: core)
    assert step(pod, first_seen=0.0, now=1000.0) is None
    assert core.deleted == [] and "web" in core.pods, "the original must be kept"
    assert core.pods["web-r1"] is foreign
    st = WorkloadState.parse(api["data"][workload_key(pod)])
    assert "uid-web" in (st.gave_up or {}) and "uid-web" not in (st.handled or {})
    [(reason, message)] = api["events"]
    assert reason == "RedeployGaveUp" and "web-r1 is taken by a pod that is not its" in message
    # A later pass (a replay) does nothing more.
    assert step(pod, first_seen=0.0, now=1001.0) is None
    assert core.deleted == [] and len(api["events"]) == 1


def test_our_own_replacement_found_after_a_crash_completes_the_redeploy(
        api: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redeploy, "RECREATE_BARE_PODS", True)
    pod = _bare()
    ours = build_replacement(pod, "web-r1", [])
    core = FakeCore({"web": pod, "web-r1": ours})
    monkeypatch.setattr(kube, "core", lambda: core)
    assert step(pod, first_seen=0.0, now=1000.0) is None
    assert core.deleted == ["web"] and core.pods["web-r1"] is ours
    assert api["events"][0][0] == "Redeploy"


def test_without_the_switch_a_bare_pod_is_kept_with_an_event(
        api: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redeploy, "RECREATE_BARE_PODS", False)
    pod = _bare()
    core = FakeCore({"web": pod})
    monkeypatch.setattr(kube, "core", lambda: core)
    assert step(pod, first_seen=0.0, now=1000.0) is None
    assert core.created == [] and core.deleted == []
    [(reason, message)] = api["events"]
    assert reason == "RedeployGaveUp" and "--recreate-bare-pods" in message


class QuotaCore(FakeCore):
    """Every replacement is refused (an exhausted quota)."""

    def __init__(self, pods: dict[str, dict[str, Any]]) -> None:
        super().__init__(pods)
        self.attempts = 0

    def create_namespaced_pod(self, ns: str, body: dict[str, Any]) -> dict[str, Any]:
        self.attempts += 1
        raise ApiException(status=403, reason="Forbidden: exceeded quota")


def test_replacement_create_errors_back_off_then_give_up_with_an_event(
        api: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redeploy, "RECREATE_BARE_PODS", True)
    monkeypatch.setattr(handlers, "API_RETRY_FIRST", 0.01)
    monkeypatch.setattr(handlers, "API_RETRY_MAX", 0.04)
    monkeypatch.setattr(redeploy, "governing_settings",
                        lambda pod: ("p", RedeployPolicy.model_construct(backoff_seconds=0)))
    pod = _bare()
    core = QuotaCore({"web": pod})
    monkeypatch.setattr(kube, "core", lambda: core)
    monkeypatch.setattr(handlers, "release_held", lambda ns: None)
    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        sleeps.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(handlers.asyncio, "sleep", sleep)

    async def run() -> None:
        await asyncio.wait_for(handlers._worker(pod, "uid-web", logging.getLogger("t")), 30)

    asyncio.run(run())
    assert core.attempts == handlers.API_GIVE_UP_AFTER
    assert sleeps == [0.01, 0.02, 0.04, 0.04, 0.04, 0.04, 0.04]
    assert "web" in core.pods and core.deleted == []  # the original is kept
    st = WorkloadState.parse(api["data"][workload_key(pod)])
    assert "uid-web" in (st.gave_up or {}) and "uid-web" not in (st.handled or {})
    reason, message = api["events"][-1]
    assert reason == "RedeployGaveUp" and "403" in message and "exceeded quota" in message


def test_pods_waiting_out_a_backoff_hold_no_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """More rejected pods in backoff than the default executor has threads: a blocking
    call of the periodic pass still runs at once."""
    pods = {f"p{i}": _bare(f"p{i}", f"uid-{i}") for i in range(100)}
    core = FakeCore(pods)
    monkeypatch.setattr(kube, "core", lambda: core)
    monkeypatch.setattr(kube, "to_dict", lambda obj: obj)
    monkeypatch.setattr(handlers, "step", lambda pod, first_seen: 3600.0)

    async def run() -> float:
        log = logging.getLogger("t")
        tasks = [asyncio.create_task(handlers._worker(p, p["metadata"]["uid"], log))
                 for p in pods.values()]
        await asyncio.sleep(0.5)  # every worker has taken its first step
        start = time.monotonic()
        await asyncio.wait_for(asyncio.to_thread(lambda: None), 30)
        took = time.monotonic() - start
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return took

    assert asyncio.run(run()) < 1.0
