"""The extender with DRA claims (numalign.extender.dradecide through Decider): under
single-numa-node and restricted a node passes only if every device choice the allocator
has there is admitted; best-effort is never refused for alignment and prefers nodes where
an aligned choice exists; the verdict cache follows the claims' state; a claim naming a
missing class is refused by name and spoils no other pod."""

from __future__ import annotations

from typing import Any

import testdata
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api import draemulated as de
from numalign.api.draasks import NUMA_ATTRIBUTE
from numalign.api.names import (
    ANN_RESOLVED,
    DRA_UNSATISFIABLE_REASON,
    IN_FLIGHT_REASON,
    REJECT_REASON,
)
from numalign.api.nodestatus import HeldPod
from numalign.api.resolved import Resolved
from numalign.extender.decide import Decider
from numalign.extender.dra import DraCatalog
from numalign.extender.fleet import Fleet
from numalign.topology.ledger import ContainerAllocation
from numalign.topology.machine import load_machine

MACHINE = load_machine(testdata.MACHINES / "group4-gpu.yaml")  # gpu0,1: NUMA 0; gpu2,3: 1
NAMES = dict(zip((d.id for d in MACHINE.devices), de.device_names(MACHINE.devices),
                 strict=True))
GPU_CLASS = de.device_class_name("nvidia.com/gpu")


def pod(name: str, policy: str, gpus: int = 2, cls: str = GPU_CLASS, cpu: str = "4",
        constraint: bool = False, claims: bool = True) -> dict[str, Any]:
    res = {"cpu": cpu, "memory": "1Gi"}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {
        "requests": res, "limits": res, **({"claims": [{"name": "gpus"}]} if claims else {})}}]}
    status: dict[str, Any] = {}
    if claims:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": name}]
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "annotations": {ANN_RESOLVED: Resolved(policy, "container",
                                                                source="pod").annotation()}},
            "spec": spec, "status": status,
            "_template": {"metadata": {"name": name, "namespace": "ns"}, "spec": {"spec": {
                "devices": {"requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": cls, "count": gpus}}], **(
                        {"constraints": [{"matchAttribute": NUMA_ATTRIBUTE}]}
                        if constraint else {})}}}}}


def held(node: str, name: str, *gpus: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "other"},
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": de.DRIVER, "pool": node, "device": NAMES[g]}
                for g in gpus]}}}}


def fleet(nodes: dict[str, tuple[str, ...]], *pods: dict[str, Any]) -> Decider:
    """A decider over emulated DRA nodes; ``nodes``: name -> GPUs other claims hold."""
    cat = DraCatalog()
    cat.load("deviceclasses", de.device_classes(["nvidia.com/gpu"]))
    cat.load("resourceslices", [s for n in nodes for s in de.resource_slices(MACHINE, n)])
    cat.load("resourceclaims", [held(n, f"{n}-held", *g) for n, g in nodes.items() if g])
    cat.load("resourceclaimtemplates", [p["_template"] for p in pods])
    decider = Decider(dra=cat)
    for n in nodes:
        st = NodeState(n, MACHINE)
        decider.update({"metadata": {"name": n, "resourceVersion": "1"}, "spec": {},
                        "status": build_status(st)})
    return decider


def test_single_numa_node_refused_where_the_allocator_could_split_the_gpus() -> None:
    p = pod("p", "single-numa-node")
    d = fleet({"split": ("gpu1", "gpu3"), "aligned": ("gpu2", "gpu3")}, p)
    split, aligned = d.filter(p, ["split", "aligned"])
    assert aligned.fits and aligned.covered and aligned.numa_nodes == (0,)
    assert not split.fits and split.reason == REJECT_REASON
    assert split.message is not None
    assert "Resources cannot be allocated with Topology locality" in split.message
    assert "claim gpus request gpu: 2 device(s) on NUMA node(s) 0,1" in split.message
    assert split.failure.endswith("(numalign: policy single-numa-node, scope container)")


