"""The NodeTopology status as the agent built it by hand, as plain dicts, before it was
built through the API's model (``numalign.agent.topostatus``): kept here as the oracle
``tests/unit/test_published_status.py`` compares the published status against."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from numalign.agent import kubelet_status
from numalign.agent.state import NodeState
from numalign.agent.topostatus import _resources, zone_capacity, zone_used
from numalign.api.allocation import Admitted
from numalign.api.effective import NodeKind
from numalign.api.nodetopology import NRI_PLACEMENT, POLICY_APPLIED, READY
from numalign.topology.cputopo import cpu_topology_json
from numalign.topology.machine import Machine
from numalign.topology.quantity import format_bytes, format_cpulist

JSON = dict[str, Any]


def admitted_entries(state: NodeState) -> list[JSON]:
    """``status.admitted``: one entry per admitted pod (:class:`~numalign.api.allocation.Admitted`),
    in the order the node admitted them: the memory manager's NUMA groups are the last
    admission's on each NUMA node, so a ledger rebuilt from the status (a restarted
    agent, the scheduler extender) must take the pods back in this order to hold the
    same groups."""
    return [Admitted(held.name, held.namespace, held.uid, held.resolved, held.allocation).to_json()
            for held in state.admitted.values()]


@dataclass(frozen=True)
class _Static:
    """The parts of a node's status that only depend on its machine (computed once)."""

    capacity: dict[int, dict[str, int]]
    cpu_topology: JSON
    distances: dict[str, dict[str, int]] | None
    devices: list[JSON]


_STATIC: dict[int, tuple[Machine, _Static]] = {}


def _static_parts(m: Machine) -> _Static:
    hit = _STATIC.get(id(m))
    if hit is not None and hit[0] is m:
        return hit[1]
    distances = None
    if m.distances is not None:
        distances = {str(a): {str(b): d for b, d in row.items()} for a, row in m.distances.items()}
    devices: list[JSON] = []
    for d in m.devices:
        dev: JSON = {"resource": d.resource, "id": d.id}
        if d.numa_node is not None:
            dev["numaNode"] = d.numa_node
        if d.memory is not None:
            dev["memory"] = format_bytes(d.memory)
        if d.groups:
            dev["groups"] = [{"level": lvl, "id": gid} for lvl, gid in d.groups]
        devices.append(dev)
    static = _Static(zone_capacity(m), cpu_topology_json(m), distances, devices)
    _STATIC[id(m)] = (m, static)
    return static


def build_status(state: NodeState, previous: Mapping[str, Any] | None = None,
                 ready: bool | None = None, message: str | None = None) -> JSON:
    """The NodeTopology status of ``state`` (``previous`` keeps condition transition times;
    ``ready`` and ``message`` default to the state's)."""
    if ready is None:
        ready = state.ready
    if message is None:
        message = state.ready_message
    m = state.machine
    static = _static_parts(m)
    cap = static.capacity
    used = zone_used(state)
    zones: list[JSON] = []
    free_cpus = total_cpus = 0
    for n in m.numa_nodes:
        c = cap[n.id]
        a = c if state.zone_allocatable is None else state.zone_allocatable.get(n.id, c)
        avail = {k: max(0, v - used[n.id].get(k, 0)) for k, v in a.items()}
        total_cpus += a.get("cpu", 0)
        free_cpus += avail.get("cpu", 0)
        zone: JSON = {"id": n.id, "cpus": format_cpulist(list(n.cpus)),
                      "memory": format_bytes(n.memory),
                      "capacity": _resources(c), "allocatable": _resources(a),
                      "available": _resources(avail)}
        if n.hugepages:
            zone["hugepages"] = {k: format_bytes(v) for k, v in sorted(n.hugepages.items())}
        zones.append(zone)
    distances = static.distances
    devices = static.devices
    admitted = admitted_entries(state)
    used_devices = {(r, i) for h in state.admitted.values()
                    for r, ids in h.allocation.devices.items() for i in ids}
    gpu_ids = {i for h in state.admitted.values() for ids in h.allocation.gpus.values()
               for i in ids}
    used_devices |= {(d.resource, d.id) for d in m.devices if d.id in gpu_ids}
    known = {(d.resource, d.id) for d in m.devices}
    n_used = len(used_devices & known)

    prev_conds = {c.get("type"): c for c in (previous or {}).get("conditions") or []
                  if isinstance(c, Mapping)}
    t = kubelet_status.now_iso()

    def cond(type_: str, ok: bool, reason: str, msg: str) -> JSON:
        status = "True" if ok else "False"
        old = prev_conds.get(type_)
        since = old.get("lastTransitionTime") if old and old.get("status") == status else None
        return {"type": type_, "status": status, "reason": reason, "message": msg,
                "lastTransitionTime": since or t}

    applied = state.observed_generation == state.spec_generation
    kubelet = state.kubelet
    placement = cond(NRI_PLACEMENT, *state.placement) if state.placement is not None else None
    kind = NodeKind.of({"status": {"kubelet": kubelet,
                                   "conditions": [placement] if placement else []}})
    if kubelet is not None and kind is NodeKind.KUBELET_MANAGED:
        # a kubelet-managed real node: the kubelet admits the pods under its own policy
        policy_text = (f"the kubelet's Topology Manager policy "
                       f"{kubelet.get('topologyManagerPolicy')}, scope "
                       f"{kubelet.get('topologyManagerScope')} (the kubelet admits this "
                       f"node's pods)")
    else:
        policy_text = f"node default policy {state.default.policy}, scope {state.default.scope}"
    status: JSON = {
        "zones": zones,
        "cpuTopology": static.cpu_topology,
        "devices": devices,
        "admitted": admitted,
        "rejected": state.rejected_total,
        "conditions": [
            cond(READY, ready, "AgentReady" if ready else "AgentNotReady",
                 message or ("the agent publishes this node's topology"
                             + (" and admits its pods" if state.admits else ""))),
            cond(POLICY_APPLIED, applied, "Applied" if applied else "Pending", policy_text),
        ],
        "summary": {"numaNodes": len(zones), "cpus": f"{free_cpus}/{total_cpus}",
                    "devices": f"{len(devices) - n_used}/{len(devices)}",
                    "pods": len(admitted)},
    }
    if placement is not None:
        status["conditions"].append(placement)
    if distances is not None:
        status["distances"] = distances
    if state.observed_generation is not None:
        status["observedPolicyGeneration"] = state.observed_generation
    if state.kubelet is not None:
        status["kubelet"] = dict(state.kubelet)
    if state.dra is not None:  # the node's DRA devices (agent/dra.py)
        status["draDevices"] = state.dra.entries()
        status["summary"]["draDevices"] = state.dra.total
    return status
