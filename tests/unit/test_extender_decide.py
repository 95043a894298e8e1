"""The extender's decision (numalign.extender.decide): every verdict is what the node
itself decides (the agent's NodeState on the same state), reservations count, the score
ranks alignment, nodes without NodeTopology pass."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import testdata
from agent_helpers import given
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api.effective import Origin
from numalign.api.names import ANN_GPUS, ANN_RESOLVED, REJECT_REASON
from numalign.api.nodestatus import HeldPod
from numalign.api.resolved import Resolved
from numalign.extender.decide import (
    MAX_SCORE,
    NEUTRAL_SCORE,
    Decider,
    NodeView,
    decide,
)
from numalign.topology.machine import load_machine

MACHINES = testdata.MACHINES
GPU = "gpu-vendor.com/gpu"


def pod(name: str, limits: dict[str, str] | None, policy: str | None = "single-numa-node",
        scope: str = "container", annotations: dict[str, str] | None = None
        ) -> dict[str, Any]:
    ann = dict(annotations or {})
    if policy is not None:
        ann[ANN_RESOLVED] = Resolved(policy, scope, source="pod").annotation()
    res = {"limits": limits} if limits else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                         "annotations": ann},
            "spec": {"containers": [{"name": "main", "image": "pause", "resources": res}]}}


def node(machine: str, name: str = "n0") -> NodeState:
    return NodeState(name, load_machine(MACHINES / f"{machine}.yaml"))


def published(st: NodeState, rv: int, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": st.name, "resourceVersion": str(rv)}, "spec": {},
            "status": {**build_status(st), **status}}


def resolved_of(p: dict[str, Any]) -> Resolved:
    from numalign.api.resolved import parse_resolved

    return parse_resolved(p["metadata"]["annotations"][ANN_RESOLVED])


SEQUENCE = [("a", "6", "single-numa-node"), ("b", "4", "single-numa-node"),
            ("c", "12", "restricted"), ("d", "3", "single-numa-node"),
            ("e", "20", "best-effort"), ("f", "4", "single-numa-node"),
            ("g", "2", "single-numa-node"), ("h", "8", "restricted"),
            ("i", "4", "single-numa-node"), ("j", "1", "single-numa-node")]


@pytest.mark.parametrize("machine", ["fragmented-8numa", "dual-16core", "dgx-a100-like"])
def test_every_verdict_is_the_nodes_own_decision(machine: str) -> None:
    st = node(machine)
    decider = Decider()
    refused = 0
    for rv, (name, cpus, policy) in enumerate(SEQUENCE, start=1):
        decider.update(published(st, rv))
        p = pod(name, {"cpu": cpus, "memory": "1Gi"}, policy)
        verdict = decider.decide(p, st.name)
        got = st.decide(p, given(resolved_of(p)))
        assert verdict.covered
        assert verdict.fits == got.admit, (name, verdict, got)
        if not got.admit:
            refused += 1
            assert verdict.reason == got.reason
            assert verdict.message == got.message
            assert verdict.score == 0
        else:
            assert got.allocation is not None
            assert list(verdict.numa_nodes) == got.allocation.numa_nodes
    assert refused > 0 or machine != "fragmented-8numa"


def test_reservations_stand_for_pods_the_node_has_not_published() -> None:
    """A burst: pods bound before the node publishes are held by the extender, so the
    verdicts on the stale status still equal the node's decisions."""
    st = node("fragmented-8numa")
    decider = Decider()
    decider.update(published(st, 1))  # the node publishes once; the burst comes after
    held: list[HeldPod] = []
    for i in range(10):
        p = pod(f"p{i}", {"cpu": "4", "memory": "1Gi"})
        verdict = decider.decide(p, st.name, held)
        got = st.decide(p, given(resolved_of(p)))
        assert verdict.fits == got.admit, i
        if verdict.fits:
            r = decider.hold(p, st.name, held)
            assert r is not None and r.uid == f"uid-p{i}"
            held.append(r)
    assert len(held) == 8  # eight NUMA nodes of four CPUs each
    # once the node publishes them, the reservations change nothing (not counted twice)
    decider.update(published(st, 2))
    last = pod("late", {"cpu": "1", "memory": "1Gi"})
    assert not decider.decide(last, st.name, held).fits
    assert not decider.decide(last, st.name).fits