def test_every_choice_must_pass_not_just_one() -> None:
    # one GPU, free on both NUMA nodes, but NUMA node 1's CPUs are all taken: the
    # allocator may give gpu2, which the node then refuses
    p, q = pod("p", "single-numa-node", gpus=1), pod("q", "best-effort", gpus=1)
    d = fleet({"n0": ()}, p, q)
    full = [HeldPod("busy", "busy", "ns", (("c", ContainerAllocation(
        cpus=tuple(range(16, 32)))),))]
    v = d.decide(p, "n0", full)
    assert not v.fits and "on NUMA node(s) 1" in (v.message or "")
    assert d.decide(q, "n0", full).fits
    # the GPUs of NUMA node 1 held by other claims: only NUMA node 0 is left
    d = fleet({"n0": ("gpu2", "gpu3")}, p)
    v = d.decide(p, "n0", full)
    assert v.fits and v.numa_nodes == (0,)


def test_restricted_follows_the_kubelets_rule_best_effort_is_never_refused_and_ranked() -> None:
    r, b = pod("r", "restricted"), pod("b", "best-effort")
    d = fleet({"split": ("gpu1", "gpu3"), "aligned": ("gpu2", "gpu3")}, r, b)
    split, aligned = d.filter(r, ["split", "aligned"])
    assert aligned.fits and not split.fits and split.reason == REJECT_REASON
    split, aligned = d.filter(b, ["split", "aligned"])
    assert split.fits and aligned.fits
    assert aligned.score > split.score
    assert split.numa_nodes == (0, 1)


def test_the_numa_constraint_makes_single_numa_node_pass_where_one_node_can_hold_it() -> None:
    p = pod("p", "single-numa-node", constraint=True)
    d = fleet({"free": (), "split": ("gpu1", "gpu3")}, p)
    free, split = d.filter(p, ["free", "split"])
    assert free.fits and free.numa_nodes in ((0,), (1,))
    assert not split.fits and split.reason == DRA_UNSATISFIABLE_REASON
    assert "claim gpus: requests gpu cannot all be allocated on one NUMA node" in (
        split.message or "")
    # without the constraint the allocator may split them on the free node
    q = pod("q", "single-numa-node")
    d = fleet({"free": ()}, q)
    assert not d.decide(q, "free").fits


def test_verdicts_are_cached_by_the_claims_state() -> None:
    p = pod("p", "single-numa-node")
    d = fleet({"a": (), "b": ()}, p)
    assert [v.fits for v in d.filter(p, ["a", "b"])] == [False, False]
    assert d.misses == 1 and d.hits == 1  # alike nodes, alike claims: one engine run
    assert d.dra is not None
    d.dra.event("resourceclaims", "ADDED", held("a", "a-more", "gpu2", "gpu3"))
    a, b = d.filter(p, ["a", "b"])
    assert a.fits and not b.fits
    d.dra.event("resourceclaims", "DELETED", held("a", "a-more", "gpu2", "gpu3"))
    assert not d.decide(p, "a").fits


def test_a_missing_class_refuses_that_pod_by_name_and_no_other() -> None:
    bad = pod("bad", "single-numa-node", cls="no-such-class")
    good = pod("good", "single-numa-node", constraint=True)
    plain = pod("plain", "single-numa-node", claims=False)
    d = fleet({"n0": ()}, bad, good)
    v = d.decide(bad, "n0")
    assert (v.fits, v.reason) == (False, DRA_UNSATISFIABLE_REASON)
    assert v.message == ("Pod was rejected: DRA: claim gpus request gpu: DeviceClass "
                         "no-such-class not found")
    assert d.decide(good, "n0").fits and d.decide(plain, "n0").fits


def test_pods_with_claims_pass_undecided_until_the_dra_objects_are_listed() -> None:
    p = pod("p", "single-numa-node")
    d = fleet({"split": ("gpu1", "gpu3")}, p)
    assert d.dra is not None
    d.dra.listed.discard("resourceclaims")
    v = d.decide(p, "split")
    assert v.fits and not v.covered and "DRA objects not listed yet" in (v.note or "")


def test_a_pod_approved_with_claims_is_held_on_its_node() -> None:
    p = pod("p", "single-numa-node", constraint=True)
    f = Fleet(fleet({"n0": ("gpu0", "gpu1")}, p))
    [v] = f.filter(p, ["n0"])
    assert v.fits and v.numa_nodes == (1,)
    f.bound_to(p, "n0")
    [r] = f.reservations.on_node("n0")
    cpus = {c for _, a in r.containers for c in a.cpus}
    assert len(cpus) == 4 and {MACHINE.cpus[c].numa for c in cpus} == {1}


