"""Restore after a restart and NodeTopology status building (pure parts of the agent)."""

from __future__ import annotations

import json
from typing import Any

import testdata
from agent_helpers import given
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api.names import ANN_ALLOCATION
from numalign.api.nodetopology import NodeTopologyStatus, summarize
from numalign.api.resolved import Resolved
from numalign.topology.machine import load_machine

MACHINES = testdata.MACHINES
GPU = "gpu-vendor.com/gpu"
NIC = "nic-vendor.com/nic"
MI200 = 200 << 20


def _state() -> NodeState:
    return NodeState("seed-figure1-0", load_machine(MACHINES / "seed-figure1.yaml"))


def _alloc(cpus: list[int], zone: int, gpu: str, nic: str) -> dict[str, Any]:
    return {"numaNodes": [zone], "containers": {"main": {
        "cpus": cpus, "memory": {str(zone): MI200}, "numaNodes": [zone],
        "devices": {GPU: [gpu], NIC: [nic]}}}, "gpus": {}}


def _pod(name: str, phase: str, alloc: dict[str, Any] | None = None,
         reason: str | None = None, cpu: str | None = "2") -> dict[str, Any]:
    """A pod with one container "main": Guaranteed (``cpu`` CPUs, 200Mi, one GPU and one
    NIC) unless ``cpu`` is None (BestEffort)."""
    ann = {ANN_ALLOCATION: json.dumps(alloc)} if alloc is not None else {}
    status: dict[str, Any] = {"phase": phase}
    if reason:
        status["reason"] = reason
    main: dict[str, Any] = {"name": "main", "image": "pause"}
    if cpu is not None:
        res = {"cpu": cpu, "memory": "200Mi", GPU: "1", NIC: "1"}
        main["resources"] = {"requests": res, "limits": res}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "annotations": ann, "creationTimestamp": "2024-01-01T00:00:00Z"},
            "spec": {"nodeName": "seed-figure1-0", "containers": [main]},
            "status": status}


def _published(entries: list[dict[str, Any]], rejected: int = 0) -> dict[str, Any]:
    return {"metadata": {"name": "seed-figure1-0"},
            "spec": {"policy": "single-numa-node", "scope": "pod", "policyGeneration": 4},
            "status": {"admitted": entries, "rejected": rejected}}


def test_restore_from_annotations_and_status() -> None:
    st = _state()
    p1 = _pod("p1", "Running", _alloc([0, 1], 0, "gpu0", "nic0"))
    p2 = _pod("p2", "Running")  # no annotation: the published entry has it
    p3 = _pod("p3", "Failed", reason="TopologyAffinityError")
    p4 = _pod("p4", "Pending")
    entries: list[dict[str, Any]] = [
        {"pod": "p2", "namespace": "ns", "uid": "uid-p2", "policy": "single-numa-node",
         "scope": "pod", "source": "TopologyPolicy/x", "numaNodes": [1], "cpus": "4-5",
         "memory": {"1": MI200}, "devices": {GPU: ["gpu1"], NIC: ["nic1"]},
         "containers": [{"name": "main", "numaNodes": [1], "cpus": "4-5",
                         "memory": {"1": "200Mi"}, "devices": {GPU: ["gpu1"], NIC: ["nic1"]}}]},
        {"pod": "gone", "namespace": "ns", "uid": "uid-gone", "policy": "none",
         "scope": "container", "source": "none", "numaNodes": [], "cpus": "2-3"},
    ]
    report = st.restore(_published(entries, rejected=3), [p1, p2, p3, p4])
    assert sorted(report.restored) == ["uid-p1", "uid-p2"]
    assert report.rejected == ["uid-p3"]
    assert [p["metadata"]["name"] for p in report.pending] == ["p4"]
    assert report.dropped == ["uid-gone"]
    assert report.conflicts == []
    assert st.ledger.free_cpus() == {2, 3, 6, 7}
    assert st.ledger.free_devices(GPU) == [] and st.ledger.free_devices(NIC) == []
    assert st.ledger.free_memory(0, "memory") == (32 << 30) - MI200
    assert st.rejected_total == 3
    assert st.default == Resolved("single-numa-node", "pod", {}, "node-default")
    assert st.observed_generation == 4
    assert st.admitted["uid-p2"].resolved.source == "TopologyPolicy/x"
    # decided pods are not decided again
    assert set(st.decided) == {"uid-p1", "uid-p2", "uid-p3"}
    d = st.decide(p1, given(Resolved()))
    assert d.admit and d.allocation is not None and d.allocation.cpus == [0, 1]


