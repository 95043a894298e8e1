"""The filter's fast verdict (numalign.extender.feasible) is exact: on random fleets
(many nodes of few machines, with random pods held, so that nodes alike share a group
answer), every node's pass or refusal, reason and message equal what that node's full
decision gives, decided afresh; a pod a fast verdict admitted counts in flight on every
such node; prioritize completes the verdicts it scores."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from test_extender_differential import Node, bound_to, scheduler_fits

import testdata
from numalign.extender.decide import Decider, Verdict, decide
from numalign.extender.fleet import Fleet
from numalign.topology.machine import load_machine
from random_fleet import (
    FULL,
    KUBELET_POLICIES,
    SCOPES,
    fixture_machine,
    random_pod,
    random_spec,
    synthetic_machine,
)

JSON = dict[str, Any]


def _answer(v: Verdict) -> tuple[Any, ...]:
    return (v.node, v.fits, v.reason, v.message, v.covered, v.resolvable)


def _fleet(rng: random.Random) -> tuple[list[Node], list[str], list[str]]:
    """2-3 machines, 4-9 nodes each, holding 0-5 random pods (some nodes alike)."""
    nodes: list[Node] = []
    machines = [fixture_machine(rng) if rng.random() < 0.6 else synthetic_machine(rng, i)
                for i in range(rng.randint(2, 3))]
    devices = sorted({d.resource for m in machines for d in m.devices})
    levels = sorted({lvl for m in machines for d in m.devices for lvl, _ in d.groups})
    index = 0
    for k, machine in enumerate(machines):
        spec = random_spec(rng, k + 1, FULL)
        for i in range(rng.randint(4, 9)):
            node = Node(f"m{k}-{i}", machine, spec)
            for _ in range(rng.choice((0, 0, 1, 2, 3, 5))):
                index += 1
                pod = bound_to(random_pod(rng, index, devices, levels, False, FULL), node.name)
                if scheduler_fits(machine, pod, node.requests()):
                    node.bind(pod)
            nodes.append(node)
    return nodes, devices, levels


def _policy(rng: random.Random, pod: JSON) -> JSON:
    """The pod under a random policy and scope of its own (every one reached)."""
    ann = pod["metadata"]["annotations"]
    if rng.random() < 0.8:
        ann["numalign.io/resolved"] = json.dumps({
            "policy": rng.choice(KUBELET_POLICIES), "scope": rng.choice(SCOPES),
            "source": "TopologyPolicy/t"})
    return pod


def _decider(nodes: Any) -> tuple[Decider, list[str]]:
    """A decider over the published NodeTopologies of ``nodes``, and their names."""
    decider = Decider()
    for n in nodes:
        decider.update(n.published())
    return decider, [n.name for n in nodes]


# 95 and 112: a pod asking for a hugepage size its node lacks; 283 and 350: a node
# with no memory free for the pod (the memory manager then has no preference)
@pytest.mark.parametrize("seed", [*range(60), 95, 112, 283, 350])
def test_fast_verdicts_equal_the_full_decision(seed: int) -> None:
    rng = random.Random(seed)
    nodes, devices, levels = _fleet(rng)
    decider, names = _decider(nodes)
    shared = 0
    for i in range(12):
        pod = _policy(rng, random_pod(rng, 1000 + i, devices, levels, False, FULL))
        before = decider.fast.shared
        fast = decider.filter(pod, names, complete=False)
        shared += decider.fast.shared - before
        full = decider.filter(pod, names)
        fresh = [decide(pod, decider.views[n]) for n in names]
        where = f"seed {seed} pod {json.dumps(pod, sort_keys=True)}"
        assert [_answer(v) for v in fast] == [_answer(v) for v in fresh], where
        assert [_answer(v) for v in full] == [_answer(v) for v in fresh], where
        for v, w in zip(fast, fresh, strict=True):
            # an admission given in full is the full one; a shared one has no allocation
            assert v == w if v.complete else (v.fits and not v.containers), where


def test_the_random_fleets_share_answers() -> None:
    """The fleets above do share group answers, admissions and refusals both (so the
    comparison covers the shared path, not only nodes decided in full)."""
    decider = Decider()
    fits = refused = 0
    for seed in range(20):
        rng = random.Random(seed)
        nodes, devices, levels = _fleet(rng)
        for n in nodes:
            decider.update(n.published())
        for i in range(12):
            pod = _policy(rng, random_pod(rng, 1000 + i, devices, levels, False, FULL))
            for v in decider.filter(pod, [n.name for n in nodes], complete=False):
                if not v.complete:
                    fits += 1
                elif not v.fits and v.node not in {n.name for n in nodes[:1]}:
                    refused += 1
    assert decider.fast.shared > 500 and fits > 200 and refused > 50, (
        decider.fast.shared, fits, refused)


def _snn_pod(name: str, cpus: str) -> JSON:
    res = {"cpu": cpus, "memory": "1Gi"}
    return {"metadata": {"name": name, "namespace": "a", "uid": f"uid-{name}",
                         "annotations": {"numalign.io/resolved": json.dumps(
                             {"policy": "single-numa-node", "scope": "pod",
                              "source": "TopologyPolicy/t"})}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": res,
                                                                "limits": res}}]}}


def _empty_fleet(count: int) -> Fleet:
    machine = load_machine(testdata.MACHINES / "seed-figure1.yaml")
    fleet = Fleet()
    fleet.load_nodetopologies([Node(f"n{i}", machine, {}).published() for i in range(count)])
    return fleet


def test_a_pod_a_fast_verdict_admitted_counts_in_flight() -> None:
    """Two single-numa-node pods each filling one NUMA node of seed-figure1, approved on
    twenty empty nodes (all but the first by a shared answer) and not bound yet: a
    third is refused on every node, as either may land there first."""
    fleet = _empty_fleet(20)
    fleet.defer = False  # every node decided (test_extender_defer: nodes left for later)
    names = [f"n{i}" for i in range(20)]
    first = fleet.filter(_snn_pod("p0", "4"), names)
    assert all(v.fits for v in first) and sum(not v.complete for v in first) == 19
    assert all(v.fits for v in fleet.filter(_snn_pod("p1", "4"), names))
    third = fleet.filter(_snn_pod("p2", "4"), names)
    assert [v.fits for v in third] == [False] * 20, third


def test_prioritize_completes_the_verdicts_and_the_holds() -> None:
    """Prioritize (approve False) answers with every node's score and NUMA nodes, and the
    pod's in-flight holds there then name the CPUs it would take."""
    fleet = _empty_fleet(6)
    names = [f"n{i}" for i in range(6)]
    pod = _snn_pod("p0", "2")
    assert any(not v.complete for v in fleet.filter(pod, names))
    scored = fleet.filter(pod, names, approve=False)
    assert all(v.complete and v.fits and len(v.numa_nodes) == 1 for v in scored), scored
    held = [h for n in names for _, h in fleet.in_flight.on_node(n)]
    assert len(held) == 6 and all(
        sum(len(a.cpus) for _, a in h.containers) == 2 for h in held), held


