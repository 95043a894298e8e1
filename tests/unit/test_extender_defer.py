"""A burst's filter stays within a bound (Decider.filter's ``defer``).

A node whose pods in flight (approved, not bound yet) leave it too tight to admit the
pod without deciding every way they may land is decided last: refused for now
(``PodsInFlightUnchecked``, saying why) while enough other nodes admit the pod, else
decided way by way up to a budget of engine runs per filter; never approved without a
decision."""

from __future__ import annotations

from typing import Any

import pytest

import testdata
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api.names import ANN_RESOLVED, IN_FLIGHT_REASON
from numalign.api.nodestatus import HeldPod
from numalign.api.resolved import Resolved
from numalign.extender import decide as decide_module
from numalign.extender.decide import ENOUGH_PASSING, MAX_DEFERRED_NODES, Decider
from numalign.extender.fleet import Fleet
from numalign.topology.ledger import ContainerAllocation
from numalign.topology.machine import load_machine

MACHINE = load_machine(testdata.MACHINES / "group4-gpu.yaml")  # NUMA 0: CPUs 0-15, 1: 16-31


def pod(name: str, cpu: str = "2") -> dict[str, Any]:
    res = {"cpu": cpu, "memory": "1Gi"}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "annotations": {ANN_RESOLVED: Resolved(
                             "single-numa-node", "pod", source="pod").annotation()}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": res,
                                                                "limits": res}}]}}


# leaves 2 CPUs free on each NUMA node
BUSY = HeldPod("busy", "busy", "ns", (("c", ContainerAllocation(
    cpus=(*range(0, 14), *range(16, 30)))),))
# leaves 2 CPUs free on NUMA node 0 only
FULLER = HeldPod("busy", "busy", "ns", (("c", ContainerAllocation(
    cpus=(*range(0, 14), *range(16, 32)))),))


def decider(nodes: int) -> Decider:
    d = Decider()
    for i in range(nodes):
        st = NodeState(f"n{i}", MACHINE)
        d.update({"metadata": {"name": f"n{i}", "resourceVersion": "1"}, "spec": {},
                  "status": build_status(st)})
    return d


def setup(roomy: int, tight: int, busy: HeldPod = BUSY
          ) -> tuple[Decider, list[str], dict[str, Any], dict[str, Any]]:
    """``tight`` nodes holding ``busy`` (2 CPUs free per NUMA node) and a 2-CPU pod in
    flight to each (it takes one NUMA node's two; the candidate, 2 CPUs, then fits on
    the other: the counts alone cannot tell), and ``roomy`` empty nodes; the reservations
    and pods in flight by node."""
    d = decider(roomy + tight)
    names = [f"n{i}" for i in range(roomy + tight)]
    flying = pod("flying")
    held: dict[str, Any] = {}
    fly: dict[str, Any] = {}
    for n in names[roomy:]:
        held[n] = [busy]
        hold = d.decide(flying, n, [busy]).held_by(flying)
        assert hold is not None
        fly[n] = [(flying, hold)]
    return d, names, held, fly


def test_a_tight_node_waits_while_enough_other_nodes_admit_the_pod() -> None:
    d, names, held, fly = setup(ENOUGH_PASSING, 1)
    cand = pod("cand")
    *roomy, tight = d.filter(cand, names, held, fly, defer=True)
    assert all(v.fits for v in roomy)
    assert not tight.fits and tight.reason == IN_FLIGHT_REASON
    assert f"{ENOUGH_PASSING} other nodes admit it" in (tight.message or "")
    # decided way by way, the tight node admits it (on the other NUMA node)
    *_, full = d.filter(cand, names, held, fly)
    assert full.fits and full.numa_nodes == (1,)


def test_with_too_few_other_nodes_a_tight_node_is_decided() -> None:
    d, names, held, fly = setup(ENOUGH_PASSING - 1, 1)
    *_, tight = d.filter(pod("cand"), names, held, fly, defer=True)
    assert tight.fits and tight.numa_nodes == (1,)


def test_deferred_nodes_are_decided_up_to_a_budget_of_engine_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(decide_module, "MAX_DEFERRED_RUNS", 1)
    d, names, held, fly = setup(0, 6)
    runs = d.runs
    verdicts = d.filter(pod("cand"), names, held, fly, defer=True)
    # the first tight node decided (the pod in flight's hold there is the one kept from
    # its approval; the candidate with it: one run), the budget then spent: the others
    # wait
    assert d.runs - runs == 1
    assert verdicts[0].fits
    for v in verdicts[1:]:
        assert not v.fits and v.reason == IN_FLIGHT_REASON
        assert "budget for one filter (4 nodes refusing the pod, 1 decisions)" in (
            v.message or "")


def test_deferred_nodes_are_decided_until_a_few_refuse_the_pod() -> None:
    # the pod in flight takes the only 2 CPUs free on the tight nodes: with one other
    # node admitting the candidate, once four tight nodes refused it the rest wait
    d, names, held, fly = setup(1, 6, FULLER)
    verdicts = d.filter(pod("cand"), names, held, fly, defer=True)
    assert verdicts[0].fits
    assert [v.reason for v in verdicts[1:]] == ["TopologyAffinityError"] * MAX_DEFERRED_NODES + [
        IN_FLIGHT_REASON] * (6 - MAX_DEFERRED_NODES)


def test_while_no_node_admits_the_pod_deferred_nodes_are_decided_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a pod no node admits goes back to the scheduler's queue for seconds: while none
    # does, refusals do not stop the search, only a larger budget of engine runs
    d, names, held, fly = setup(0, 6, FULLER)
    verdicts = d.filter(pod("cand"), names, held, fly, defer=True)
    assert [v.reason for v in verdicts] == ["TopologyAffinityError"] * 6
    # (the nodes alike share their decisions: one engine run decides them all; a budget
    # of none leaves every one waiting)
    monkeypatch.setattr(decide_module, "MAX_LONE_RUNS", 0)
    d, names, held, fly = setup(0, 6, FULLER)
    verdicts = d.filter(pod("cand"), names, held, fly, defer=True)
    assert [v.reason for v in verdicts] == [IN_FLIGHT_REASON] * 6
    assert "0 decisions while no node admitted it" in (verdicts[-1].message or "")


def test_deferred_nodes_are_decided_until_enough_admit_the_pod() -> None:
    d, names, held, fly = setup(0, ENOUGH_PASSING + 3)
    verdicts = d.filter(pod("cand"), names, held, fly, defer=True)
    assert [v.fits for v in verdicts] == [True] * ENOUGH_PASSING + [False] * 3
    assert f"{ENOUGH_PASSING} other nodes admit it" in (verdicts[-1].message or "")


def test_the_extenders_filter_defers_unless_told_not_to() -> None:
    d, names, _, fly = setup(ENOUGH_PASSING, 1)
    f = Fleet(d)
    for n, pods in fly.items():  # the pod in flight as filter approved it
        for p, h in pods:
            f.in_flight.approve(p, p["metadata"]["uid"], {n: h}, [n])
        f.reservations.add(n, BUSY)
    cand = pod("cand")
    *_, tight = f.filter(cand, names)
    assert not tight.fits and tight.reason == IN_FLIGHT_REASON
    f.defer = False
    *_, tight = f.filter(cand, names)
    assert tight.fits