def test_restore_never_double_allocates() -> None:
    st = _state()
    a = _pod("a", "Running", _alloc([0, 1], 0, "gpu0", "nic0"))
    b = _pod("b", "Running", _alloc([1, 2], 0, "gpu0", "nic1"))
    report = st.restore(None, [a, b])
    assert report.restored == ["uid-a"]
    assert report.conflicts == ["uid-b"]
    assert st.ledger.free_cpus() == {2, 3, 4, 5, 6, 7}
    assert "uid-b" not in st.admitted


def test_release_frees() -> None:
    st = _state()
    st.restore(None, [_pod("a", "Running", _alloc([0, 1], 0, "gpu0", "nic0"))])
    v = st.version
    assert st.release("uid-a")
    assert st.version > v
    assert st.ledger.free_cpus() == set(range(8))
    assert not st.release("uid-a")


def test_status_matches_the_api_model() -> None:
    st = _state()
    st.restore(_published([]), [_pod("p1", "Running", _alloc([0, 1], 0, "gpu0", "nic0")),
                                _pod("p3", "Failed", reason="TopologyAffinityError")])
    status = build_status(st)
    model = NodeTopologyStatus.model_validate(status)
    assert model.to_dict()["summary"] == summarize(model).to_dict()
    assert status["summary"] == {"numaNodes": 2, "cpus": "6/8", "devices": "2/4", "pods": 1}
    assert status["rejected"] == 1
    assert status["observedPolicyGeneration"] == 4
    z0, z1 = status["zones"]
    assert z0["available"] == {"cpu": 2, "memory": "32568Mi", GPU: 0, NIC: 0}
    assert z1["available"] == z1["allocatable"]
    (entry,) = status["admitted"]
    assert entry["pod"] == "p1" and entry["cpus"] == "0-1" and entry["numaNodes"] == [0]
    assert entry["devices"] == {GPU: ["gpu0"], NIC: ["nic0"]}
    assert entry["memory"] == {"0": MI200}
    conds = {c["type"]: c["status"] for c in status["conditions"]}
    assert conds == {"Ready": "True", "PolicyApplied": "True"}


def test_status_of_every_fixture_validates() -> None:
    for f in sorted(MACHINES.glob("*.yaml")):
        st = NodeState(f.stem, load_machine(f))
        status = build_status(st)
        model = NodeTopologyStatus.model_validate(status)
        assert model.to_dict()["summary"] == summarize(model).to_dict(), f.name


def test_condition_transition_time_kept() -> None:
    st = _state()
    first = build_status(st)
    first["conditions"][0]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    again = build_status(st, first)
    assert again["conditions"][0]["lastTransitionTime"] == "2020-01-01T00:00:00Z"


def _entry(name: str, cpus: str, zone: int, gpu: str, nic: str) -> dict[str, Any]:
    return {"pod": name, "namespace": "ns", "uid": f"uid-{name}", "policy": "none",
            "scope": "container", "source": "none", "numaNodes": [zone], "cpus": cpus,
            "memory": {str(zone): MI200}, "devices": {GPU: [gpu], NIC: [nic]},
            "containers": [{"name": "main", "numaNodes": [zone], "cpus": cpus,
                            "memory": {str(zone): "200Mi"}, "devices": {GPU: [gpu], NIC: [nic]}}]}


