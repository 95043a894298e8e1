"""The CPU topology a NodeTopology status publishes rebuilds ``Machine.cpus`` exactly
(core, socket and NUMA node of every CPU), so ``numalign explain`` replays CPU picks."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

import testdata
from agent_helpers import given
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api import NodeTopologyStatus
from numalign.api.nodestatus import held_from_admitted, ledger_from_held, machine_from_status
from numalign.api.resolved import Resolved
from numalign.topology.cputopo import cpu_topology_json, cpus_from_topology
from numalign.topology.machine import CPU, Machine, load_machine

MACHINES = testdata.MACHINES


def _round_trip(machine: Machine) -> Machine:
    status = build_status(NodeState("n", machine))
    NodeTopologyStatus.model_validate(status)  # what the CRD schema takes
    return machine_from_status(status, name="n")


@pytest.mark.parametrize("name", ["dgx-a100-like", "dgx1-like", "seed-figure1", "wide64"])
def test_fixture_machines_round_trip(name: str) -> None:
    machine = load_machine(MACHINES / f"{name}.yaml")
    back = _round_trip(machine)
    assert dict(back.cpus) == dict(machine.cpus)
    assert back.numa_ids == machine.numa_ids
    assert back.devices == machine.devices


def test_smt_machine_publishes_only_threads_and_sockets() -> None:
    topo = cpu_topology_json(load_machine(MACHINES / "dgx-a100-like.yaml"))
    assert topo == {"threadsPerCore": 2,
                    "sockets": [{"id": 0, "numaNodes": [0, 1, 2, 3]},
                                {"id": 1, "numaNodes": [4, 5, 6, 7]}]}


def test_irregular_cores_and_split_sockets_round_trip() -> None:
    base = load_machine(MACHINES / "dgx1-like.yaml")
    cpus = sorted(base.cpus)
    # Cores numbered sparsely with adjacent siblings, and NUMA node 0 split over 2 sockets.
    odd = {c: CPU(id=c, core=1000 + 7 * (i // 2), socket=(i % 3 == 0) + 2 * base.cpus[c].numa,
                  numa=base.cpus[c].numa) for i, c in enumerate(cpus)}
    machine = replace(base, cpus=odd)
    topo = cpu_topology_json(machine)
    assert "siblings" in topo and "coreIds" in topo
    assert all("cpus" in s for s in topo["sockets"])
    assert dict(_round_trip(machine).cpus) == odd


def test_status_without_cpu_topology_keeps_the_old_default() -> None:
    machine = load_machine(MACHINES / "dgx-a100-like.yaml")
    status = build_status(NodeState("n", machine))
    del status["cpuTopology"]
    back = machine_from_status(status)
    assert all(c.core == c.id and c.socket == c.numa for c in back.cpus.values())
    numa_of = {c.id: c.numa for c in machine.cpus.values()}
    assert cpus_from_topology(numa_of, None) == dict(back.cpus)


def _hugepage_pod(name: str, uid: str) -> dict[str, Any]:
    res = {"cpu": "4", "memory": "1Gi", "hugepages-1Gi": "2Gi"}
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": "main", "resources": {"requests": res,
                                                                   "limits": res}}]}}


def test_admitted_entry_has_options_and_container_hugepages() -> None:
    machine = load_machine(MACHINES / "dgx-a100-like.yaml")
    st = NodeState("n", machine)
    resolved = Resolved("restricted", "pod", {"prefer-closest-numa-nodes": "true"},
                        "TopologyPolicy/p")
    pod = _hugepage_pod("a", "u1")
    assert st.decide(pod, given(resolved)).admit
    status = build_status(st)
    NodeTopologyStatus.model_validate(status)
    (entry,) = status["admitted"]
    assert entry["options"] == {"preferClosestNumaNodes": True}
    (c,) = entry["containers"]
    zone = str(entry["numaNodes"][0])
    assert c["hugepages"] == {"1Gi": {zone: 2 << 30}}

    # A restarted agent gets the same allocation and options back from the status alone.
    again = NodeState("n", machine)
    running = {**pod, "status": {"phase": "Running"}}
    report = again.restore({"status": status}, [running])
    assert report.restored == ["u1"]
    held = again.admitted["u1"]
    assert held.resolved == resolved
    assert held.allocation.containers["main"].hugepages == {"1Gi": {zone: 2 << 30}}

    # The live explain replay holds the same hugepages.
    ledger, notes = ledger_from_held(machine_from_status(status),
                                     [held_from_admitted(entry, "entry")])
    assert not notes
    (held_c,) = (a for _, a in ledger.pods["u1"].containers.items())
    assert held_c.memory["hugepages-1Gi"] == {int(zone): 2 << 30}