def test_a_refusal_naming_a_holder_names_this_nodes_holder(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two nodes of one machine in the same state (one pod each, holding the same CPUs,
    under other names): a refusal whose message names the pod holding a CPU (as a
    manager's allocation failure words it) names each node's own pod, not the pod of
    the node decided first."""
    from numalign.extender import decide as module
    from numalign.topology.admit import UNEXPECTED_REASON

    real = module.decide

    def naming(pod: JSON, view: Any, reservations: Any = (), **kw: Any) -> Verdict:
        v = real(pod, view, reservations, **kw)
        holder = view.held[0]
        return Verdict(v.node, False, UNEXPECTED_REASON,
                       f"Allocate failed due to cpu 0 is already held by {holder.uid}/c",
                       policy=v.policy)

    monkeypatch.setattr(module, "decide", naming)
    machine = load_machine(testdata.MACHINES / "seed-figure1.yaml")
    nodes = [Node(f"n{i}", machine, {}) for i in range(3)]
    for i, node in enumerate(nodes):
        pod = _snn_pod(f"held{i}", "2")
        assert node.bind(bound_to(pod, node.name)).admit
    decider = Decider()
    for node in nodes:
        decider.update(node.published())
    assert len({(v.machine_key, v.held_key) for v in decider.views.values()}) == 1
    for complete in (True, False):
        got = decider.filter(_snn_pod("p", "1"), ["n0", "n1", "n2"], complete=complete)
        assert [v.message.rsplit(" ", 1)[1] for v in got if v.message] == [
            "uid-held0/c", "uid-held1/c", "uid-held2/c"], got


# ---------------------------------------------------------------- the merge's rules
# (numalign.extender.preferred): tight fleets, where pods span NUMA nodes


def _tight_pod(rng: random.Random, index: int, devices: list[str], kinds: list[str]) -> JSON:
    """A simple pod (one container, or two under pod scope) of a size that often
    spans NUMA nodes, under restricted, best-effort or single-numa-node, mostly
    without policy options; Guaranteed mostly, with hugepages or devices at times."""
    guaranteed = rng.random() < 0.85
    scope = rng.choice(SCOPES)
    count = 2 if scope == "pod" and rng.random() < 0.3 else 1
    containers = []
    for i in range(count):
        res = {"cpu": str(rng.choice((1, 2, 3, 4, 5, 6, 8, 10, 12))),
               "memory": f"{rng.choice((256, 1024, 3072, 6144, 12288))}Mi"}
        if not guaranteed:
            res["cpu"] = rng.choice(("100m", "1"))
        if kinds and rng.random() < 0.15:
            res[rng.choice(kinds)] = f"{rng.choice((2, 128, 512))}Mi"
        if devices and rng.random() < 0.3:
            res[rng.choice(devices)] = str(rng.choice((1, 1, 2, 3)))
        containers.append({"name": f"c{i}", "image": "pause", "resources": {
            "requests": res, **({"limits": res} if guaranteed else {})}})
    options: JSON = {}
    if rng.random() < 0.1:
        options = {"preferClosestNumaNodes": True}
    resolved = {"policy": rng.choice(("restricted", "best-effort", "single-numa-node")),
                "scope": scope, "options": options, "source": "TopologyPolicy/t"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{index}", "namespace": "a", "uid": f"uid-{index}",
                         "annotations": {"numalign.io/resolved": json.dumps(resolved)}},
            "spec": {"containers": containers}}


def _tight_fleet(rng: random.Random) -> tuple[list[Node], list[str], list[str]]:
    """2-3 machines (fixtures with small NUMA nodes, or synthetic ones), 5-12 nodes
    each, filled with 0-12 such pods (memory held alone and across NUMA nodes)."""
    names = ("fragmented-8numa", "seed-figure1", "dual-16core", "group4-gpu",
             "sample-devices-2numa", "dgx1-like", "gb200-like-34numa")
    machines = [load_machine(testdata.MACHINES / f"{rng.choice(names)}.yaml")
                if rng.random() < 0.5 else synthetic_machine(rng, i)
                for i in range(rng.randint(2, 3))]
    devices = sorted({d.resource for m in machines for d in m.devices})
    kinds = sorted({f"hugepages-{s}" for m in machines for s in m.hugepage_sizes})
    nodes: list[Node] = []
    index = 0
    for k, machine in enumerate(machines):
        spec = {"policy": "best-effort", "scope": "container"}
        for i in range(rng.randint(5, 12)):
            node = Node(f"m{k}-{i}", machine, spec)
            for _ in range(rng.randint(0, 12)):
                index += 1
                pod = bound_to(_tight_pod(rng, index, devices, kinds), node.name)
                if scheduler_fits(machine, pod, node.requests()):
                    node.bind(pod)
            nodes.append(node)
    return nodes, devices, kinds


@pytest.mark.parametrize("seed", range(40))
def test_fast_verdicts_on_tight_fleets_equal_the_full_decision(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pods spanning NUMA nodes on nodes whose free CPUs, memory and devices are
    scattered: every fast verdict (admissions where some mask is preferred by every
    manager, refusals where none is, best-effort's CPU failures, shared across
    machines) equals the node's full decision."""
    from numalign.extender import feasible

    real, classifier = feasible.outcome, feasible.classifier
    seen: list[Any] = []
    monkeypatch.setattr(feasible, "outcome", lambda r, free: seen.append(
        got := real(r, free)) or got)

    def recording(r: Any) -> Any:
        classify = classifier(r)
        return lambda free: seen.append(got := classify(free)) or got

    monkeypatch.setattr(feasible, "classifier", recording)
    rng = random.Random(seed)
    nodes, devices, kinds = _tight_fleet(rng)
    decider, names = _decider(nodes)
    for i in range(15):
        pod = _tight_pod(rng, 5000 + i, devices, kinds)
        fast = decider.filter(pod, names, complete=False)
        fresh = [decide(pod, decider.views[n]) for n in names]
        where = f"seed {seed} pod {json.dumps(pod, sort_keys=True)}"
        assert [_answer(v) for v in fast] == [_answer(v) for v in fresh], where
    _TIGHT_OUTCOMES.extend(seen)


_TIGHT_OUTCOMES: list[Any] = []


def test_the_tight_fleets_reach_every_rule() -> None:
    """The tight fleets above reach each of the rules' answers (so their comparison
    covers them), and most nodes get one: few take the full decision."""
    from numalign.extender.preferred import ADMITS, REFUSES, SHORT

    if not _TIGHT_OUTCOMES:
        for seed in range(40):
            test_fast_verdicts_on_tight_fleets_equal_the_full_decision(
                seed, pytest.MonkeyPatch())
    kinds = [o[0] if isinstance(o, tuple) else o for o in _TIGHT_OUTCOMES]
    assert {ADMITS, REFUSES, SHORT} <= set(kinds), set(kinds)
    assert kinds.count(None) < len(kinds) / 4, (kinds.count(None), len(kinds))


def _pod_under(policy: str, name: str, cpus: str) -> JSON:
    pod = _snn_pod(name, cpus)
    pod["metadata"]["annotations"]["numalign.io/resolved"] = json.dumps(
        {"policy": policy, "scope": "container", "source": "TopologyPolicy/t"})
    return pod


@pytest.mark.parametrize(("policy", "cpus"), [
    # 4 CPUs per NUMA node: the CPU manager prefers two nodes, the memory manager one
    ("restricted", "6"),
    ("single-numa-node", "6"),
    # more CPUs than either machine has: one failure per count of CPUs free
    ("best-effort", "40")])
def test_a_refusal_the_same_on_every_machine_is_decided_without_the_engine(
        policy: str, cpus: str) -> None:
    """Empty nodes of two machines (fragmented-8numa, seed-figure1): a pod no merged
    hint can prefer is refused on all of them without a full decision (the merge's
    refusal, its message the kubelet's fixed one); under best-effort the CPU manager's
    failure, its message worded from the CPUs free. Each verdict is the node's own
    full decision."""
    decided = 0
    nodes = [Node(f"{m}-{i}", load_machine(testdata.MACHINES / f"{m}.yaml"), {})
             for m in ("fragmented-8numa", "seed-figure1") for i in range(6)]
    decider, names = _decider(nodes)
    pod = _pod_under(policy, "p", cpus)
    fast = decider.filter(pod, names, complete=False)
    fresh = [decide(pod, decider.views[n]) for n in names]
    assert [_answer(v) for v in fast] == [_answer(v) for v in fresh]
    assert not any(v.fits for v in fast) and decider.fast.decided == decided, fast


@pytest.mark.parametrize("options", [None, {"maxAllowableNumaNodes": 8}])
def test_an_admission_the_rules_imply_needs_one_full_decision(
        options: dict[str, int] | None) -> None:
    """Empty nodes of two machines (fragmented-8numa, seed-figure1), a pod of 1 CPU: the
    first node admitting it is decided in full (its allocation and score known), the
    others are admitted from the rules, the nodes of the other machine too; with policy
    options given (the policy may not build on a machine) the first node of each
    machine is decided in full. Every verdict is the node's own full decision."""
    nodes = [Node(f"{m}-{i}", load_machine(testdata.MACHINES / f"{m}.yaml"), {})
             for m in ("fragmented-8numa", "seed-figure1") for i in range(6)]
    decider, names = _decider(nodes)
    pod = _pod_under("single-numa-node", "p", "1")
    if options is not None:
        ann = json.loads(pod["metadata"]["annotations"]["numalign.io/resolved"])
        pod["metadata"]["annotations"]["numalign.io/resolved"] = json.dumps(
            {**ann, "options": options})
    fast = decider.filter(pod, names, complete=False)
    fresh = [decide(pod, decider.views[n]) for n in names]
    assert [_answer(v) for v in fast] == [_answer(v) for v in fresh]
    assert all(v.fits for v in fast)
    assert [v.complete for v in fast] == (
        [True] + [False] * 11 if options is None else [True] + [False] * 5 + [True]
        + [False] * 5), fast
    assert decider.fast.decided == (1 if options is None else 2)