def busy(name: str, cpus: range) -> HeldPod:
    return HeldPod(name, name, "ns", (("c", ContainerAllocation(cpus=tuple(cpus))),))


def test_a_pod_in_flight_with_claims_counts_wherever_the_allocator_may_put_it() -> None:
    # Both pods ask one GPU under single-numa-node, their claims kept on one NUMA node.
    # The first is approved, not bound yet: its claim is not allocated, so its GPU (and,
    # once the node admits it, its CPUs) may be on NUMA node 0 or 1. Where one NUMA
    # node has room for one pod's CPUs only, the second pod can be refused there by
    # the node (if the allocator gives both pods GPUs of that NUMA node): the extender
    # must refuse it whichever NUMA node is the tight one.
    for tight, cpus in ((0, range(0, 12)), (1, range(16, 28))):
        first = pod("first", "single-numa-node", gpus=1, constraint=True)
        second = pod("second", "single-numa-node", gpus=1, constraint=True)
        d = fleet({"n0": ()}, first, second)
        taken = [busy("busy", cpus)]
        hold = d.decide(first, "n0", taken).held_by(first)
        assert hold is not None
        assert d.decide(second, "n0", taken).fits  # alone it fits on either NUMA node
        v = d.decide(second, "n0", taken, in_flight=[(first, hold)])
        assert not v.fits and v.reason == REJECT_REASON, f"NUMA node {tight} tight"
        # the first pod's claim allocated (on the roomy NUMA node): the second fits
        assert d.dra is not None
        gpu = "gpu2" if tight == 0 else "gpu0"
        allocated = held("n0", "first-gpus", gpu)
        allocated["metadata"] = {"name": "first-gpus", "namespace": "ns"}
        allocated["status"]["allocation"]["devices"]["results"][0]["request"] = "gpu"
        first["status"] = {"resourceClaimStatuses": [{"name": "gpus",
                                                      "resourceClaimName": "first-gpus"}]}
        d.dra.event("resourceclaims", "ADDED", allocated)
        hold = d.decide(first, "n0", taken).held_by(first)
        assert hold is not None
        assert {MACHINE.cpus[c].numa for _, a in hold.containers for c in a.cpus} == {1 - tight}
        assert d.decide(second, "n0", taken, in_flight=[(first, hold)]).fits


def test_pods_in_flight_with_claims_on_roomy_nodes_refuse_nothing() -> None:
    pods = [pod(f"p{i}", "single-numa-node", gpus=1, constraint=True) for i in range(4)]
    d = fleet({"n0": ()}, *pods)
    flying = []
    for p in pods[:3]:
        h = d.decide(p, "n0").held_by(p)
        assert h is not None
        flying.append((p, h))
    v = d.decide(pods[3], "n0", in_flight=flying)
    assert v.fits and v.covered


def test_more_ways_in_flight_than_checked_refuses_a_hard_policy_only() -> None:
    # five pods in flight (of 2 to 6 CPUs, 20 in all: more than a NUMA node has free),
    # each with one GPU of either NUMA node not allocated yet, landing here or not: 243
    # ways they may land, more than the extender checks; a single-numa-node pod waits
    # (refused there until they are bound), a best-effort one is never refused
    flying = [pod(f"f{i}", "single-numa-node", gpus=1, constraint=True, cpu=str(i + 2))
              for i in range(5)]
    snn = pod("snn", "single-numa-node", gpus=1, constraint=True, cpu="1")
    be = pod("be", "best-effort", gpus=1, cpu="1")
    d = fleet({"n0": ()}, *flying, snn, be)
    held = []
    for p in flying:
        h = d.decide(p, "n0").held_by(p)
        assert h is not None
        held.append((p, h))
    v = d.decide(snn, "n0", in_flight=held)
    assert not v.fits and v.reason == IN_FLIGHT_REASON
    assert "more than 16 ways" in (v.message or "")
    # three of them (9 CPUs) leave room on either NUMA node wherever they land: no way
    # needs deciding
    assert d.decide(snn, "n0", in_flight=held[:3]).fits
    assert d.decide(be, "n0", in_flight=held).fits
