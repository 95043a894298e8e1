"""An emulated node refuses a pod as the kubelet does when its requests do not fit what
the node has left (resource fit after the Topology Manager), keeps each container's
memory NUMA nodes in the allocation annotation, and counts restored pods' requests."""

from __future__ import annotations

import json
from typing import Any

import testdata
from agent_helpers import given
from numalign.agent.kubelet_status import pod_event, rejected_status
from numalign.agent.state import NodeState
from numalign.api.allocation import parse_allocation
from numalign.api.names import ANN_ALLOCATION
from numalign.api.resolved import Resolved
from numalign.topology.hints import mask_of
from numalign.topology.machine import load_machine

SNN = Resolved("single-numa-node", "container", {}, "node")


def _state() -> NodeState:
    return NodeState("seed-figure1-0", load_machine(testdata.MACHINES / "seed-figure1.yaml"))


def _pod(name: str, cpu: str, memory: str = "1Gi", *, init: bool = False,
         phase: str | None = None, alloc: str | None = None) -> dict[str, Any]:
    res = {"cpu": cpu, "memory": memory}
    spec: dict[str, Any] = {"nodeName": "seed-figure1-0", "containers": [
        {"name": "app", "image": "pause", "resources": {"requests": res, "limits": res}}]}
    if init:
        spec["initContainers"] = [{"name": "setup", "image": "pause",
                                   "resources": {"requests": res, "limits": res}}]
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if alloc is not None:
        meta["annotations"] = {ANN_ALLOCATION: alloc}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase} if phase else {}}


def test_out_of_cpu_is_failed_with_the_kubelets_reason_message_and_event() -> None:
    st = _state()
    assert st.decide(_pod("a", "3500m"), given(SNN)).admit
    assert st.decide(_pod("b", "3500m"), given(SNN)).admit
    third = _pod("c", "2")
    d = st.decide(third, given(SNN))
    assert not d.admit and d.reason == "OutOfcpu"
    assert d.message == ("Node didn't have enough resource: cpu, requested: 2000, used: 7000, "
                         "capacity: 8000")
    assert "uid-c" not in st.ledger.pods and st.rejected_total == 0
    status = rejected_status(third, d.reason, d.message)
    assert status["phase"] == "Failed" and status["reason"] == "OutOfcpu"
    assert status["message"] == "Pod was rejected: " + d.message
    event = pod_event(third, st.name, "Warning", d.reason, d.message)
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "OutOfcpu",
                                                                  d.message)


def test_a_pod_bigger_than_the_machine_is_refused_not_an_error() -> None:
    st = _state()
    d = st.decide(_pod("huge", "64"), given(Resolved("best-effort", "container", {}, "node")))
    assert not d.admit and d.reason == "UnexpectedAdmissionError"
    assert not st.ledger.pods


def test_restored_pods_count_in_the_fit_check() -> None:
    first = _state()
    running = []
    for name in ("a", "b"):
        pod = _pod(name, "3500m")
        d = first.decide(pod, given(SNN))
        assert d.admit and d.allocation is not None
        running.append(_pod(name, "3500m", phase="Running",
                            alloc=d.allocation.to_annotation()))
    st = _state()
    report = st.restore(None, running)
    assert sorted(report.restored) == ["uid-a", "uid-b"]
    d = st.decide(_pod("c", "2"), given(SNN))
    assert not d.admit and d.reason == "OutOfcpu"


def test_memory_numa_nodes_of_a_container_reusing_its_init_containers_memory() -> None:
    st = _state()
    d = st.decide(_pod("p", "1", init=True), given(SNN))
    assert d.admit and d.allocation is not None
    app = d.allocation.containers["app"]
    # the app container took no new bytes (it reuses the init container's block) but its
    # memory may use NUMA node 0, as the memory manager's state says
    assert app.memory == {} and app.memory_numa_nodes == [0]
    assert d.allocation.containers["setup"].memory_numa_nodes == [0]
    ann = d.allocation.to_annotation()
    assert json.loads(ann)["containers"]["app"]["memoryNumaNodes"] == [0]
    assert parse_allocation(ann).containers["app"].memory_numa_nodes == [0]
    restored = _state()
    restored.restore(None, [_pod("p", "1", init=True, phase="Running", alloc=ann)])
    held = restored.ledger.pods["uid-p"].containers["app"]
    assert held.memory_mask == mask_of([0])
    assert restored.ledger.to_json()["pods"][0]["containers"] == \
        st.ledger.to_json()["pods"][0]["containers"]
