"""Admission: scopes, policies, allocation, rejection without half allocation."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import testdata
from numalign.topology.admit import UNEXPECTED_REASON, AdmitResult, admit_pod
from numalign.topology.errors import TopologyError
from numalign.topology.hints import TopologyHint, mask_of
from numalign.topology.ledger import ContainerAllocation, Ledger
from numalign.topology.machine import Machine, load_machine
from numalign.topology.merge import REJECT_MESSAGE, REJECT_REASON
from numalign.topology.pod import Pod, pod_from_dict
from numalign.topology.policyconfig import PolicyOptions

MACHINES = testdata.MACHINES
PODS = Path(__file__).resolve().parents[1] / "fixtures" / "pods"
MI = 2**20
SEED_LIMITS = {"cpu": "2", "memory": "200Mi", "gpu-vendor.com/gpu": "1",
               "nic-vendor.com/nic": "1"}


def _machine(name: str) -> Machine:
    path = MACHINES / name
    return load_machine(path)


def _pod(name: str, limits: dict[str, str], inits: list[dict[str, Any]] | None = None,
         extra: list[dict[str, Any]] | None = None) -> Pod:
    spec: dict[str, Any] = {"containers": [{"name": "app", "resources": {"limits": limits}}]
                            + (extra or [])}
    if inits:
        spec["initContainers"] = inits
    return pod_from_dict({"metadata": {"name": name}, "spec": spec})


def m_all(m: Machine) -> int:
    return mask_of(m.numa_ids)


def _c(r: AdmitResult, name: str = "app") -> dict[str, Any]:
    out: dict[str, Any] = r.to_json()["containers"][name]
    return out


def test_seed_scenario_single_numa_node() -> None:
    m = _machine("seed-figure1.yaml")
    led = Ledger(m)
    docs = list(yaml.safe_load_all((PODS / "seed-two-pods.yaml").read_text()))
    a = admit_pod(m, led, pod_from_dict(docs[0]), "single-numa-node")
    b = admit_pod(m, led, pod_from_dict(docs[1]), "single-numa-node")
    assert a.admit and b.admit
    assert _c(a) == {"numaNodes": [0], "cpus": [0, 1], "memory": {"0": 200 * MI},
                     "memoryNumaNodes": [0],
                     "devices": {"gpu-vendor.com/gpu": ["gpu0"], "nic-vendor.com/nic": ["nic0"]}}
    assert _c(b) == {"numaNodes": [1], "cpus": [4, 5], "memory": {"1": 200 * MI},
                     "memoryNumaNodes": [1],
                     "devices": {"gpu-vendor.com/gpu": ["gpu1"], "nic-vendor.com/nic": ["nic1"]}}
    assert a.to_json()["hint"] == {"numaNodes": [0], "preferred": True}
    # a third one does not fit on one NUMA node any more (no GPU left): rejected
    c = admit_pod(m, led, _pod("c", SEED_LIMITS), "single-numa-node")
    assert not c.admit and c.reason == REJECT_REASON and c.message == REJECT_MESSAGE
    assert c.containers == {} and len(led.pods) == 2


def _two_cpus_left(m: Machine) -> Ledger:
    led = Ledger(m)
    led.allocate("other", "c", ContainerAllocation(cpus=(0, 1, 2, 4, 5, 6)))
    return led


def test_split_cpus_restricted_rejects_best_effort_spans() -> None:
    m = _machine("seed-figure1.yaml")
    limits = {"cpu": "2", "memory": "200Mi"}
    led = _two_cpus_left(m)
    before = led.to_json()
    r = admit_pod(m, led, _pod("p", limits), "restricted")
    assert not r.admit and r.reason == "TopologyAffinityError"
    assert r.hint.preferred is False
    assert led.to_json() == before  # nothing allocated
    r = admit_pod(m, _two_cpus_left(m), _pod("p", limits), "single-numa-node")
    assert not r.admit and r.reason == "TopologyAffinityError"
    r = admit_pod(m, led, _pod("p", limits), "best-effort")
    assert r.admit and r.reason is None
    assert _c(r)["cpus"] == [3, 7] and _c(r)["numaNodes"] == [0, 1]
    assert r.to_json()["hint"] == {"numaNodes": [0, 1], "preferred": False}


def test_allocation_failure_is_unexpected_admission_error() -> None:
    m = _machine("seed-figure1.yaml")
    led = _two_cpus_left(m)
    r = admit_pod(m, led, _pod("p", {"cpu": "3", "memory": "1Gi"}), "best-effort")
    assert not r.admit and r.reason == UNEXPECTED_REASON
    assert r.message is not None and "not enough cpus" in r.message
    assert set(led.pods) == {"other"}


def test_non_guaranteed_pods_share_the_pool() -> None:
    m = _machine("seed-figure1.yaml")
    led = Ledger(m)
    p = pod_from_dict({"metadata": {"name": "b"}, "spec": {"containers": [
        {"name": "app", "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                                      "limits": {"gpu-vendor.com/gpu": "1"}}}]}})
    r = admit_pod(m, led, p, "single-numa-node")
    assert r.admit and _c(r)["cpus"] == [] and _c(r)["memory"] == {}
    assert _c(r)["devices"] == {"gpu-vendor.com/gpu": ["gpu0"]}
    assert led.free_cpus() == set(range(8))


def test_container_scope_init_cpus_are_reused() -> None:
    m = _machine("seed-figure1.yaml")
    led = Ledger(m)
    init = [{"name": "init", "resources": {"limits": {"cpu": "4", "memory": "100Mi"}}}]
    r = admit_pod(m, led, _pod("p", {"cpu": "2", "memory": "100Mi"}, init), "restricted")
    assert r.admit
    assert _c(r, "init")["cpus"] == [0, 1, 2, 3]
    assert set(_c(r)["cpus"]) <= {0, 1, 2, 3}
    # the init container's memory block is reused by the app container (same affinity)
    assert sum(led.memory_used.values()) == 100 * MI
    # a second pod cannot take the first pod's CPUs
    r2 = admit_pod(m, led, _pod("q", {"cpu": "4", "memory": "100Mi"}), "restricted")
    assert r2.admit and _c(r2)["cpus"] == [4, 5, 6, 7]


def test_pod_scope_uses_the_effective_request() -> None:
    m = _machine("dual-16core.yaml")
    led = Ledger(m)
    p = pod_from_dict(yaml.safe_load((PODS / "sidecar-init.yaml").read_text()))
    r = admit_pod(m, led, p, "single-numa-node", "pod")
    assert r.admit and r.hint.mask == 1 and len(r.decisions) == 1
    cpus = {c: _c(r, c)["cpus"] for c in ("setup", "proxy", "late-init", "main", "helper")}
    assert all(set(v) <= set(range(16)) for v in cpus.values())
    assert len(cpus["setup"]) == 6 and len(cpus["proxy"]) == 1
    # container scope: one decision per container
    r = admit_pod(m, Ledger(m), p, "single-numa-node", "container")
    assert r.admit and [d.unit for d in r.decisions] == ["setup", "proxy", "late-init",
                                                         "main", "helper"]


def test_pod_scope_rejects_what_no_single_node_holds() -> None:
    m = _machine("dual-16core.yaml")
    p = _pod("big", {"cpu": "10", "memory": "1Gi"},
             extra=[{"name": "second", "resources": {"limits": {"cpu": "10", "memory": "1Gi"}}}])
    assert admit_pod(m, Ledger(m), p, "single-numa-node", "container").admit
    r = admit_pod(m, Ledger(m), p, "single-numa-node", "pod")
    assert not r.admit and r.reason == REJECT_REASON


def test_more_than_the_machine_is_a_rejection() -> None:
    """The kubelet rejects a pod asking more than the machine has like any other pod
    (its Topology Manager first, then its resource-fit check); only malformed input is
    an error."""
    m = _machine("seed-figure1.yaml")
    led = Ledger(m)
    r = admit_pod(m, led, _pod("p", {"cpu": "9", "memory": "1Gi"}), "restricted")
    assert not r.admit and r.reason == REJECT_REASON and r.containers == {}
    r = admit_pod(m, led, _pod("p", {"cpu": "9", "memory": "1Gi"}), "none")
    assert not r.admit and r.reason == UNEXPECTED_REASON
    assert r.message == ("Allocate failed due to not enough cpus available to satisfy "
                         "request: requested=9, available=8, which is unexpected")
    # a Burstable pod gets no exclusive CPUs: the resource-fit check rejects it
    burst = pod_from_dict({"metadata": {"name": "b"}, "spec": {"containers": [
        {"name": "app", "resources": {"requests": {"cpu": "8500m"}}}]}})
    r = admit_pod(m, led, burst, "single-numa-node")
    assert not r.admit and r.reason == "OutOfcpu"
    assert r.message == ("Node didn't have enough resource: cpu, requested: 8500, used: 0, "
                         "capacity: 8000")
    # an extended resource the node does not have is ignored, as the kubelet ignores it
    assert admit_pod(m, led, _pod("f", {"example.com/fpga": "1"}), "restricted").admit
    assert not led.pods or all(not rec.containers["app"].devices for rec in led.pods.values())
    with pytest.raises(TopologyError, match="unknown policy"):
        admit_pod(m, Ledger(m), _pod("p", {"cpu": "1"}), "strict")
    with pytest.raises(TopologyError, match="unknown scope"):
        admit_pod(m, Ledger(m), _pod("p", {"cpu": "1"}), "restricted", "node")


def test_resource_fit_after_the_topology_manager() -> None:
    """seed-figure1: 3500m, 3500m (shared pool), then 2 exclusive CPUs: the Topology
    Manager would place the third on CPUs 0-1, the kubelet's fit check rejects it."""
    m = _machine("seed-figure1.yaml")
    led = Ledger(m)
    for name in ("a", "b"):
        assert admit_pod(m, led, _pod(name, {"cpu": "3500m", "memory": "1Gi"}),
                         "single-numa-node").admit
    before = led.to_json()
    r = admit_pod(m, led, _pod("c", {"cpu": "2", "memory": "1Gi"}), "single-numa-node")
    assert not r.admit and r.reason == "OutOfcpu" and r.containers == {}
    assert r.message == ("Node didn't have enough resource: cpu, requested: 2000, "
                         "used: 7000, capacity: 8000")
    assert led.to_json() == before
    # memory is counted the same way, across NUMA nodes (64Gi in all); a Burstable pod
    # gets nothing from the memory manager, so only the fit check can refuse it
    burst = pod_from_dict({"metadata": {"name": "d"}, "spec": {"containers": [
        {"name": "app", "resources": {"requests": {"memory": "63Gi"}}}]}})
    r = admit_pod(m, led, burst, "none")
    assert not r.admit and r.reason == "OutOfmemory"
    assert r.message == (f"Node didn't have enough resource: memory, requested: {63 << 30}, "
                         f"used: {2 << 30}, capacity: {64 << 30}")
    # the ledger keeps each pod's requests (persisted with it)
    again = Ledger.from_json(m, led.to_json())
    assert sorted(again.pod_requests(), key=str) == sorted(led.pod_requests(), key=str)
    assert {"cpu": 3500, "memory": 1 << 30} in again.pod_requests()