def test_restore_trusts_what_the_agent_published_over_tenant_annotations() -> None:
    """A tenant rewrites its pod's allocation annotation to claim another pod's CPUs and
    devices: the published status wins, for its own pod and for the victim."""
    st = _state()
    victim = _pod("victim", "Running", _alloc([0, 1], 0, "gpu0", "nic0"))
    # The thief's annotation claims the victim's CPUs; its published entry says 4-5.
    thief = _pod("thief", "Running", _alloc([0, 1], 0, "gpu0", "nic0"))
    # An annotation-only pod (no published entry) claiming the same: listed first.
    squatter = _pod("squatter", "Running", _alloc([0, 1], 0, "gpu0", "nic0"))
    entries = [_entry("victim", "0-1", 0, "gpu0", "nic0"),
               _entry("thief", "4-5", 1, "gpu1", "nic1")]
    report = st.restore(_published(entries), [squatter, thief, victim])
    assert sorted(report.restored) == ["uid-thief", "uid-victim"]
    assert report.conflicts == ["uid-squatter"]
    victim_alloc = st.admitted["uid-victim"].allocation
    thief_alloc = st.admitted["uid-thief"].allocation
    assert victim_alloc.cpus == [0, 1] and thief_alloc.cpus == [4, 5]
    assert st.ledger.free_cpus() == {2, 3, 6, 7}


def test_restore_survives_a_poisoned_annotation() -> None:
    st = _state()
    poisoned = _pod("poisoned", "Running")
    poisoned["metadata"]["annotations"][ANN_ALLOCATION] = "[" * 5000 + "]" * 5000
    huge = _pod("huge", "Running")
    huge["metadata"]["annotations"][ANN_ALLOCATION] = json.dumps(
        {"numaNodes": [0], "containers": {"c": {"cpus": list(range(100000))}}})
    good = _pod("good", "Running", _alloc([0, 1], 0, "gpu0", "nic0"))
    report = st.restore(None, [poisoned, huge, good])
    assert report.restored == ["uid-good"]
    assert st.decided["uid-poisoned"] is True and "uid-poisoned" not in st.admitted


def test_a_pod_annotation_is_believed_only_when_it_matches_the_pod() -> None:
    """Finding 1: a record the status lacks is checked against what its pod asks (as the
    kubelet's static policy would have given it); anything else is refused, with why."""
    st = _state()
    owner = _pod("owner", "Running", _alloc([0, 1], 0, "gpu0", "nic0"))
    claim = _alloc([0, 1], 0, "gpu0", "nic0")
    # listed before the owner, each claiming the owner's CPUs
    best_effort = _pod("besteffort", "Running", claim, cpu=None)
    burstable = _pod("burstable", "Running", claim)
    res = burstable["spec"]["containers"][0]["resources"]
    res["limits"] = dict(res["limits"], cpu="4")
    greedy = _pod("greedy", "Running", _alloc([4, 5], 1, "gpu1", "nic1"), cpu="1")
    elsewhere = _pod("elsewhere", "Running", _alloc([4, 5], 7, "gpu1", "nic1"))
    ghost = _pod("ghost", "Running", {"numaNodes": [1], "containers": {
        "sidecar": {"cpus": [4, 5], "numaNodes": [1]}}})
    fractional = _pod("fractional", "Running", _alloc([6], 1, "gpu1", "nic1"), cpu="1500m")
    report = st.restore(_published([_entry("owner", "0-1", 0, "gpu0", "nic0")]),
                        [best_effort, burstable, greedy, elsewhere, ghost, fractional, owner])
    assert report.restored == ["uid-owner"]
    assert st.admitted["uid-owner"].allocation.cpus == [0, 1]
    refused = report.refused
    assert set(refused) == {"uid-besteffort", "uid-burstable", "uid-greedy", "uid-elsewhere",
                            "uid-ghost", "uid-fractional"}
    assert "BestEffort" in refused["uid-besteffort"]
    assert "Burstable" in refused["uid-burstable"]
    assert "main: 2 exclusive CPUs, but it requests 1" in refused["uid-greedy"]
    assert "NUMA node 7" in refused["uid-elsewhere"]
    assert "sidecar: no such container" in refused["uid-ghost"]
    assert "main: 1 exclusive CPUs, but it requests 1500m" in refused["uid-fractional"]
    # each runs on with nothing exclusive (decided: not admitted again with new CPUs)
    assert all(st.decided[u] for u in refused) and not set(refused) & set(st.admitted)
    assert st.ledger.free_cpus() == {2, 3, 4, 5, 6, 7}
    # an honest record of a pod the status lacks comes back
    st2 = _state()
    honest = _pod("honest", "Running", _alloc([4, 5], 1, "gpu1", "nic1"))
    assert st2.restore(None, [honest]).restored == ["uid-honest"]