def test_a_nodes_state_with_its_reservations_is_one_key_kept_while_they_stand() -> None:
    """What a node holds with reservations it does not list is one sorted key, read once
    while the same reservations stand, read again when they change, the node's own key
    when it lists them all."""
    from numalign.extender.view import held_key

    st = node("fragmented-8numa")
    decider = Decider()
    view = decider.update(published(st, 1))
    held = [h for i in range(3)
            if (h := decider.hold(pod(f"p{i}", {"cpu": "2", "memory": "1Gi"}), st.name))]
    assert len(held) == 3
    first = view.state_with(held[:2])
    assert first == tuple(sorted((*view.held_key, *held_key(held[:2]))))
    assert view.state_with(list(held[:2])) is first  # kept
    assert view.state_with(held) == tuple(sorted((*view.held_key, *held_key(held))))
    assert view.state_with(held) != first
    assert view.state_with([]) is view.held_key


def holding(machine: str, cpus: str
            ) -> tuple[NodeState, Decider, dict[str, Any], HeldPod]:
    """A node of ``machine`` as published, its decider, and a pod "first" of ``cpus``
    CPUs with what it would hold there."""
    st = node(machine)
    decider = Decider()
    decider.update(published(st, 1))
    first = pod("first", {"cpu": cpus, "memory": "1Gi"})
    held = decider.hold(first, st.name)
    assert held is not None
    return st, decider, first, held


def test_a_reservation_the_node_moved_past_still_holds_what_is_free(
        caplog: pytest.LogCaptureFixture) -> None:
    """A reservation naming CPUs the node now shows held by another pod is not dropped:
    it is logged (debug: the node decided the pods in another order than the extender
    reserved them, which is no fault) and holds what of it is still free, so no room
    appears for it."""
    caplog.set_level(logging.DEBUG, logger="numalign.extender")
    st, decider, _, r = holding("fragmented-8numa", "4")
    other = pod("other", {"cpu": "2", "memory": "1Gi"})
    assert st.decide(other, given(resolved_of(other))).admit  # takes two CPUs of the same NUMA node
    view = decider.update(published(st, 2))
    ledger = view.ledger_with([r])
    assert r.uid in ledger.pods, "the reservation was dropped"
    kept = {c for a in ledger.pods[r.uid].containers.values() for c in a.cpus}
    reserved = {c for _, a in r.containers for c in a.cpus}
    assert kept == reserved - {c for c, o in ledger.cpu_owner.items() if o[0] != r.uid}
    assert len(kept) == 2
    assert "does not fit what the node publishes" in caplog.text


def test_node_without_nodetopology_passes() -> None:
    decider = Decider()
    v = decider.decide(pod("a", {"cpu": "4", "memory": "1Gi"}), "unknown")
    assert v.fits and not v.covered and v.score == NEUTRAL_SCORE
    assert "no NodeTopology" in (v.note or "")
    decider.update({"metadata": {"name": "fresh", "resourceVersion": "1"}, "spec": {}})
    v = decider.decide(pod("a", {"cpu": "4", "memory": "1Gi"}), "fresh")
    assert v.fits and not v.covered and "no status" in (v.note or "")
    decider.update({"metadata": {"name": "bad", "resourceVersion": "1"},
                    "status": {"zones": [{"id": "x"}]}})
    v = decider.decide(pod("a", {"cpu": "4", "memory": "1Gi"}), "bad")
    assert v.fits and not v.covered and "status.zones[0].id" in (v.note or "")


def test_kubelet_managed_node_decides_by_its_kubelet_and_holds_reserved_cpus() -> None:
    st = node("dual-16core")
    kubelet = {"topologyManagerPolicy": "single-numa-node", "topologyManagerScope": "pod",
               "cpuManagerPolicy": "static", "reservedSystemCPUs": "0-7"}
    nt = published(st, 1, kubelet=kubelet)
    view = NodeView.from_nodetopology(nt)
    # the pod's own policy says none; the kubelet's single-numa-node decides
    p = pod("a", {"cpu": "12", "memory": "1Gi"}, policy="none")
    v = decide(p, view)
    assert v.policy is not None and v.policy.origin is Origin.KUBELET
    assert v.fits and v.numa_nodes == (1,)  # NUMA node 0 keeps 8 of 16 CPUs for the system
    assert not decide(pod("b", {"cpu": "17", "memory": "1Gi"}, policy="none"), view).fits
    # on an emulated node the same pod's own policy applies
    v = decide(p, NodeView.from_nodetopology(published(st, 1)))
    assert v.policy is not None and v.policy.origin is Origin.POD


