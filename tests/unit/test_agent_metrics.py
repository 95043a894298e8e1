"""The kubelet's manager metrics as the agent exports them: a known pod sequence through a
node's decisions, then every counter and gauge read back from the /metrics text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent_helpers import given
from numalign.agent import metrics
from numalign.agent.managerstats import DURATION_BUCKETS
from numalign.agent.state import NodeState
from numalign.api.resolved import Resolved
from numalign.topology.ledger import ContainerAllocation
from numalign.topology.machine import load_machine

SNN, BE, NONE = "single-numa-node", "best-effort", "none"
NODE = "m-0"

MACHINE = """\
name: m
numaNodes:
  - {id: 0, cpus: "0-3", memory: 4Gi}
  - {id: 1, cpus: "4-7", memory: 4Gi}
distances: [[10, 20], [20, 10]]
"""


def _container(name: str, cpu: str, memory: str | None = "256Mi",
               guaranteed: bool = True) -> dict[str, Any]:
    req: dict[str, str] = {"cpu": cpu}
    if memory is not None:
        req["memory"] = memory
    res: dict[str, Any] = {"requests": req}
    if guaranteed:
        res["limits"] = dict(req)
    return {"name": name, "image": "pause", "resources": res}


def _pod(name: str, containers: list[dict[str, Any]],
         init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": NODE, "containers": containers}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": spec, "status": {"phase": "Pending"}}


@pytest.fixture
def node(tmp_path: Path) -> NodeState:
    path = tmp_path / "m.yaml"
    path.write_text(MACHINE)
    return NodeState(NODE, load_machine(path))


def _scrape(states: list[NodeState]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    registry = CollectorRegistry()
    metrics.register(lambda: states, registry)
    text = generate_latest(registry).decode()
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _get(got: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
         **labels: str) -> float:
    key = (name, frozenset({"node": NODE, **labels}.items()))
    assert key in got, f"{name}{labels} not exported"
    return got[key]


def test_known_pod_sequence_counts(node: NodeState) -> None:
    snn_c, snn_p = Resolved(SNN, "container"), Resolved(SNN, "pod")
    sequence: list[tuple[dict[str, Any], Resolved, bool]] = [
        # Burstable: admitted, aligned (single-numa-node counts every container), no pinning
        (_pod("burst", [_container("a", "500m", guaranteed=False)]), snn_c, True),
        # init 1 CPU then app 2 CPUs on one NUMA node: two aligned containers, two pinned
        (_pod("gu2", [_container("app", "2")], [_container("init", "1")]), snn_c, True),
        # 5 CPUs fit no NUMA node: the hint is refused before anything is allocated
        (_pod("big", [_container("a", "5")]), snn_c, False),
        # pod scope: one aligned pod, both containers pinned
        (_pod("pod", [_container("a", "1"), _container("b", "1")]), snn_p, True),
        # pod scope, 6 CPUs: the pod's hint is refused
        (_pod("podbig", [_container("a", "3"), _container("b", "3")]), snn_p, False),
        # best-effort: admitted, pinned, not counted as aligned
        (_pod("be", [_container("a", "1")]), Resolved(BE, "container"), True),
        # policy none, 10 CPUs: the CPU manager cannot pin (UnexpectedAdmissionError)
        (_pod("cpufail", [_container("a", "10")]), Resolved(NONE, "container"), False),
        # policy none, 9Gi: the CPU is pinned, the memory manager fails
        (_pod("memfail", [_container("a", "1", "9Gi")]), Resolved(NONE, "container"), False),
    ]
    for pod, resolved, admit in sequence:
        assert node.decide(pod, given(resolved)).admit is admit, pod["metadata"]["name"]
    node.decide(sequence[1][0], given(snn_c))  # decided already: not admitted again
    got = _scrape([node])

    def per_policy(name: str) -> dict[str, float]:
        return {p: _get(got, name, policy=p) for p in (SNN, BE, NONE)}

    assert per_policy("numalign_topology_manager_admission_requests_total") == {
        SNN: 5, BE: 1, NONE: 2}
    assert per_policy("numalign_topology_manager_admission_errors_total") == {
        SNN: 2, BE: 0, NONE: 2}
    assert per_policy("numalign_cpu_manager_pinning_requests_total") == {
        SNN: 4, BE: 1, NONE: 2}
    assert per_policy("numalign_cpu_manager_pinning_errors_total") == {SNN: 0, BE: 0, NONE: 1}
    assert per_policy("numalign_memory_manager_pinning_requests_total") == {
        SNN: 4, BE: 1, NONE: 1}
    assert per_policy("numalign_memory_manager_pinning_errors_total") == {
        SNN: 0, BE: 0, NONE: 1}
    aligned = "numalign_container_aligned_compute_resources_count"
    failed = "numalign_container_aligned_compute_resources_failure_count"
    for name, want in ((aligned, {"container": 3, "pod": 1}),
                       (failed, {"container": 1, "pod": 1})):
        for scope, n in want.items():
            assert _get(got, name, policy=SNN, scope=scope, boundary="numa_node") == n
            assert _get(got, name, policy=BE, scope=scope, boundary="numa_node") == 0
    hist = "numalign_topology_manager_admission_duration_seconds"
    assert _get(got, hist + "_count", policy=SNN) == 5
    assert _get(got, hist + "_bucket", policy=SNN, le="+Inf") == 5
    assert _get(got, hist + "_sum", policy=SNN) > 0
    # the kubelet's millisecond buckets, in seconds
    assert {k[1] for k in got if k[0] == hist + "_bucket"} >= {
        frozenset({"node": NODE, "policy": SNN, "le": repr(b)}.items())
        for b in DURATION_BUCKETS}

    # gauges: gu2 holds 2 CPUs (its init container's is reused), pod 2, be 1
    excl = "numalign_cpu_manager_exclusive_cpu_allocation_count"
    assert _get(got, excl, policy=SNN) == 4 and _get(got, excl, policy=BE) == 1
    assert _get(got, excl, policy=NONE) == 0
    assert _get(got, "numalign_cpu_manager_shared_pool_size_millicores") == 3000
    per_numa = "numalign_cpu_manager_allocation_per_numa"
    assert [_get(got, per_numa, policy=SNN, numa_node=str(n)) for n in (0, 1)] == [4, 0]
    assert [_get(got, per_numa, policy=BE, numa_node=str(n)) for n in (0, 1)] == [0, 1]

    assert node.release("uid-gu2")
    got = _scrape([node])
    assert _get(got, excl, policy=SNN) == 2
    assert _get(got, "numalign_cpu_manager_shared_pool_size_millicores") == 5000
    assert [_get(got, per_numa, policy=SNN, numa_node=str(n)) for n in (0, 1)] == [2, 0]
    # counters do not go back
    assert _get(got, "numalign_topology_manager_admission_requests_total", policy=SNN) == 5


def test_reserved_cpus_are_neither_exclusive_nor_shared(node: NodeState) -> None:
    """CPUs the ledger holds for no pod (the kubelet's reservedSystemCPUs, as a managed
    node holds them) count as the kubelet counts them: in neither gauge."""
    node.ledger.allocate("reserved", "reserved", ContainerAllocation(cpus=(0,)),
                         pod_name="reserved", namespace="")
    node.decide(_pod("one", [_container("a", "1")]), given(Resolved(NONE, "container")))
    got = _scrape([node])
    assert _get(got, "numalign_cpu_manager_exclusive_cpu_allocation_count", policy=NONE) == 1
    assert _get(got, "numalign_cpu_manager_shared_pool_size_millicores") == 6000


def test_unreadable_pod_is_an_admission_error(node: NodeState) -> None:
    pod = _pod("bad", [_container("a", "1")])
    pod["metadata"]["annotations"] = {"numalign.io/gpus": "{not json"}
    assert not node.decide(pod, given(Resolved(SNN, "container"))).admit
    got = _scrape([node])
    assert _get(got, "numalign_topology_manager_admission_requests_total", policy=SNN) == 1
    assert _get(got, "numalign_topology_manager_admission_errors_total", policy=SNN) == 1
    assert _get(got, "numalign_cpu_manager_pinning_requests_total", policy=SNN) == 0


def test_nodes_are_separated_and_kubelet_managed_nodes_left_out(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(MACHINE)
    machine = load_machine(path)
    a, b = NodeState("m-0", machine), NodeState("m-1", machine)
    kubelet_managed = NodeState("real", machine, admits=False)
    a.decide(_pod("x", [_container("a", "1")]), given(Resolved(NONE, "container")))
    got = _scrape([a, b, kubelet_managed])
    req = "numalign_topology_manager_admission_requests_total"
    assert got[(req, frozenset({"node": "m-0", "policy": NONE}.items()))] == 1
    # a node's default policy is exported from the start, at zero
    assert got[(req, frozenset({"node": "m-1", "policy": NONE}.items()))] == 0
    # a kubelet-managed node: only that its agent publishes it (the kubelet counts)
    assert {n for n, labels in got if dict(labels).get("node") == "real"} == {
        "numalign_agent_node_info", "numalign_agent_node_ready"}
    assert got[("numalign_agent_node_info",
                frozenset({"node": "real", "mode": "kubelet"}.items()))] == 1
    assert got[("numalign_agent_node_info",
                frozenset({"node": "m-1", "mode": "emulated"}.items()))] == 1
    kubelet_managed.ready = False
    got = _scrape([kubelet_managed])
    assert got[("numalign_agent_node_ready", frozenset({"node": "real"}.items()))] == 0
