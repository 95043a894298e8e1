"""A real node's state from its kubelet (pure: no I/O): the pods the kubelet admitted and
what it gave them, as the PodResources API reports them, put into a NodeState so that
NodeTopology status shows them as it shows an emulated node's.

- Each pod the kubelet lists is an admitted pod; each of its containers carries the
  kubelet's exclusive CPUs, device ids (per resource) and memory blocks (per NUMA node).
- A container's NUMA affinity is derived from what it was given: the NUMA nodes of its
  CPUs, of its devices (as the kubelet reports their topology) and of its memory blocks;
  a container given nothing exclusive has none. The pod's is the union of its containers'.
- The policy each pod was admitted under is the kubelet's (its configuration file),
  with source ``kubelet``.
- The zones' allocatable are the kubelet's (its allocatable CPUs, devices and memory
  blocks per NUMA node) where it reports them, else the machine's capacity less the
  reserved CPUs.
- Devices the kubelet knows (from device plugins) replace the discovered devices of the
  same resource, with the NUMA node the kubelet reports.
- DRA devices the kubelet prepared for a container's claims are listed per claim
  (``dra:<claim>``); the Topology Manager never sees them, so each pod lists those whose
  NUMA nodes (the node's ResourceSlices say) hold none of its container's exclusive CPUs
  (``draUnaligned``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from numalign.api.allocation import Allocation, ContainerRecord
from numalign.api.dra import NodeDraDevices
from numalign.api.nodetopology import UnalignedDraDevice
from numalign.api.resolved import Resolved, parse_options
from numalign.topology.machine import Device, Machine

from .kubelet_config import KubeletConfig
from .podresources import MEMORY, Allocatable, DeviceSet, KubeletContainer, KubeletPod, Snapshot
from .state import NodeState, PlacedPod
from .topostatus import zone_capacity

SOURCE = "kubelet"
HUGEPAGES = "hugepages-"


def machine_with_devices(base: Machine, devices: Iterable[DeviceSet]) -> Machine:
    """``base`` with the kubelet's devices in place of the discovered ones of the same
    resource (a device on several NUMA nodes, or none, gets no NUMA node)."""
    known: list[Device] = []
    resources: set[str] = set()
    for ds in devices:
        resources.add(ds.resource)
        numa = ds.numa_nodes[0] if len(ds.numa_nodes) == 1 else None
        if numa is not None and numa not in {n.id for n in base.numa_nodes}:
            numa = None
        known += [Device(ds.resource, i, numa) for i in ds.ids]
    if not resources:
        return base
    kept = [d for d in base.devices if d.resource not in resources]
    known.sort(key=lambda d: (d.resource, d.id))
    return replace(base, devices=tuple(kept + known))


def _zone_key(nodes: tuple[int, ...]) -> str:
    return ",".join(str(n) for n in nodes)


def container_allocation(machine: Machine, kc: KubeletContainer) -> ContainerRecord:
    """One container's allocation as the kubelet reports it, with its derived affinity
    (a memory block on several NUMA nodes is keyed by all of them, e.g. "0,1")."""
    cpu_numa = {c.id: c.numa for c in machine.cpus.values()}
    numa: set[int] = {cpu_numa[c] for c in kc.cpus if c in cpu_numa}
    devices: dict[str, list[str]] = {}
    for ds in kc.devices:
        devices.setdefault(ds.resource, []).extend(ds.ids)
        numa.update(ds.numa_nodes)
    memory: dict[str, int] = {}
    hugepages: dict[str, dict[str, int]] = {}
    for mb in kc.memory:
        if not mb.numa_nodes or not mb.size:
            continue
        numa.update(mb.numa_nodes)
        key = _zone_key(mb.numa_nodes)
        if mb.kind == MEMORY:
            memory[key] = memory.get(key, 0) + mb.size
        elif mb.kind.startswith(HUGEPAGES):
            per = hugepages.setdefault(mb.kind.removeprefix(HUGEPAGES), {})
            per[key] = per.get(key, 0) + mb.size
    has_any = bool(kc.cpus or devices or memory or hugepages)
    dra: dict[str, list[str]] = {}
    for cd in kc.dra:
        dra.setdefault(f"dra:{cd.claim}", []).append(cd.id)
    return ContainerRecord(cpus=list(kc.cpus), memory=memory,
                               devices={r: ids for r, ids in sorted(devices.items())},
                               numa_nodes=sorted(numa) if has_any else None,
                               hugepages=hugepages, dra_devices=dra)


def pod_allocation(machine: Machine, pod: KubeletPod) -> Allocation:
    containers = {c.name: container_allocation(machine, c) for c in pod.containers}
    numa = sorted({n for ca in containers.values() for n in ca.numa_nodes or []})
    return Allocation(numa_nodes=numa, containers=containers)


def unaligned_dra(machine: Machine, pod: KubeletPod,
                  node: NodeDraDevices | None) -> tuple[UnalignedDraDevice, ...]:
    """The pod's DRA devices on none of the NUMA nodes of their container's exclusive CPUs
    (a container without exclusive CPUs, or a device whose NUMA nodes are unknown, has
    none)."""
    if node is None:
        return ()
    numa_of = {(d.driver, d.pool, d.device): d.numa_nodes for d in node.devices
               if d.device is not None and d.numa_nodes}
    cpu_numa = {c.id: c.numa for c in machine.cpus.values()}
    out: list[UnalignedDraDevice] = []
    for kc in pod.containers:
        cpus = {cpu_numa[c] for c in kc.cpus if c in cpu_numa}
        if not cpus:
            continue
        for cd in kc.dra:
            where = numa_of.get((cd.driver, cd.pool, cd.device))
            if where and not cpus & set(where):
                out.append(UnalignedDraDevice(container=kc.name, device=cd.id,
                                              numa_nodes=list(where),
                                              cpu_numa_nodes=sorted(cpus)))
    return tuple(out[:64])


def resolved_of(config: KubeletConfig | None) -> Resolved:
    if config is None:
        return Resolved(source=SOURCE)
    return Resolved(policy=config.topology_manager_policy,
                    scope=config.topology_manager_scope,
                    options=parse_options(dict(config.topology_manager_policy_options),
                                          "kubelet topologyManagerPolicyOptions"),
                    source=SOURCE)


def zone_allocatable(machine: Machine, alloc: Allocatable,
                     config: KubeletConfig | None) -> dict[int, dict[str, int]]:
    """Per NUMA node, what the kubelet can give: its allocatable CPUs (the static CPU
    manager reports them; else all CPUs less reservedSystemCPUs), devices and memory."""
    cap = zone_capacity(machine)
    cpu_numa = {c.id: c.numa for c in machine.cpus.values()}
    out = {z: dict(res) for z, res in cap.items()}
    if alloc.cpus:
        cpus: Iterable[int] = alloc.cpus
    else:
        reserved = set(config.reserved_system_cpus) if config else set()
        cpus = [c for c in cpu_numa if c not in reserved]
    for res in out.values():
        res["cpu"] = 0
    for c in cpus:
        z = cpu_numa.get(c)
        if z is not None:
            out[z]["cpu"] += 1
    blocks: dict[int, dict[str, int]] = {}
    for mb in alloc.memory:
        if len(mb.numa_nodes) == 1 and mb.numa_nodes[0] in out:
            per = blocks.setdefault(mb.numa_nodes[0], {})
            per[mb.kind] = per.get(mb.kind, 0) + mb.size
    for z, per in blocks.items():
        out[z].update(per)
    return out


def _uid_key(uid: str, pod: KubeletPod) -> str:
    return uid or f"{pod.namespace}/{pod.name}"


def apply_snapshot(state: NodeState, base: Machine, snap: Snapshot,
                   config: KubeletConfig | None,
                   uids: Mapping[tuple[str, str], str], managed: bool = False) -> bool:
    """Make ``state`` show what the kubelet reports; True when anything changed.

    ``base`` is the discovered machine, ``uids`` the pods' uids by (namespace, name) as
    the API server has them (a pod the API server does not show yet gets an empty uid).
    ``managed``: a numalign-managed node, whose state holds numalign's decisions (the NRI
    placer's) instead of the kubelet's (whose managers are ``none``): they stay, their
    ledger rebuilt on the kubelet's machine; devices and allocatable are still the
    kubelet's.
    """
    machine = machine_with_devices(base, snap.allocatable.devices)
    changed = False
    if machine != state.machine:
        if managed:
            state.set_machine(machine)
        else:
            state.machine = machine
        changed = True
    if not managed:
        resolved = resolved_of(config)
        admitted: dict[str, PlacedPod] = {}
        for pod in snap.pods:
            uid = uids.get((pod.namespace, pod.name), "")
            admitted[_uid_key(uid, pod)] = PlacedPod(
                pod.namespace, pod.name, uid, resolved, pod_allocation(machine, pod),
                dra_unaligned=unaligned_dra(machine, pod, state.dra))
        if admitted != state.admitted:
            state.admitted = admitted
            state.decided = {k: True for k in admitted}
            changed = True
    zones = zone_allocatable(machine, snap.allocatable, config)
    if zones != state.zone_allocatable:
        state.zone_allocatable = zones
        changed = True
    if changed:
        state.version += 1
    return changed


def kubelet_settings(config: KubeletConfig | None, problem: str | None) -> dict[str, object]:
    """NodeTopology ``status.kubelet``."""
    out: dict[str, object] = dict(config.to_json()) if config else dict(
        KubeletConfig().to_json())
    if problem:
        out["podResources"] = problem
    return out