def test_score_ranks_fewer_numa_nodes_then_distance() -> None:
    decider = Decider()
    small, big = node("fragmented-8numa", "small"), node("dual-16core", "big")
    decider.update(published(small, 1))
    decider.update(published(big, 1))
    p = pod("a", {"cpu": "8", "memory": "1Gi"}, policy="best-effort")
    v_small, v_big = decider.filter(p, ["small", "big"])
    assert v_small.fits and v_big.fits
    assert len(v_small.numa_nodes) == 2 and len(v_big.numa_nodes) == 1
    assert v_big.score == MAX_SCORE > v_small.score
    # the two NUMA nodes the small node gives are close ones (same socket): a wider
    # spread (4 NUMA nodes over both sockets) scores lower still
    wide = pod("w", {"cpu": "16", "memory": "1Gi"}, policy="best-effort")
    v_wide = decider.decide(wide, "small")
    assert v_wide.fits and v_wide.score < v_small.score
    # a pod asking for no alignment: no opinion
    assert decider.decide(pod("be", None, policy="none"), "small").score == NEUTRAL_SCORE


def test_best_effort_pod_is_not_kept_off_a_fragmented_node() -> None:
    st = node("fragmented-8numa")
    for i in range(8):  # every NUMA node partly taken
        p = pod(f"f{i}", {"cpu": "3", "memory": "1Gi"})
        assert st.decide(p, given(resolved_of(p))).admit
    view = NodeView.from_nodetopology(published(st, 1))
    assert not decide(pod("big", {"cpu": "2", "memory": "1Gi"}), view).fits
    for p in (pod("be", None, policy="none"), pod("bu", None, policy="single-numa-node"),
              pod("burst", {"memory": "1Gi"}, policy="single-numa-node")):
        assert decide(p, view).fits


def test_invalid_gpu_request_is_refused_unresolvably() -> None:
    st = node("group4-gpu")
    view = NodeView.from_nodetopology(published(st, 1))
    p = pod("g", {"cpu": "1", "memory": "1Gi"}, annotations={ANN_GPUS: "not-a-request"})
    v = decide(p, view)
    got = st.decide(p, given(resolved_of(p)))
    assert not v.fits and not got.admit and v.reason == got.reason
    assert v.resolvable is False


def test_verdicts_are_cached_per_state_and_follow_resource_version() -> None:
    decider = Decider()
    states = [node("fragmented-8numa", f"n{i}") for i in range(20)]
    for st in states:
        decider.update(published(st, 1))
    p = pod("a", {"cpu": "4", "memory": "1Gi"})
    names = [st.name for st in states]
    assert all(v.fits for v in decider.filter(p, names))
    assert decider.misses == 1 and decider.hits == 19  # twenty nodes in one state
    assert [v.node for v in decider.filter(p, names)] == names
    # n0 fills up and publishes: its new state is decided afresh, the others are not
    for i in range(8):
        q = pod(f"q{i}", {"cpu": "4", "memory": "1Gi"})
        assert states[0].decide(q, given(resolved_of(q))).admit
    decider.update(published(states[0], 2))
    verdicts = decider.filter(p, names)
    assert not verdicts[0].fits and verdicts[0].reason == REJECT_REASON
    assert all(v.fits for v in verdicts[1:])
    assert decider.misses == 2
    # the same resourceVersion again is not re-read
    view = decider.view("n0")
    assert decider.update(published(states[0], 2)) is view


def test_unreadable_pod_is_left_to_the_node() -> None:
    decider = Decider()
    decider.update(published(node("dual-16core"), 1))
    bad = pod("x", {"cpu": "lots"})
    v = decider.decide(bad, "n0")
    assert v.fits and not v.covered and "cannot be read" in (v.note or "")


@pytest.mark.parametrize("machine", ["fragmented-8numa", "dual-16core", "dgx-a100-like",
                                     "seed-figure1"])
