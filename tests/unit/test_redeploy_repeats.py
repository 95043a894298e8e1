"""A pile of Failed pods that a ReplicaSet made while nobody kept its replacements off the
rejecting node (the operator down, or started after the workload) spends one redeploy
attempt, not the whole budget: the operator clears the repeats and the workload gets a
replacement that avoids the node. Pods the operator's webhook admitted (marked
``numalign.io/workload``) still count, so the budget still bounds the redeploys."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_redeploy_records import FakeApi, fresh_stores, owner_replicas

from numalign.api.names import (
    ANN_WORKLOAD,
    EVENT_REDEPLOY,
    EVENT_REDEPLOY_GAVE_UP,
    EVENT_REDEPLOY_REPEAT,
)
from numalign.api.topologypolicy import RedeployPolicy
from numalign.controller import connection
from numalign.controller.redeploy import gating, rejected
from numalign.controller.redeploy.record import WorkloadState, iso, repeats_a_counted_rejection

RS = {"kind": "ReplicaSet", "name": "rr-5f8", "uid": "rs-1", "controller": True}
NOW = 1_800_000_000.0


def _failed(n: int, node: str = "localhost", seen: bool = False) -> dict[str, Any]:
    """A pod of the ReplicaSet that a kubelet rejected, as the kubelet leaves it (no
    numalign.io/allocation; ``seen``: admitted by the operator's webhook)."""
    ann = {ANN_WORKLOAD: "owner-rs-1"} if seen else {}
    return {"metadata": {"name": f"rr-5f8-{n}", "namespace": "ns", "uid": f"uid-{n}",
                         "ownerReferences": [RS], "annotations": ann},
            "spec": {"nodeName": node, "containers": [{"name": "work"}]},
            "status": {"phase": "Failed", "reason": "TopologyAffinityError",
                       "message": "Pod was rejected: Resources cannot be allocated with "
                                  "Topology locality"}}


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    api = FakeApi()
    monkeypatch.setattr(connection, "client", lambda: api)
    fresh_stores(monkeypatch)
    settings = RedeployPolicy.model_construct(enabled=True, max_attempts=2, backoff_seconds=1,
                                              avoid_rejecting_nodes=True)
    monkeypatch.setattr(rejected, "governing_settings", lambda pod: ("rr", settings))
    rs = {"metadata": {"name": "rr-5f8", "annotations": {}}, "spec": {"replicas": 1}}
    monkeypatch.setattr(rejected, "owner_replicas", owner_replicas(1, rs))
    monkeypatch.setattr(rejected, "with_unfit", lambda pod, avoid: avoid)
    monkeypatch.setattr(gating, "with_unfit", lambda pod, avoid: avoid)
    return {"api": api, "deleted": api.deleted, "events": api.events, "settings": settings}


def _record(api: FakeApi) -> WorkloadState:
    return WorkloadState.parse(api.data("ns")["owner-rs-1"])


def _step(pod: dict[str, Any], now: float) -> None:
    assert asyncio.run(rejected.step(pod, first_seen=now - 60, now=now)) is None


def test_a_pile_made_while_the_operator_was_away_spends_one_attempt(
        world: dict[str, Any]) -> None:
    """30 pods rejected by the same real node, none admitted by the operator: the first
    is redeployed (attempt 1 of 2), the other 29 are deleted as repeats. Before, each
    counted: the budget was spent on the second, the other 28 stayed Failed with
    RedeployGaveUp and new pods were gated -- the workload never got a replacement that
    avoids the node, though another node fits it."""
    pile = [_failed(n) for n in range(30)]
    for i, pod in enumerate(pile):
        _step(pod, NOW + i * 0.01)
    st = _record(world["api"])
    assert st.attempts == 1 and not st.exhausted and not st.gave_up, st
    assert world["deleted"] == [p["metadata"]["name"] for p in pile]
    reasons = [r for r, _ in world["events"]]
    assert reasons == [EVENT_REDEPLOY] + [EVENT_REDEPLOY_REPEAT] * 29, reasons
    assert "avoiding localhost" in world["events"][0][1]
    assert "without spending a redeploy attempt (1/2 spent)" in world["events"][1][1]
    # Nothing holds the replacement: every rejected pod was decided.
    wl = gating.Workload(st, {p["metadata"]["uid"]: "localhost" for p in pile}, pile[0],
                         world["settings"])
    assert wl.hold(NOW + 1) is None and wl.avoid(NOW + 1) == ["localhost"]


def test_pods_the_webhook_admitted_still_spend_the_budget(world: dict[str, Any]) -> None:
    """Pods the webhook admitted count, on the same node too (the first pods of a
    Deployment, or every candidate rejected it and keep_a_candidate let the node back in):
    the budget is spent and new pods are gated, as before."""
    _step(_failed(0), NOW)
    _step(_failed(1, seen=True), NOW + 10)
    st = _record(world["api"])
    assert st.attempts == 2 and not st.exhausted
    _step(_failed(2, seen=True), NOW + 20)
    st = _record(world["api"])
    assert st.exhausted and "uid-2" in (st.gave_up or {}), st
    assert [r for r, _ in world["events"]] == [EVENT_REDEPLOY, EVENT_REDEPLOY,
                                                EVENT_REDEPLOY_GAVE_UP]
    assert "uid-2" not in (st.handled or {}) and "rr-5f8-2" not in world["deleted"]


def test_what_is_a_repeat() -> None:
    st = WorkloadState(attempts=1, rejections={"localhost": iso(NOW)})
    assert repeats_a_counted_rejection(_failed(1), st, "localhost", NOW + 5)
    # another node's first rejection counts
    assert not repeats_a_counted_rejection(_failed(1, "emulated-1"), st, "emulated-1", NOW)
    # admitted by the webhook: counts
    assert not repeats_a_counted_rejection(_failed(1, seen=True), st, "localhost", NOW)
    # a bare pod: its replacements are the operator's own, each one counts
    bare = _failed(1)
    bare["metadata"]["ownerReferences"] = []
    assert not repeats_a_counted_rejection(bare, st, "localhost", NOW)
    # the node's rejection is forgotten after AVOID_FOR_S: counts again
    assert not repeats_a_counted_rejection(_failed(1), st, "localhost", NOW + 7200)
    # nothing counted yet: the first rejection counts
    assert not repeats_a_counted_rejection(_failed(1), WorkloadState(), "localhost", NOW)
