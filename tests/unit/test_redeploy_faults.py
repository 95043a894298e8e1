"""Redeploy under faults, with the API faked at the client: a bare pod is never lost to
a name clash, and without --recreate-bare-pods it is never deleted."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fake_kube import FakeKube
from numalign.api.kube import ApiError
from numalign.api.names import EVENT_REDEPLOY, EVENT_REDEPLOY_GAVE_UP
from numalign.api.topologypolicy import RedeployPolicy
from numalign.controller import cache, connection
from numalign.controller.redeploy import (
    WorkloadState,
    build_replacement,
    handlers,
    step,
    workload_key,
)
from numalign.controller.redeploy import rejected as redeploy

PODS = "/api/v1/namespaces/ns/pods"


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    """The operator's stores as a fresh start has them, before and after each test."""
    cache.clear()
    yield
    cache.clear()


def _fake(monkeypatch: pytest.MonkeyPatch, *pods: dict[str, Any]) -> FakeKube:
    """The API with these pods in namespace ns, as the operator's client."""
    fake = FakeKube()
    for pod in pods:
        fake.add(PODS, pod)
    monkeypatch.setattr(connection, "client", lambda: fake)
    return fake


def _bare(name: str = "web", uid: str = "uid-web") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": {}},
            "spec": {"nodeName": "node-a", "containers": [{"name": "c"}]},
            "status": {"phase": "Failed", "reason": "TopologyAffinityError"}}


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    state: dict[str, Any] = {"data": {}}

    async def save_state(ns: str, data: dict[str, str], rv: str | None) -> None:
        state["data"] = dict(data)

    monkeypatch.setattr(redeploy, "load_state", lambda ns: (dict(state["data"]), "1"))
    monkeypatch.setattr(redeploy, "save_state", save_state)
    monkeypatch.setattr(redeploy, "governing_settings", lambda pod: ("p", RedeployPolicy()))
    monkeypatch.setattr(redeploy, "with_unfit", lambda pod, avoid: avoid)
    yield state


def run_step(pod: dict[str, Any], now: float) -> float | None:
    return asyncio.run(step(pod, first_seen=0.0, now=now))


def test_a_foreign_pod_under_the_replacement_name_keeps_the_original(
        api: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redeploy, "RECREATE_BARE_PODS", True)
    pod = _bare()
    foreign = {"metadata": {"name": "web-r1", "namespace": "ns", "uid": "other",
                            "annotations": {"numalign.io/redeploy-of": "web"}}}
    fake = _fake(monkeypatch, pod, foreign)
    assert run_step(pod, 1000.0) is None
    assert fake.deleted == [] and f"{PODS}/web" in fake.objects, "the original must be kept"
    assert fake.at(f"{PODS}/web-r1") is foreign
    st = WorkloadState.parse(api["data"][workload_key(pod)])
    assert "uid-web" in (st.gave_up or {}) and "uid-web" not in (st.handled or {})
    [(reason, message)] = fake.events
    assert reason == EVENT_REDEPLOY_GAVE_UP
    assert "web-r1 is taken by a pod that is not its" in message
    # A later pass (a replay) does nothing more.
    assert run_step(pod, 1001.0) is None
    assert fake.deleted == [] and len(fake.events) == 1


def test_our_own_replacement_found_after_a_crash_completes_the_redeploy(
        api: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redeploy, "RECREATE_BARE_PODS", True)
    pod = _bare()
    ours = build_replacement(pod, "web-r1", [])
    fake = _fake(monkeypatch, pod, ours)
    assert run_step(pod, 1000.0) is None
    assert fake.deleted == ["web"] and fake.at(f"{PODS}/web-r1") is ours
    assert fake.events[0][0] == EVENT_REDEPLOY


def test_without_the_switch_a_bare_pod_is_kept_with_an_event(
        api: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redeploy, "RECREATE_BARE_PODS", False)
    pod = _bare()
    fake = _fake(monkeypatch, pod)
    assert run_step(pod, 1000.0) is None
    assert fake.created == [] and fake.deleted == []
    [(reason, message)] = fake.events
    assert reason == EVENT_REDEPLOY_GAVE_UP and "--recreate-bare-pods" in message


def test_replacement_create_errors_back_off_then_give_up_with_an_event(
        api: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redeploy, "RECREATE_BARE_PODS", True)
    monkeypatch.setattr(handlers, "API_RETRY_FIRST", 0.01)
    monkeypatch.setattr(handlers, "API_RETRY_MAX", 0.04)
    monkeypatch.setattr(redeploy, "governing_settings",
                        lambda pod: ("p", RedeployPolicy.model_construct(backoff_seconds=0)))
    pod = _bare()
    fake = _fake(monkeypatch, pod)
    attempts: list[str] = []

    def quota(method: str, path: str, body: dict[str, Any]) -> ApiError | None:
        """Every replacement is refused (an exhausted quota)."""
        if method == "POST" and path.startswith(PODS):
            attempts.append(path)
            return ApiError(403, {"reason": "Forbidden", "message": "exceeded quota"})
        return None

    fake.refuse.append(quota)

    async def no_release(ns: str) -> None:
        pass

    monkeypatch.setattr(handlers, "release_held", no_release)
    monkeypatch.setattr(handlers.cache, "ready", no_release_all)
    monkeypatch.setattr(handlers.cache, "know_namespace", no_release)
    sleeps: list[float] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float) -> None:
        sleeps.append(delay)
        await real_sleep(0)

    monkeypatch.setattr(handlers.asyncio, "sleep", sleep)

    async def run() -> None:
        await asyncio.wait_for(handlers._worker(pod, "uid-web", logging.getLogger("t")), 30)

    asyncio.run(run())
    assert len(attempts) == handlers.API_GIVE_UP_AFTER
    assert sleeps == [0.01, 0.02, 0.04, 0.04, 0.04, 0.04, 0.04]
    assert f"{PODS}/web" in fake.objects and fake.deleted == []  # the original is kept
    st = WorkloadState.parse(api["data"][workload_key(pod)])
    assert "uid-web" in (st.gave_up or {}) and "uid-web" not in (st.handled or {})
    reason, message = fake.events[-1]
    assert reason == EVENT_REDEPLOY_GAVE_UP and "403" in message and "exceeded quota" in message


async def no_release_all() -> None:
    pass


def test_pods_waiting_out_a_backoff_hold_no_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """More rejected pods in backoff than the default executor has threads: a blocking
    call (certificates, say) still runs at once."""
    pods = {f"p{i}": _bare(f"p{i}", f"uid-{i}") for i in range(100)}
    _fake(monkeypatch, *pods.values())

    async def backoff(pod: dict[str, Any], first_seen: float) -> float:
        return 3600.0

    monkeypatch.setattr(handlers, "step", backoff)
    monkeypatch.setattr(handlers.cache, "ready", no_release_all)

    async def known(ns: str) -> None:
        pass

    monkeypatch.setattr(handlers.cache, "know_namespace", known)

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