def test_pods_in_flight_give_the_verdict_of_holding_them(machine: str) -> None:
    """A pod in flight (approved elsewhere, not bound) counts as held: the shortcut that
    keeps the verdict without it (room_left) never admits what holding it refuses."""
    import random

    rng = random.Random(machine)
    for trial in range(12):
        st = node(machine, f"n{trial}")
        for i in range(rng.randrange(0, 6)):  # some pods already there
            p = pod(f"pre{trial}-{i}", {"cpu": str(rng.choice([1, 2, 3])), "memory": "1Gi"},
                    rng.choice(["single-numa-node", "best-effort"]), scope="pod")
            st.decide(p, given(resolved_of(p)))
        decider = Decider()
        decider.update(published(st, 1))
        flying: list[tuple[dict[str, Any], HeldPod]] = []
        for i in range(6):
            p = pod(f"f{trial}-{i}", {"cpu": str(rng.choice([1, 2, 4, 6])), "memory": "1Gi"},
                    rng.choice(["single-numa-node", "best-effort", "restricted"]),
                    scope=rng.choice(["pod", "container"]))
            fast = decider.decide(p, st.name, in_flight=flying)
            exact = Decider()
            exact.update(published(st, 1))
            held: list[HeldPod] = []
            for q, _ in flying:  # the pods in flight admitted first, in order
                h = exact.hold(q, st.name, held)
                if h is not None:
                    held.append(h)
            slow = exact.decide(p, st.name, held)
            assert fast.fits == slow.fits, (trial, i, fast, slow)
            approved = fast.held_by(p)
            if approved is not None:
                flying.append((p, approved))


@pytest.mark.parametrize("machine", ["fragmented-8numa", "dgx-a100-like"])
def test_room_left_reads_pods_in_flight_alike_from_their_holds_and_their_sums(
        machine: str) -> None:
    """The second look at pods in flight checks each against the others' summed asks
    (one sum less its own share): the same answer as from the others' holds."""
    import random

    from numalign.extender.inflight import Asked, room_left
    from numalign.extender.podshape import pod_shape, policy_of

    rng = random.Random(machine)
    checked = 0
    for trial in range(6):
        st = node(machine, f"n{trial}")
        decider = Decider()
        decider.update(published(st, 1))
        view = decider.views[st.name]
        holds: list[HeldPod] = []
        for i in range(8):
            p = pod(f"f{trial}-{i}", {"cpu": str(rng.choice([1, 2, 4, 6])), "memory": "1Gi"},
                    rng.choice(["single-numa-node", "best-effort", "restricted"]),
                    scope="pod")
            v = decider.decide(p, st.name)
            h = v.held_by(p)
            if h is None:
                continue
            others = list(holds)
            total = Asked.of([*holds, h]).less(Asked.of([h]))
            alone = Asked.of(others)
            assert (total.pods, total.unknown, total.wide, total.cpus) == (
                alone.pods, alone.unknown, alone.wide, alone.cpus)
            for got, want in ((total.memory, alone.memory), (total.devices, alone.devices)):
                assert {k: v for k, v in got.items() if v} == want  # none taken: 0
            resolved = policy_of(p, view).resolved
            assert room_left(view, [], others, v, pod_shape(p), resolved) == room_left(
                view, [], total, v, pod_shape(p), resolved)
            checked += 1
            holds.append(h)
    assert checked >= 12


def test_room_left_spares_the_engine_far_from_capacity() -> None:
    st, decider, first, held = holding("dual-16core", "6")
    second = pod("second", {"cpu": "6", "memory": "1Gi"})
    assert decider.decide(second, st.name, in_flight=[(first, held)]).fits
    assert decider.misses == 1  # the pod's shape on this state, decided once
    # near capacity the engine decides with the pods in flight held
    flying: list[tuple[dict[str, Any], HeldPod]] = [(first, held)]
    for i in range(3):
        more = pod(f"m{i}", {"cpu": "6", "memory": "1Gi"})
        v = decider.decide(more, st.name, in_flight=flying)
        assert v.fits
        h = v.held_by(more)
        assert h is not None
        flying.append((more, h))
    assert not decider.decide(pod("last", {"cpu": "6", "memory": "1Gi"}), st.name,
                              in_flight=flying).fits


def test_score_prefers_gpus_of_one_island() -> None:
    """Two GPUs under best-effort: one NVLink island (one NUMA node) on a free node ranks
    above two islands (two NUMA nodes) where gpu0 and gpu2 are taken."""
    gpu = "nvidia.com/gpu"
    free, taken = node("group4-gpu", "free"), node("group4-gpu", "taken")
    held = published(taken, 1)
    held["status"]["admitted"] = [
        {"pod": f"t{i}", "namespace": "default", "uid": f"t{i}", "numaNodes": [i],
         "containers": [{"name": "c", "numaNodes": [i], "devices": {gpu: [g]}}]}
        for i, g in enumerate(("gpu0", "gpu2"))]
    decider = Decider()
    decider.update(published(free, 1))
    decider.update(held)
    two = pod("two", {"cpu": "2", "memory": "1Gi", gpu: "2"}, policy="best-effort")
    v_free, v_taken = decider.filter(two, ["free", "taken"])
    assert v_free.fits and v_taken.fits
    assert v_free.score == MAX_SCORE > v_taken.score
