"""One node state per real node: on a numalign-managed node the NRI placer decides in the
agent's own NodeState, so its /metrics (admission and pinning requests under the pod's
policy, the shared pool), its NodeTopology status and what a restarted agent restores all
show the placer's decisions."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent_helpers import given
from numalign.agent import metrics
from numalign.agent.node import NodeAgent
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api.names import ANN_RESOLVED, LABEL_MANAGED, MANAGED_NRI, REJECT_REASON
from numalign.nriapi.v1alpha1 import api_pb2
from numalign.topology.machine import machine_from_dict

NODE = "n"
SNN = "single-numa-node"
# 2 NUMA nodes of 2 CPUs
MACHINE = machine_from_dict({
    "name": "2x2",
    "numaNodes": [{"id": 0, "cpus": "0-1", "memory": "4Gi"},
                  {"id": 1, "cpus": "2-3", "memory": "4Gi"}],
})

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class RecordingKube:
    """Answers the agent's writes (the pods' allocation records) and keeps them."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, Any]] = []

    async def patch(self, path: str, body: Any, *_a: Any, **_k: Any) -> None:
        self.writes.append((path, body))

    async def create(self, path: str, body: Any, *_a: Any, **_k: Any) -> None:
        self.writes.append((path, body))


def k8s_pod(uid: str, cpu: str, policy: str | None = SNN, phase: str = "Pending"
            ) -> dict[str, Any]:
    res = {"cpu": cpu, "memory": "64Mi"}
    ann = {ANN_RESOLVED: json.dumps({"policy": policy, "scope": "container",
                                     "source": "pod"})} if policy else {}
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid, "annotations": ann},
            "spec": {"nodeName": NODE,
                     "containers": [{"name": "main",
                                     "resources": {"requests": res, "limits": res}}]},
            "status": {"phase": phase}}


def nri_pod(uid: str) -> Any:
    return api_pb2.PodSandbox(id=f"sb-{uid}", uid=uid, name=uid, namespace="ns")


def nri_ctr(uid: str) -> Any:
    return api_pb2.Container(id=f"{uid}-main", pod_sandbox_id=f"sb-{uid}", name="main")


def managed_agent() -> NodeAgent:
    agent = NodeAgent(RecordingKube(), NODE, MACHINE,  # type: ignore[arg-type]
                      nri_socket="nri.sock", debounce=0.0)
    assert agent.managed is not None
    agent.managed.on_node({"metadata": {"labels": {LABEL_MANAGED: MANAGED_NRI}}})
    agent.on_nodetopology("MODIFIED", {"spec": {"policy": "none"}})
    return agent


async def place(agent: NodeAgent, pod: dict[str, Any]) -> None:
    """The runtime creates the pod's container: the plugin asks numalign."""
    assert agent.managed is not None
    agent.on_pod("ADDED", pod)
    uid = pod["metadata"]["uid"]
    await agent.managed.prepare(nri_pod(uid))
    if uid not in agent.managed.placer.rejected:
        agent.managed.create(nri_pod(uid), nri_ctr(uid))


def scrape(agent: NodeAgent) -> Samples:
    registry = CollectorRegistry()
    metrics.register(lambda: list(agent.states.values()), registry)
    out: Samples = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def get(got: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset({"node": NODE, **labels}.items()))
    assert key in got, f"{name}{labels} not exported"
    return got[key]


async def test_the_placers_decisions_are_the_agents_metrics_and_status() -> None:
    agent = managed_agent()
    assert agent.managed is not None
    assert agent.managed.placer.state is agent.state
    await agent.refresh()
    got = scrape(agent)
    assert get(got, "numalign_agent_node_info", mode="nri") == 1
    assert get(got, "numalign_cpu_manager_shared_pool_size_millicores") == 4000

    # Guaranteed 1 CPU under single-numa-node, Guaranteed 2 CPUs under the node default
    # (none), a Burstable pod (shares the pool), and 3 CPUs no NUMA node has
    await place(agent, k8s_pod("one", "1"))
    await place(agent, k8s_pod("two", "2", policy=None))
    await place(agent, dict(k8s_pod("burst", "500m"), spec={
        "nodeName": NODE, "containers": [{"name": "main", "resources": {
            "requests": {"cpu": "500m"}}}]}))
    await place(agent, k8s_pod("big", "3"))
    await agent.refresh()

    got = scrape(agent)
    assert get(got, "numalign_topology_manager_admission_requests_total", policy=SNN) == 3
    assert get(got, "numalign_topology_manager_admission_errors_total", policy=SNN) == 1
    assert get(got, "numalign_topology_manager_admission_requests_total", policy="none") == 1
    # the 3-CPU pod's hint is refused before any CPU is pinned (as the kubelet counts)
    assert get(got, "numalign_cpu_manager_pinning_requests_total", policy=SNN) == 1
    assert get(got, "numalign_cpu_manager_pinning_requests_total", policy="none") == 1
    assert get(got, "numalign_cpu_manager_exclusive_cpu_allocation_count", policy=SNN) == 1
    assert get(got, "numalign_cpu_manager_exclusive_cpu_allocation_count",
               policy="none") == 2
    # 4 CPUs, 3 held exclusively: one left to share
    assert get(got, "numalign_cpu_manager_shared_pool_size_millicores") == 1000
    one = set(agent.managed.placer.allocations["one"].cpus)

    # the status the agent publishes: the pods numalign placed, the one it rejected
    status = build_status(agent.state)
    admitted = {e["pod"]: e for e in status["admitted"]}
    assert set(admitted) == {"one", "two", "burst"}
    assert admitted["one"]["policy"] == SNN and admitted["two"]["policy"] == "none"
    assert status["rejected"] == 1 and agent.state.rejections["big"][0] == REJECT_REASON

    # deleted: its CPU goes back to the shared pool the metrics show
    agent.on_pod("DELETED", k8s_pod("one", "1", phase="Running"))
    await agent.refresh()
    got = scrape(agent)
    assert get(got, "numalign_cpu_manager_shared_pool_size_millicores") == 2000
    assert get(got, "numalign_cpu_manager_exclusive_cpu_allocation_count", policy=SNN) == 0
    assert "one" not in {e["pod"] for e in build_status(agent.state)["admitted"]}
    assert one.isdisjoint(agent.managed.placer.allocations["two"].cpus)