def test_a_record_that_parses_but_names_what_the_machine_lacks_is_refused() -> None:
    """Finding 2: nothing in a record stops the restore (a published entry with a memory
    zone of two nodes, NUMA nodes the machine lacks, zones that are no ids)."""
    st = _state()
    bad_entries = [
        dict(_entry("zones", "0-1", 0, "gpu0", "nic0"),
             containers=[{"name": "main", "cpus": "0-1", "memory": {"0,1": "200Mi"}}]),
        dict(_entry("affinity", "2-3", 0, "gpu0", "nic0"),
             containers=[{"name": "main", "cpus": "2-3", "memoryNumaNodes": [200]}]),
        dict(_entry("negative", "2-3", 0, "gpu0", "nic0"), numaNodes=[-1]),
    ]
    pods = [_pod(n, "Running") for n in ("zones", "affinity", "negative")]
    for name, bad in (("x", {"memory": {"x": 1}}), ("neg", {"numaNodes": [-1]}),
                      ("big", {"memoryNumaNodes": [10**11]})):
        alloc = _alloc([4, 5], 1, "gpu1", "nic1")
        alloc["containers"]["main"].update(bad)
        pods.append(_pod(name, "Running", alloc))
    good = _pod("good", "Running", _alloc([6, 7], 1, "gpu1", "nic1"))
    report = st.restore(_published(bad_entries), [*pods, good])
    assert report.restored == ["uid-good"]
    assert set(report.refused) == {f"uid-{n}" for n in (
        "zones", "affinity", "negative", "x", "neg", "big")}
    assert "memoryNumaNodes: 100000000000 is not a NUMA node id" in report.refused["uid-big"]
    assert st.ledger.free_cpus() == {0, 1, 2, 3, 4, 5}


def test_status_and_restore_keep_the_admission_order() -> None:
    """status.admitted lists pods in the order the node admitted them, and a restart puts
    them back in that order (whatever order the pods are listed in): the memory manager's
    NUMA group of a NUMA node is the last admission's there, so a ledger rebuilt in
    another order (by name, say) can hold other groups and decide the next pod
    differently."""
    st = NodeState("n", load_machine(MACHINES / "dual-16core.yaml"))
    resolved = Resolved("restricted", "pod", {}, "pod")
    order = ["zeta", "alpha", "mid"]
    pods = []
    for name in order:
        res = {"cpu": "2", "memory": "1Gi"}
        pod = {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
               "spec": {"nodeName": "n", "containers": [{"name": "main", "resources": {
                   "requests": res, "limits": res}}]}}
        d = st.decide(pod, given(resolved))
        assert d.admit and d.allocation is not None
        pod["metadata"]["annotations"] = {ANN_ALLOCATION: d.allocation.to_annotation()}
        pod["status"] = {"phase": "Running"}
        pods.append(pod)
    published = json.loads(json.dumps({"spec": {}, "status": build_status(st)}))
    assert [e["pod"] for e in published["status"]["admitted"]] == order
    again = NodeState("n", st.machine)
    report = again.restore(published, sorted(pods, key=lambda p: p["metadata"]["name"]))
    assert report.restored == [f"uid-{n}" for n in order]
    assert list(again.ledger.pods) == list(st.ledger.pods)
    assert again.ledger.cells == st.ledger.cells
