"""NodeTopology status: what the agent publishes about its node, built as the API's own
model (:class:`~numalign.api.nodetopology.NodeTopologyStatus`, the model the CRD's schema
is generated from) and serialized from it (:func:`status_json`).

The write cost matters (an agent rebuilds a node's status for every write): the parts that
only depend on the machine (devices, CPU topology, distances) are built once per machine;
the zones and the admitted pods, which come from the machine and the node's own ledger,
are put together without validation (``model_construct``), each admitted pod's entry once
(while its allocation stands); the rest (conditions, summary, the kubelet's settings) is
validated."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from pydantic import ValidationError

from numalign.api.allocation import Allocation
from numalign.api.common import Condition, ConditionStatus, Model, TopologyOptions
from numalign.api.effective import NodeKind
from numalign.api.nodetopology import (
    NRI_PLACEMENT,
    POLICY_APPLIED,
    READY,
    AdmittedContainer,
    AdmittedPod,
    CpuTopology,
    Device,
    DeviceGroup,
    DraDevice,
    KubeletSettings,
    NodeTopologyStatus,
    NodeTopologySummary,
    UnalignedDraDevice,
    Zone,
)
from numalign.api.reads import NodeTopologyStatusRead
from numalign.api.resolved import Resolved
from numalign.topology.cputopo import cpu_topology_json
from numalign.topology.machine import Machine
from numalign.topology.quantity import format_bytes, format_cpulist

from . import kubelet_status
from .state import NodeState, PlacedPod

JSON = dict[str, Any]
M = TypeVar("M", bound=Model)


def zone_capacity(machine: Machine) -> dict[int, dict[str, int]]:
    """Per NUMA node: cpu count, memory and hugepages bytes, device counts."""
    out: dict[int, dict[str, int]] = {}
    for n in machine.numa_nodes:
        res: dict[str, int] = {"cpu": len(n.cpus), "memory": n.memory}
        for size, total in sorted(n.hugepages.items()):
            res[f"hugepages-{size}"] = total
        out[n.id] = res
    for d in machine.devices:
        if d.numa_node is not None:
            zone = out[d.numa_node]
            zone[d.resource] = zone.get(d.resource, 0) + 1
    return out


def zone_used(state: NodeState) -> dict[int, dict[str, int]]:
    """Per NUMA node: exclusive CPUs, memory (by kind) and devices held by admitted pods."""
    m = state.machine
    cpu_numa = {c.id: c.numa for c in m.cpus.values()}
    dev_numa = {(d.resource, d.id): d.numa_node for d in m.devices}
    used: dict[int, dict[str, int]] = {n.id: {} for n in m.numa_nodes}
    for held in state.admitted.values():
        for ca in held.allocation.containers.values():
            for c in ca.cpus:
                z = cpu_numa.get(c)
                if z is not None:
                    used[z]["cpu"] = used[z].get("cpu", 0) + 1
            for zone, b in ca.memory.items():
                if zone.isdigit() and int(zone) in used:
                    u = used[int(zone)]
                    u["memory"] = u.get("memory", 0) + b
            for kind, per_zone in ca.hugepages.items():
                for zone, b in per_zone.items():
                    if zone.isdigit() and int(zone) in used:
                        u = used[int(zone)]
                        key = f"hugepages-{kind}"
                        u[key] = u.get(key, 0) + b
            for res, ids in ca.devices.items():
                for i in ids:
                    dz = dev_numa.get((res, i))
                    if dz is not None:
                        used[dz][res] = used[dz].get(res, 0) + 1
    return used


def _resources(res: Mapping[str, int]) -> dict[str, int | str]:
    """Counts as integers, memory and hugepages as quantities ("32Gi")."""
    return {k: format_bytes(v) if k == "memory" or k.startswith("hugepages-") else v
            for k, v in res.items()}


def _zone_order(z: str) -> int:
    return int(z) if z.lstrip("-").isdigit() else 1 << 30


def _by_zone(per_zone: Mapping[str, int]) -> dict[str, int | str]:
    return dict(sorted(per_zone.items(), key=lambda kv: _zone_order(kv[0])))


def _construct(model: type[M], given: Mapping[str, Any]) -> M:
    """``model`` from trusted values keyed as on the wire, unvalidated; the fields not
    given stay unset (left out of the JSON)."""
    names = {f.alias or n: n for n, f in model.model_fields.items()}
    return model.model_construct(**{names[k]: v for k, v in given.items() if k in names})


def admitted_pod(name: str, namespace: str, uid: str, resolved: Resolved,
                 allocation: Allocation,
                 dra_unaligned: Sequence[UnalignedDraDevice] = ()) -> AdmittedPod:
    """One ``status.admitted`` entry: the pod's totals (cpulist, bytes per zone) and, per
    container, what it holds (trusted values from the node's ledger: not validated)."""
    a, r = allocation, resolved
    containers = []
    for cname, ca in a.containers.items():
        containers.append(AdmittedContainer.model_construct(
            name=cname,
            numa_nodes=None if ca.numa_nodes is None else list(ca.numa_nodes),
            cpus=format_cpulist(ca.cpus) if ca.cpus else None,
            memory=_by_zone(ca.memory) if ca.memory else None,
            hugepages={size: _by_zone(per) for size, per in sorted(ca.hugepages.items())
                       if per} if ca.hugepages else None,
            devices={k: list(v) for k, v in ca.devices.items()} if ca.devices else None,
            memory_numa_nodes=(None if ca.memory_numa_nodes is None
                               else list(ca.memory_numa_nodes)),
            dra_devices={k: list(v) for k, v in ca.dra_devices.items()}
            if ca.dra_devices else None))
    cpus, memory, devices = a.cpus, a.memory, a.devices
    return AdmittedPod.model_construct(
        pod=name, namespace=namespace, uid=uid, policy=r.policy, scope=r.scope,
        options=_construct(TopologyOptions, r.options.to_json()) if r.options else None,
        source=r.source,
        numa_nodes=list(a.numa_nodes),
        cpus=format_cpulist(cpus) if cpus else None,
        memory=dict(memory) if memory else None,
        devices=devices or None,
        gpus={k: list(v) for k, v in a.gpus.items()} if a.gpus else None,
        containers=containers or None,
        dra_unaligned=list(dra_unaligned) or None)


# Per node: each admitted pod's entry, kept while the pod holds the same allocation and
# resolution (the same objects): an entry is built once, not on every write.
_ADMITTED: weakref.WeakKeyDictionary[
    NodeState, dict[str, tuple[PlacedPod, Resolved, Allocation, AdmittedPod]]
] = weakref.WeakKeyDictionary()


def admitted_pods(state: NodeState) -> list[AdmittedPod]:
    """``status.admitted``: one entry per admitted pod, in the order the node admitted
    them: the memory manager's NUMA groups are the last admission's on each NUMA node, so
    a ledger rebuilt from the status (a restarted agent, the scheduler extender) must take
    the pods back in this order to hold the same groups."""
    known = _ADMITTED.get(state, {})
    now: dict[str, tuple[PlacedPod, Resolved, Allocation, AdmittedPod]] = {}
    out: list[AdmittedPod] = []
    for uid, held in state.admitted.items():
        hit = known.get(uid)
        if (hit is not None and hit[0] is held and hit[1] is held.resolved
                and hit[2] is held.allocation):
            entry = hit[3]
        else:
            entry = admitted_pod(held.name, held.namespace, held.uid, held.resolved,
                                 held.allocation, held.dra_unaligned)
        now[uid] = (held, held.resolved, held.allocation, entry)
        out.append(entry)
    _ADMITTED[state] = now
    return out


@dataclass(frozen=True)
class _Static:
    """The parts of a node's status that only depend on its machine (computed once)."""

    capacity: dict[int, dict[str, int]]
    cpu_topology: CpuTopology
    distances: dict[str, dict[str, int]] | None
    devices: list[Device]


_STATIC: dict[int, tuple[Machine, _Static]] = {}


def _static_parts(m: Machine) -> _Static:
    hit = _STATIC.get(id(m))
    if hit is not None and hit[0] is m:
        return hit[1]
    distances = None
    if m.distances is not None:
        distances = {str(a): {str(b): d for b, d in row.items()} for a, row in m.distances.items()}
    devices = [Device(resource=d.resource, id=d.id, numa_node=d.numa_node,
                      memory=None if d.memory is None else format_bytes(d.memory),
                      groups=[DeviceGroup(level=lvl, id=gid) for lvl, gid in d.groups]
                      if d.groups else None)
               for d in m.devices]
    static = _Static(zone_capacity(m), CpuTopology.model_validate(cpu_topology_json(m)),
                     distances, devices)
    _STATIC[id(m)] = (m, static)
    return static


def _kubelet(settings: Mapping[str, Any]) -> KubeletSettings:
    """``status.kubelet`` from the state's (as :func:`~.kubelet_view.kubelet_settings`
    writes it); a partial one (a state set up by hand) is kept as given."""
    try:
        return KubeletSettings.model_validate(settings)
    except ValidationError:
        return _construct(KubeletSettings, settings)


def _time(text: str | None) -> datetime | None:
    """A condition's transition time (RFC 3339; None: not one)."""
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def status_model(state: NodeState, previous: Mapping[str, Any] | None = None,
                 ready: bool | None = None, message: str | None = None) -> NodeTopologyStatus:
    """The NodeTopology status of ``state`` (``previous``, the status last published,
    keeps condition transition times; ``ready`` and ``message`` default to the state's)."""
    if ready is None:
        ready = state.ready
    if message is None:
        message = state.ready_message
    m = state.machine
    static = _static_parts(m)
    cap = static.capacity
    used = zone_used(state)
    zones: list[Zone] = []
    free_cpus = total_cpus = 0
    for n in m.numa_nodes:
        c = cap[n.id]
        a = c if state.zone_allocatable is None else state.zone_allocatable.get(n.id, c)
        avail = {k: max(0, v - used[n.id].get(k, 0)) for k, v in a.items()}
        total_cpus += a.get("cpu", 0)
        free_cpus += avail.get("cpu", 0)
        zones.append(Zone.model_construct(
            id=n.id, cpus=format_cpulist(list(n.cpus)), memory=format_bytes(n.memory),
            hugepages={k: format_bytes(v) for k, v in sorted(n.hugepages.items())}
            if n.hugepages else None,
            capacity=_resources(c), allocatable=_resources(a), available=_resources(avail)))
    devices = static.devices
    admitted = admitted_pods(state)
    used_devices = {(r, i) for h in state.admitted.values()
                    for r, ids in h.allocation.devices.items() for i in ids}
    gpu_ids = {i for h in state.admitted.values() for ids in h.allocation.gpus.values()
               for i in ids}
    used_devices |= {(d.resource, d.id) for d in m.devices if d.id in gpu_ids}
    known = {(d.resource, d.id) for d in m.devices}
    n_used = len(used_devices & known)

    prev = NodeTopologyStatusRead.model_validate(previous) if previous else None
    t = kubelet_status.now_iso()

    def cond(type_: str, ok: bool, reason: str, msg: str) -> Condition:
        status: ConditionStatus = "True" if ok else "False"
        old = prev.condition(type_) if prev is not None else None
        since = old.last_transition_time if old and old.status == status else None
        return Condition(type=type_, status=status, reason=reason, message=msg,
                         last_transition_time=_time(since) or _time(t))

    applied = state.observed_generation == state.spec_generation
    kubelet = state.kubelet
    placement = cond(NRI_PLACEMENT, *state.placement) if state.placement is not None else None
    kind = NodeKind.of({"status": {"kubelet": kubelet, "conditions": [
        {"type": NRI_PLACEMENT, "status": placement.status, "reason": placement.reason}
    ] if placement else []}})
    if kubelet is not None and kind is NodeKind.KUBELET_MANAGED:
        # a kubelet-managed real node: the kubelet admits the pods under its own policy
        policy_text = (f"the kubelet's Topology Manager policy "
                       f"{kubelet.get('topologyManagerPolicy')}, scope "
                       f"{kubelet.get('topologyManagerScope')} (the kubelet admits this "
                       f"node's pods)")
    else:
        policy_text = f"node default policy {state.default.policy}, scope {state.default.scope}"
    conditions = [
        cond(READY, ready, "AgentReady" if ready else "AgentNotReady",
             message or ("the agent publishes this node's topology"
                         + (" and admits its pods" if state.admits else ""))),
        cond(POLICY_APPLIED, applied, "Applied" if applied else "Pending", policy_text),
    ]
    if placement is not None:
        conditions.append(placement)
    dra = state.dra  # the node's DRA devices (agent/dra.py), once the agent has read them
    return NodeTopologyStatus.model_construct(
        zones=zones, cpu_topology=static.cpu_topology, distances=static.distances,
        devices=devices, admitted=admitted, rejected=state.rejected_total,
        observed_policy_generation=state.observed_generation, conditions=conditions,
        summary=NodeTopologySummary(
            numa_nodes=len(zones), cpus=f"{free_cpus}/{total_cpus}",
            devices=f"{len(devices) - n_used}/{len(devices)}", pods=len(admitted),
            dra_devices=None if dra is None else dra.total),
        kubelet=None if kubelet is None else _kubelet(kubelet),
        dra_devices=None if dra is None else [DraDevice.model_validate(e)
                                              for e in dra.entries()])


def status_json(status: NodeTopologyStatus) -> JSON:
    """The status as the API server stores it (camelCase; fields unset or None left out:
    a policy option not given is not written as its default)."""
    return status.model_dump(mode="json", by_alias=True, exclude_none=True, exclude_unset=True)