async def test_a_restarted_agent_restores_into_its_one_state() -> None:
    first = managed_agent()
    await place(first, k8s_pod("one", "1"))
    await place(first, k8s_pod("two", "2", policy=None))
    await first.refresh()
    assert first.managed is not None
    placed = {u: list(a.cpus) for u, a in first.managed.placer.allocations.items()}
    published = {"spec": {"policy": "none"}, "status": build_status(first.state)}

    again = managed_agent()
    assert again.managed is not None
    again.state.restore(published, [])
    again.managed.on_published(published)
    await again.refresh()
    # before the runtime is read: what it published, its CPUs held (not in the pool)
    got = scrape(again)
    assert get(got, "numalign_cpu_manager_shared_pool_size_millicores") == 1000
    assert get(got, "numalign_cpu_manager_exclusive_cpu_allocation_count", policy=SNN) == 1
    assert {e["pod"] for e in build_status(again.state)["admitted"]} == {"one", "two"}

    # the runtime still runs "one" only: the state rebuilt from it is the agent's
    running = k8s_pod("one", "1", phase="Running")
    again.on_pod("ADDED", running)
    again.managed.synchronize([nri_pod("one")], [nri_ctr("one")])
    await again.refresh()
    assert again.managed.placer.state is again.state
    assert {u: list(h.allocation.cpus) for u, h in again.state.admitted.items()} == {
        "one": placed["one"]}
    got = scrape(again)
    assert get(got, "numalign_cpu_manager_shared_pool_size_millicores") == 3000
    # a new pod is decided in that state, next to what was restored
    await place(again, k8s_pod("three", "1"))
    await again.refresh()
    got = scrape(again)
    assert get(got, "numalign_topology_manager_admission_requests_total", policy=SNN) == 1
    assert get(got, "numalign_cpu_manager_shared_pool_size_millicores") == 2000
    three = again.managed.placer.allocations["three"].cpus
    assert set(three).isdisjoint(placed["one"])


def test_a_placer_given_the_nodes_state_decides_in_it() -> None:
    from numalign.agent.nri.placer import EnginePlacer, PodView
    from numalign.api.resolved import Resolved

    state = NodeState(NODE, MACHINE, admits=False)
    pods = {"p": PodView(k8s_pod("p", "2"), given(Resolved(SNN, "container")))}
    placer = EnginePlacer(MACHINE, pods.get, reserved_cpus=[0], memory_nodes=[0],
                          state=state)
    assert placer.decide("p") is True
    assert state.admitted["p"].allocation.cpus == [2, 3]
    assert state.counts[SNN].admission_requests == 1
    assert len(state.ledger.free_cpus()) == 1  # CPU 0 reserved, 2-3 taken
    # the agent's pod watch, not the decision, says which pods left Pending
    assert "p" not in state.pods


def test_the_kubelets_answer_keeps_the_placers_decisions() -> None:
    """On a numalign-managed node the kubelet's PodResources answer gives the node its
    devices and allocatable, never its pods (its managers are none): the placer's decisions
    stay, and their CPUs stay held on the kubelet's machine."""
    from numalign.agent.kubelet_view import apply_snapshot
    from numalign.agent.nri.placer import EnginePlacer, PodView
    from numalign.agent.podresources import (
        Allocatable,
        DeviceSet,
        KubeletContainer,
        KubeletPod,
        Snapshot,
    )
    from numalign.api.resolved import Resolved

    state = NodeState(NODE, MACHINE, admits=False)
    pods = {"p": PodView(k8s_pod("p", "2"), given(Resolved(SNN, "container"))),
            "q": PodView(k8s_pod("q", "3"), given(Resolved(SNN, "container")))}
    placer = EnginePlacer(MACHINE, pods.get, memory_nodes=[0], state=state)
    assert placer.decide("p") is True and placer.decide("q") is False
    held = set(state.admitted["p"].allocation.cpus)
    nic = DeviceSet("example.com/nic", ("nic-1",), (1,))
    kubelets = KubeletPod("ns", "p", (KubeletContainer("main", cpus=()),))
    assert apply_snapshot(state, MACHINE, Snapshot([kubelets], Allocatable((), (nic,))), None,
                          {("ns", "p"): "p"}, managed=True)
    assert [d.id for d in state.machine.devices] == ["nic-1"]
    assert set(state.admitted) == {"p"} and state.decided == {"p": True, "q": False}
    assert state.admitted["p"].allocation.cpus and set(state.ledger.free_cpus()) == (
        set(MACHINE.cpus) - held)
    assert state.ledger.free_devices("example.com/nic") == ["nic-1"]
