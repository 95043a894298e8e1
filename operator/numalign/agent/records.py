"""Which recorded allocations the agent believes after a restart (pure).

The agent's own published status (``NodeTopology.status.admitted``) is what it decided; a
pod's ``numalign.io/allocation`` annotation is only a claim (anyone who may patch the pod
may write it). A claim is believed only when it is what the kubelet's static CPU policy
could have given the pod (:func:`claim_problem`); and whatever is put back, the machine may
lack part of it now (devices whose plugin has not registered again: :func:`known_part`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from decimal import Decimal
from typing import Any

from numalign.api.allocation import Allocation, ContainerRecord
from numalign.topology.demands import guaranteed_cpus
from numalign.topology.errors import TopologyError
from numalign.topology.machine import Machine
from numalign.topology.pod import QOS_GUARANTEED, pod_from_dict


def _quantity(q: Decimal) -> str:
    return str(int(q)) if q == q.to_integral_value() else f"{int(q * 1000)}m"


def _zone_ids(ca: ContainerRecord) -> Iterable[int]:
    yield from ca.numa_nodes or ()
    yield from ca.memory_numa_nodes or ()
    for zone in [*ca.memory, *(z for per in ca.hugepages.values() for z in per)]:
        yield from (int(p) for p in zone.split(","))


def claim_problem(machine: Machine, pod: Mapping[str, Any], alloc: Allocation) -> str | None:
    """Why a pod's own record of its allocation cannot be believed (None: it can): the pod
    is not Guaranteed yet claims exclusive CPUs, a container claims other than its integer
    CPU request (a plain init container, whose CPUs its app containers reuse: more), or
    more devices than it requests, a container the pod lacks, or a NUMA node the machine
    lacks."""
    try:
        model = pod_from_dict(pod)
    except TopologyError as e:
        return f"the pod cannot be read: {e}"
    numa = set(machine.numa_ids)
    missing = sorted(set(alloc.numa_nodes) - numa)
    if missing:
        return f"numaNodes: NUMA node {missing[0]} is not on this machine"
    for name, ca in alloc.containers.items():
        try:
            c = model.container(name)
        except KeyError:
            return f"container {name}: no such container in the pod"
        missing = sorted(set(_zone_ids(ca)) - numa)
        if missing:
            return f"container {name}: NUMA node {missing[0]} is not on this machine"
        cpus = len(set(ca.cpus))
        if cpus and model.qos != QOS_GUARANTEED:
            return f"container {name}: exclusive CPUs for a {model.qos} pod"
        want = guaranteed_cpus(model, c)
        if cpus > want or (cpus < want and not c.is_init):
            return (f"container {name}: {cpus} exclusive CPUs, but it requests "
                    f"{_quantity(c.request('cpu'))}")
        for res, ids in ca.devices.items():
            asked = c.request(res)
            if len(set(ids)) > asked:
                return (f"container {name}: {len(ids)} devices of {res}, but it requests "
                        f"{_quantity(asked)}")
    return None


def known_part(machine: Machine, alloc: Allocation) -> Allocation:
    """``alloc`` without the devices ``machine`` does not have (now)."""
    have: dict[str, set[str]] = {}
    containers = {}
    for name, ca in alloc.containers.items():
        devices = {}
        for res, ids in ca.devices.items():
            known = have.setdefault(res, {d.id for d in machine.devices_of(res)})
            kept = [i for i in ids if i in known]
            if kept:
                devices[res] = kept
        containers[name] = replace(ca, devices=devices)
    return replace(alloc, containers=containers)


def cpus_only(alloc: Allocation) -> Allocation:
    """Only the exclusive CPUs of ``alloc`` (what must never be given twice)."""
    return Allocation(numa_nodes=list(alloc.numa_nodes), containers={
        name: ContainerRecord(cpus=list(ca.cpus), numa_nodes=ca.numa_nodes)
        for name, ca in alloc.containers.items()})