@pytest.mark.parametrize("policy", ["none", "best-effort", "restricted", "single-numa-node"])
def test_wide64_decisions(policy: str) -> None:
    m = _machine("wide64.yaml")
    led = Ledger(m)
    p = _pod("a", {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"})
    t = time.perf_counter()
    r = admit_pod(m, led, p, policy)
    assert time.perf_counter() - t < 2.0
    assert r.admit
    if policy != "none":
        assert r.hint.mask == 1 and r.hint.preferred  # GPU 0 sits on NUMA node 0
        assert _c(r)["cpus"] == [0, 1, 2, 3] and _c(r)["devices"] == {"nvidia.com/gpu": ["gpu0"]}
    # GPU and NIC never share a NUMA node on wide64, and the device manager's masks cover
    # only the nodes with devices of the resource: no mask is common to both, the merge
    # falls back to every node (not preferred), and the memory manager refuses a block
    # over all nodes while node 0 holds pod a's single-node block
    q = _pod("b", {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1", "nvidia.com/hca": "1"})
    r = admit_pod(m, led, q, policy)
    assert r.admit == (policy == "none")
    if policy == "best-effort":
        assert r.hint == TopologyHint(m_all(m), False) and r.reason == UNEXPECTED_REASON
        assert r.message is not None and "violates NUMA node allocation" in r.message
        assert r.decisions[0].plan is not None and r.decisions[0].plan.method == "reduced"
    # 24 CPUs and 40Gi both need 3 NUMA nodes: preferred width 3
    big = _pod("c", {"cpu": "24", "memory": "40Gi"})
    r = admit_pod(m, led, big, policy)
    if policy in ("best-effort", "restricted"):
        assert r.admit and r.hint.preferred and r.hint.mask is not None
        assert r.hint.mask.bit_count() == 3
    if policy == "single-numa-node":
        assert not r.admit


@pytest.mark.parametrize("policy", ["best-effort", "restricted", "single-numa-node"])
def test_gb200_cpu_less_nodes(policy: str) -> None:
    m = _machine("gb200-like-34numa.yaml")
    led = Ledger(m)
    p = _pod("a", {"cpu": "8", "memory": "16Gi", "hugepages-2Mi": "1Gi", "nvidia.com/gpu": "2",
                   "nvidia.com/hca": "1"})
    r = admit_pod(m, led, p, policy, options=PolicyOptions(prefer_closest_numa_nodes=True))
    assert r.admit and r.hint.preferred and r.hint.mask == 1
    assert _c(r)["devices"] == {"nvidia.com/gpu": ["gpu0", "gpu1"], "nvidia.com/hca": ["mlx5_0"]}
    assert _c(r)["hugepages"] == {"2Mi": {"0": 1024 * MI}}
    # memory beyond a Grace node: needs two NUMA nodes, CPUs need one: not preferred
    q = _pod("b", {"cpu": "2", "memory": "500Gi"})
    r = admit_pod(m, led, q, policy)
    assert r.admit == (policy == "best-effort")
    if r.admit:
        assert sum(_c(r)["memory"].values()) == 500 * 1024 * MI


def test_explain_detail() -> None:
    m = _machine("seed-figure1.yaml")
    r = admit_pod(m, Ledger(m), _pod("p", SEED_LIMITS), "restricted", commit=False)
    ex = r.explain()
    dec = ex["decisions"][0]
    assert dec["unit"] == "app" and dec["hintGeneration"]["method"] == "full"
    names = [p["provider"] for p in dec["providers"]]
    assert names == ["cpu", "memory", "devices"]
    assert dec["providers"][0]["hints"]["cpu"][0] == {"numaNodes": [0], "preferred": True}


def test_memory_numa_nodes_as_the_memory_manager_holds_them() -> None:
    """A block spanning NUMA nodes is pinned to the whole group; an app container that
    reuses its init container's memory keeps its block's NUMA nodes (no new bytes)."""
    m = _machine("seed-figure1.yaml")
    led = Ledger(m)
    wide = admit_pod(m, led, _pod("wide", {"cpu": "1", "memory": "40Gi"}), "best-effort")
    assert wide.admit
    c = _c(wide)
    assert c["memoryNumaNodes"] == [0, 1]
    assert sum(c["memory"].values()) == 40 << 30  # bytes accounted once, node by node
    init = {"name": "setup", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
    r = admit_pod(m, Ledger(m), _pod("reuse", {"cpu": "1", "memory": "1Gi"}, inits=[init]),
                  "single-numa-node")
    assert r.admit
    setup, app = _c(r, "setup"), _c(r, "app")
    assert app["memory"] == {} and app["memoryNumaNodes"] == setup["memoryNumaNodes"]
    assert len(app["memoryNumaNodes"]) == 1


def test_pod_scope_memory_request_has_the_app_containers_types_only() -> None:
    """The memory manager's pod request counts only the memory types the app containers
    ask for: hugepages only an init container asks for do not steer the pod's hint, and
    the init container then cannot get them on the node the hint names."""
    from numalign.topology.machine import machine_from_dict

    m = machine_from_dict({"name": "hp", "numaNodes": [
        {"id": 0, "cpus": "0-3", "memory": "32Gi", "hugepages": {"1Gi": "1Gi"}},
        {"id": 1, "cpus": "4-7", "memory": "32Gi", "hugepages": {"1Gi": "4Gi"}}]})
    init = {"name": "setup", "resources": {"limits": {
        "cpu": "500m", "memory": "1Gi", "hugepages-1Gi": "2Gi"}}}
    p = _pod("p", {"cpu": "500m", "memory": "1Gi"}, inits=[init])
    r = admit_pod(m, Ledger(m), p, "single-numa-node", "pod")
    assert r.decisions[0].hint == TopologyHint(1, True)  # memory only: node 0 first
    assert not r.admit and r.reason == UNEXPECTED_REASON
    assert r.message == ("Allocate failed due to [memorymanager] failed to find the extended "
                         "preferred hint, which is unexpected")


def test_decisions_without_demands_follow_the_override_hints() -> None:
    """A pod no manager aligns (Burstable) with GPU groups: the merge follows the GPU
    hints of each node's state (decisions without demands are kept by what they depend
    on, the override's hints among them)."""
    m = _machine("group4-gpu.yaml")
    gpus = {d.id: d.numa_node for d in m.devices_of("nvidia.com/gpu")}
    on = {n: sorted(i for i, nn in gpus.items() if nn == n) for n in (0, 1)}
    pod = pod_from_dict({
        "metadata": {"name": "g", "annotations": {"numalign.io/gpus": '[{"count": 2}]'}},
        "spec": {"containers": [{"name": "app", "resources": {
            "requests": {"cpu": "1", "nvidia.com/gpu": "2"},
            "limits": {"nvidia.com/gpu": "2"}}}]}})
    assert pod.qos != "Guaranteed"

    def admit(taken: list[str]) -> AdmitResult:
        led = Ledger(m)
        if taken:
            led.allocate("x", "c", ContainerAllocation(devices={"nvidia.com/gpu": tuple(taken)}))
        return admit_pod(m, led, pod, "single-numa-node", "pod", commit=False)

    first, second = admit([]), admit(on[0][:1])
    assert first.admit and first.hint == TopologyHint(mask_of([0]), True)
    assert second.admit and second.hint == TopologyHint(mask_of([1]), True)
    assert sorted(_c(second)["devices"]["nvidia.com/gpu"]) == on[1]
    third = admit([on[0][0], on[1][0]])
    assert not third.admit and third.reason == REJECT_REASON
