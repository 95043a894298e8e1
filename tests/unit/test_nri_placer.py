"""agent.nri.placer: the engine's decisions as NRI cpusets (exclusive CPUs, shared pool,
rejection, memory nodes the kernel has, rebuild after a restart)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from agent_helpers import given
from numalign.agent.nri.placer import (
    EnginePlacer,
    PodView,
    cpulist,
    kernel_memory_nodes,
    parse_cpulist,
)
from numalign.agent.nri.plugin import CpuSet, Rejected
from numalign.agent.publish import admitted_entries
from numalign.api.allocation import Allocation, parse_allocation
from numalign.api.names import ANN_ALLOCATION, REJECTED_PREFIX, TOPOLOGY_MESSAGE
from numalign.api.resolved import Resolved
from numalign.nriapi.v1alpha1 import api_pb2
from numalign.topology.machine import machine_from_dict

# a view of 2 NUMA nodes of 2 CPUs over a kernel with one memory node (node 0)
MACHINE = machine_from_dict({
    "name": "view-2x2",
    "numaNodes": [{"id": 0, "cpus": "0-1", "memory": "4Gi"},
                  {"id": 1, "cpus": "2-3", "memory": "4Gi"}],
})


def k8s_pod(uid: str, cpu: str, name: str = "p", containers: tuple[str, ...] = ("main",)) \
        -> dict[str, Any]:
    res = {"requests": {"cpu": cpu, "memory": "256Mi"},
           "limits": {"cpu": cpu, "memory": "256Mi"}}
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": c, "resources": res} for c in containers]}}


def best_effort(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "c"}]}}


def nri_pod(uid: str) -> Any:
    return api_pb2.PodSandbox(id=f"sb-{uid}", uid=uid, name=uid, namespace="ns")


def nri_ctr(uid: str, name: str, cid: str) -> Any:
    return api_pb2.Container(id=cid, pod_sandbox_id=f"sb-{uid}", name=name)


class Pods:
    def __init__(self) -> None:
        self.views: dict[str, PodView] = {}

    def add(self, uid: str, cpu: str, policy: str = "single-numa-node",
            containers: tuple[str, ...] = ("main",)) -> None:
        self.views[uid] = PodView(k8s_pod(uid, cpu, containers=containers),
                                  given(Resolved(policy=policy, scope="container")))

    def __call__(self, uid: str) -> PodView | None:
        return self.views.get(uid)


@pytest.fixture
def pods() -> Pods:
    return Pods()


def test_exclusive_cpus_and_the_shared_pool(pods: Pods) -> None:
    admitted: list[str] = []
    placer = EnginePlacer(MACHINE, pods, reserved_cpus=[0], memory_nodes=[0],
                          on_admit=lambda uid, alloc: admitted.append(uid))
    # a container not from Kubernetes runs in the shared pool: every CPU
    other = placer.create(nri_pod("other"), nri_ctr("other", "c", "c-other"))
    assert other.cpuset == CpuSet("0-3", "0") and other.updates == {}
    pods.add("g2", "2")
    got = placer.create(nri_pod("g2"), nri_ctr("g2", "main", "c-g2"))
    assert got.cpuset is not None
    cpus = parse_cpulist(got.cpuset.cpus)
    # single-numa-node: 2 CPUs of one NUMA node, never the reserved CPU 0
    assert cpus == {2, 3}
    # NUMA node 1 of the view has no memory node of its own: all the kernel's
    assert got.cpuset.mems == "0"
    assert got.updates == {"c-other": CpuSet("0-1", "0")}
    assert admitted == ["g2"]
    assert placer.allocations["g2"].containers["main"].cpus == [2, 3]


def test_a_pod_that_cannot_be_aligned_is_rejected_for_every_container(pods: Pods) -> None:
    placer = EnginePlacer(MACHINE, pods, reserved_cpus=[0], memory_nodes=[0])
    pods.add("big", "3")  # 3 CPUs fit no single NUMA node
    with pytest.raises(Rejected, match="TopologyAffinityError"):
        placer.create(nri_pod("big"), nri_ctr("big", "main", "c-a"))
    with pytest.raises(Rejected, match="TopologyAffinityError"):  # nor a retry
        placer.create(nri_pod("big"), nri_ctr("big", "main", "c-b"))
    pods.add("huge", "5")  # more than the machine has: rejected as the kubelet rejects it
    with pytest.raises(Rejected) as huge:
        placer.create(nri_pod("huge"), nri_ctr("huge", "main", "c-h"))
    assert str(huge.value) == f"TopologyAffinityError: {REJECTED_PREFIX}{TOPOLOGY_MESSAGE}"
    assert placer.pool() == {0, 1, 2, 3} and placer.allocations == {}
    # each held once (the agent fails the pod the kubelet's way), with the kubelet's words
    assert {uid: reason for uid, (reason, _) in placer.rejected.items()} == {
        "big": "TopologyAffinityError", "huge": "TopologyAffinityError"}
    assert placer.rejected["big"][1] == REJECTED_PREFIX + TOPOLOGY_MESSAGE  # status message
    # best-effort across nodes, by override: the same request is admitted
    pods.add("spread", "3", policy="best-effort")
    got = placer.create(nri_pod("spread"), nri_ctr("spread", "main", "c-s"))
    assert got.cpuset is not None and len(parse_cpulist(got.cpuset.cpus)) == 3
    assert 0 not in parse_cpulist(got.cpuset.cpus)


def test_a_removed_pod_gives_its_cpus_back_to_the_shared_pool(pods: Pods) -> None:
    placer = EnginePlacer(MACHINE, pods, reserved_cpus=[0], memory_nodes=[0])
    placer.create(nri_pod("other"), nri_ctr("other", "c", "c-other"))
    pods.add("g1", "1")
    got = placer.create(nri_pod("g1"), nri_ctr("g1", "main", "c-g1"))
    assert got.cpuset is not None
    taken = parse_cpulist(got.cpuset.cpus)
    assert placer.released(nri_pod("g1"), nri_ctr("g1", "main", "c-g1")) == {}
    assert taken.isdisjoint(placer.pool())  # the pod still holds them
    assert placer.released(nri_pod("g1"), None) == {"c-other": CpuSet("0-3", "0")}
    assert placer.released(nri_pod("g1"), None) == {}


def recorded(view: PodView, allocation: Allocation) -> PodView:
    """``view`` with ``allocation`` written on its pod (``numalign.io/allocation``)."""
    pod = copy.deepcopy(dict(view.pod))
    pod["metadata"]["annotations"] = {ANN_ALLOCATION: allocation.to_annotation()}
    pod["status"] = {"phase": "Running"}
    return PodView(pod, view.policy)


def test_synchronize_rebuilds_from_recorded_allocations_without_double_allocation(
        pods: Pods) -> None:
    first = EnginePlacer(MACHINE, pods, reserved_cpus=[0], memory_nodes=[0])
    pods.add("g2", "2")
    first.create(nri_pod("g2"), nri_ctr("g2", "main", "c-g2"))
    alloc = first.allocations["g2"]
    pods.views["g2"] = recorded(pods.views["g2"], alloc)
    # a second pod claims the same CPUs in its record (it must not get them too)
    pods.add("dup", "2")
    pods.views["dup"] = recorded(pods.views["dup"], alloc)

    restarted = EnginePlacer(MACHINE, pods, reserved_cpus=[0], memory_nodes=[0])
    updates = restarted.synchronize(
        [nri_pod("g2"), nri_pod("dup"), nri_pod("other")],
        [nri_ctr("g2", "main", "c-g2"), nri_ctr("dup", "main", "c-dup"),
         nri_ctr("other", "c", "c-other")])
    assert set(restarted.allocations) == {"g2"}
    assert restarted.exclusive == {"c-g2": "g2"}
    assert restarted.pool() == {0, 1}
    # the shared containers get the pool; g2's container its recorded CPUs again (a
    # container the runtime created while the plugin was away gets them now)
    assert updates == {"c-dup": CpuSet("0-1", "0"), "c-other": CpuSet("0-1", "0"),
                       "c-g2": CpuSet("2-3", "0")}
    # a new pod gets what is left, not g2's CPUs
    pods.add("g1", "1")
    got = restarted.create(nri_pod("g1"), nri_ctr("g1", "main", "c-g1"))
    assert got.cpuset is not None and got.cpuset.cpus == "1"


def test_the_published_status_wins_over_a_forged_record(pods: Pods) -> None:
    """Finding 1: pods listed before the owner, their annotations rewritten to claim its
    CPUs, get nothing; the owner keeps them (its entry in the agent's published status)."""
    first = EnginePlacer(MACHINE, pods, reserved_cpus=[0], memory_nodes=[0])
    pods.add("g2", "2")
    first.create(nri_pod("g2"), nri_ctr("g2", "main", "c-g2"))
    owned = first.allocations["g2"]
    published = {"status": {"admitted": admitted_entries(first.state)}}
    # a BestEffort pod and a Guaranteed one, each claiming g2's CPUs; g2's own annotation
    # was rewritten to claim nothing
    pods.views["be"] = recorded(PodView(best_effort("be"), given(Resolved())), owned)
    pods.add("dup", "2")
    pods.views["dup"] = recorded(pods.views["dup"], owned)
    pods.views["g2"] = recorded(pods.views["g2"], Allocation())
    restarted = EnginePlacer(MACHINE, pods, reserved_cpus=[0], memory_nodes=[0])
    restarted.published = published
    restarted.synchronize([nri_pod("be"), nri_pod("dup"), nri_pod("g2")],
                          [nri_ctr("be", "c", "c-be"), nri_ctr("dup", "main", "c-dup"),
                           nri_ctr("g2", "main", "c-g2")])
    assert set(restarted.allocations) == {"g2"}
    assert restarted.allocations["g2"].cpus == owned.cpus == [2, 3]
    assert restarted.exclusive == {"c-g2": "g2"}
    assert restarted.shared == {"c-be": "be", "c-dup": "dup"}
    # without a published status, the BestEffort pod's claim is refused all the same
    pods.views["g2"] = recorded(pods.views["g2"], owned)
    alone = EnginePlacer(MACHINE, pods, reserved_cpus=[0], memory_nodes=[0])
    alone.synchronize([nri_pod("be"), nri_pod("g2")], [])
    assert set(alone.allocations) == {"g2"}


def test_synchronize_refuses_records_the_machine_cannot_hold(pods: Pods) -> None:
    """Finding 2: records that parse but name a memory zone "x", NUMA node -1 or 10^11 (or
    a zone of two nodes the engine cannot take) never stop Synchronize."""
    pods.add("good", "1")
    pods.views["good"] = recorded(pods.views["good"], parse_allocation(
        '{"numaNodes": [1], "containers": {"main": {"cpus": [3], "numaNodes": [1]}}}'))
    bad = {"x": '{"memory": {"x": 1024}}', "neg": '{"numaNodes": [-1]}',
           "big": '{"memoryNumaNodes": [100000000000]}', "two": '{"memory": {"0,1": 1024}}'}
    for uid, extra in bad.items():
        pods.add(uid, "1")
        pod = copy.deepcopy(dict(pods.views[uid].pod))
        pod["metadata"]["annotations"] = {ANN_ALLOCATION: (
            '{"numaNodes": [0], "containers": {"main": {"cpus": [2], ' + extra[1:] + "}}")}
        pod["status"] = {"phase": "Running"}
        pods.views[uid] = PodView(pod, pods.views[uid].policy)
    placer = EnginePlacer(MACHINE, pods, reserved_cpus=[0], memory_nodes=[0])
    updates = placer.synchronize([nri_pod(u) for u in [*bad, "good"]],
                                 [nri_ctr(u, "main", f"c-{u}") for u in [*bad, "good"]])
    assert set(placer.allocations) == {"good"}
    assert updates["c-good"] == CpuSet("3", "0")
    assert {updates[f"c-{u}"] for u in bad} == {CpuSet("0-2", "0")}  # the shared pool
    # and the next pod is decided as usual
    pods.add("next", "1")
    got = placer.create(nri_pod("next"), nri_ctr("next", "main", "c-next"))
    assert got.cpuset is not None and got.cpuset.cpus in ("1", "2")


def test_kernel_memory_nodes_and_cpulists(tmp_path: Path) -> None:
    node = tmp_path / "devices" / "system" / "node"
    node.mkdir(parents=True)
    (node / "online").write_text("0-1\n")
    assert kernel_memory_nodes(tmp_path) == {0, 1}
    (node / "has_memory").write_text("0\n")
    assert kernel_memory_nodes(tmp_path) == {0}
    assert cpulist([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert parse_cpulist("0-2,5") == {0, 1, 2, 5}
    with pytest.raises(ValueError, match=r"^cpuset\.cpus: bad cpu 'x' in 'x'$"):
        parse_cpulist("x", "cpuset.cpus")
    with pytest.raises(ValueError, match=r"^has_memory: cpu '99999999' is beyond the kernel"):
        parse_cpulist("0-99999999", "has_memory")  # bounded: never a set of 10^8 ids


def test_bad_configuration_names_the_field(pods: Pods) -> None:
    with pytest.raises(ValueError, match="reserved_cpus: 9 not in machine view-2x2"):
        EnginePlacer(MACHINE, pods, reserved_cpus=[9])
    with pytest.raises(ValueError, match="memory_nodes"):
        EnginePlacer(MACHINE, pods, memory_nodes=[])
