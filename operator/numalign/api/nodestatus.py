"""Reading a NodeTopology status as the engine's objects: the machine it describes
(:func:`machine_from_status`), the pods it holds (:func:`held_from_status`: a
NodeTopology's status as read by :class:`~numalign.api.reads.NodeTopologyStatusRead`;
:func:`held_from_admitted`, :func:`held_from_document`) and a ledger of them
(:func:`ledger_from_held`). :func:`machine_from_status` parses the status's machine
(zones, distances, devices, CPU topology) strictly, naming the field that is wrong."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from numalign.topology.cputopo import cpus_from_topology
from numalign.topology.errors import MachineError, TopologyError
from numalign.topology.hints import NumaMask, mask_ids, mask_of
from numalign.topology.ledger import MEMORY, ContainerAllocation, Ledger, LedgerError
from numalign.topology.machine import Machine, machine_from_dict
from numalign.topology.pod import HUGEPAGES_PREFIX
from numalign.topology.quantity import parse_cpulist

from .allocation import ContainerRecord, allocation_from_json, parse_admitted
from .errors import WireError
from .reads import NodeTopologyStatusRead

JSON = dict[str, Any]


def _mapping(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise TopologyError(where, "must be a mapping")
    return v


_ZONE_MACHINE_FIELDS = ("id", "cpus", "memory", "hugepages")  # not what is free


def machine_source(status: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a NodeTopology status :func:`machine_from_status` reads (the zones less
    their free and allocatable amounts, which change with every pod): two statuses with
    equal sources describe one machine."""
    zones = status.get("zones")
    if isinstance(zones, list):
        zones = [{k: z.get(k) for k in _ZONE_MACHINE_FIELDS} if isinstance(z, Mapping) else z
                 for z in zones]
    return (zones, status.get("distances"), status.get("devices"), status.get("cpuTopology"))


def machine_from_status(status: Mapping[str, Any], name: str = "node") -> Machine:
    """The machine a NodeTopology status describes (zones, CPU topology, distances,
    devices).

    ``status.cpuTopology`` gives the core and socket of every CPU exactly (see
    :mod:`.cputopo`); a status without it (an older agent) gets one thread per core and
    one socket per NUMA node, which can change which CPU ids are picked but not the NUMA
    hints. Raises MachineError naming the status field."""
    zones = status.get("zones")
    if not isinstance(zones, list) or not zones:
        raise MachineError("status.zones", "has no zones (the agent has not published yet)")
    nodes: list[JSON] = []
    ids: list[int] = []
    for i, z in enumerate(zones):
        z = _mapping(z, f"status.zones[{i}]")
        zid = z.get("id")
        if not isinstance(zid, int) or isinstance(zid, bool):
            raise MachineError(f"status.zones[{i}].id", "must be an integer")
        ids.append(zid)
        node: JSON = {"id": zid, "cpus": str(z.get("cpus") or ""),
                      "memory": z.get("memory") if z.get("memory") is not None else 0}
        if z.get("hugepages"):
            node["hugepages"] = dict(_mapping(z["hugepages"], f"status.zones[{i}].hugepages"))
        nodes.append(node)
    doc: JSON = {"name": name, "numaNodes": nodes}
    raw_d = status.get("distances")
    if raw_d:
        d = _mapping(raw_d, "status.distances")
        rows: list[list[int]] = []
        for a in ids:
            row = d.get(str(a))
            if not isinstance(row, Mapping):
                raise MachineError(f"status.distances.{a}", "is missing")
            vals: list[int] = []
            for b in ids:
                v = row.get(str(b))
                if not isinstance(v, int) or isinstance(v, bool):
                    raise MachineError(f"status.distances.{a}.{b}", "must be an integer")
                vals.append(v)
            rows.append(vals)
        doc["distances"] = rows
    devices: list[JSON] = []
    for i, dv in enumerate(status.get("devices") or []):
        dv = _mapping(dv, f"status.devices[{i}]")
        dev: JSON = {"resource": dv.get("resource"), "id": dv.get("id"),
                     "numaNode": dv.get("numaNode")}
        if dv.get("memory") is not None:
            dev["memory"] = dv["memory"]
        groups = dv.get("groups") or []
        if isinstance(groups, list):
            dev["groups"] = {str(g.get("level")): str(g.get("id")) for g in groups
                             if isinstance(g, Mapping)}
        devices.append(dev)
    doc["devices"] = devices
    machine = machine_from_dict(doc, source="NodeTopology status")
    topo = status.get("cpuTopology")
    if topo is None:
        return machine
    numa_of = {c: n.id for n in machine.numa_nodes for c in n.cpus}
    try:
        cpus = cpus_from_topology(numa_of, _mapping(topo, "status.cpuTopology"),
                                  "status.cpuTopology")
    except MachineError as e:
        raise MachineError(f"NodeTopology status: {e.field}", e.problem) from None
    return replace(machine, cpus=cpus)


# ---------------------------------------------------------------- ledger <-> wire
# One converter pair between what the engine's ledger holds for a container and what the
# allocation annotation and ``status.admitted`` say of it.


def wire_container(held: ContainerAllocation, numa_nodes: list[int] | None
                   ) -> ContainerRecord:
    """What the ledger holds for a container, as the wire says it (``numa_nodes``: the
    container's affinity from its decision)."""
    memory: dict[str, int] = {}
    hugepages: dict[str, dict[str, int]] = {}
    for kind, per_node in held.memory.items():
        if kind == MEMORY:
            memory = {str(n): b for n, b in sorted(per_node.items()) if b}
        elif kind.startswith(HUGEPAGES_PREFIX):
            hp = {str(n): b for n, b in sorted(per_node.items()) if b}
            if hp:
                hugepages[kind.removeprefix(HUGEPAGES_PREFIX)] = hp
    return ContainerRecord(
        cpus=sorted(held.cpus), memory=memory,
        devices={r: list(ids) for r, ids in sorted(held.devices.items()) if ids},
        numa_nodes=numa_nodes, hugepages=hugepages,
        memory_numa_nodes=None if held.memory_mask is None else mask_ids(held.memory_mask))


def ledger_container(a: ContainerRecord, reusable: bool = False) -> ContainerAllocation:
    """What a container holds (as the allocation annotation and ``status.admitted`` say
    it) as the ledger's allocation (:func:`wire_container` back); ``reusable``: a plain
    init container's, which the app containers may reuse."""
    memory: dict[str, dict[int, int]] = {}
    if a.memory:
        memory[MEMORY] = {int(z): b for z, b in a.memory.items()}
    for size, per_zone in a.hugepages.items():
        if per_zone:
            memory[HUGEPAGES_PREFIX + size] = {int(z): b for z, b in per_zone.items()}
    mask: NumaMask | None = None
    if a.memory_numa_nodes:
        # the memory manager's block affinity (numalign admit, the allocation annotation);
        # a container that reused its init container's memory took no bytes of its own
        # but holds its block (one assignment per memory type on each of its nodes)
        mask = mask_of(a.memory_numa_nodes)
        memory.setdefault(MEMORY, {})
    elif memory:
        nodes = a.numa_nodes if a.numa_nodes else sorted(
            {n for per in memory.values() for n in per})
        mask = mask_of(nodes)
    return ContainerAllocation(cpus=tuple(a.cpus), memory=memory, memory_mask=mask,
                               devices={r: tuple(ids) for r, ids in a.devices.items() if ids},
                               reusable=reusable)


@dataclass(frozen=True)
class HeldPod:
    uid: str
    name: str
    namespace: str
    containers: tuple[tuple[str, ContainerAllocation], ...]


def held_from_admitted(entry: Mapping[str, Any], where: str) -> HeldPod:
    """One ``status.admitted`` entry of a NodeTopology
    (:func:`numalign.api.allocation.parse_admitted`), or a ``numalign admit`` output line
    (containers by name)."""
    entry = _mapping(entry, where)
    raw = entry.get("containers")
    try:
        if isinstance(raw, Mapping) and raw:
            uid = str(entry.get("uid") or "")
            name = str(entry.get("pod") or uid)
            ns = str(entry.get("namespace") or "default")
            alloc = allocation_from_json({"containers": raw}, where)
            uid = uid or f"{ns}/{name}"
        else:
            got = parse_admitted(entry, where)
            uid, name, ns, alloc = got.uid, got.pod, got.namespace, got.allocation
    except WireError as e:
        raise LedgerError("", str(e)) from None
    return HeldPod(uid, name, ns, tuple((n, ledger_container(c))
                                        for n, c in alloc.containers.items()))


def ledger_from_held(machine: Machine, pods: Iterable[HeldPod],
                     exclude: tuple[str, str, str] | None = None) -> tuple[Ledger, list[str]]:
    """A ledger holding ``pods`` except the one matching ``exclude`` (uid, namespace,
    name); also one note per pod that could not be put back (it would double-allocate)."""
    ledger = Ledger(machine)
    notes: list[str] = []
    for p in pods:
        if exclude is not None and (p.uid == exclude[0] or
                                    (p.namespace, p.name) == (exclude[1], exclude[2])):
            continue
        if p.uid in ledger.pods:
            notes.append(f"pod {p.namespace}/{p.name} is listed twice; the second is ignored")
            continue
        try:
            ledger.allocate_many(p.uid, list(p.containers), pod_name=p.name,
                                 namespace=p.namespace)
        except TopologyError as e:
            notes.append(f"allocation of {p.namespace}/{p.name} ignored: {e}")
    return ledger, notes


# The ledger's pseudo pod holding the kubelet's reserved CPUs: the NRI placer's ledger
# and a NodeTopology reader (explain, the extender) hold them under one name, so a
# refusal that names their holder reads the same on the node and off it.
RESERVED_UID = "numalign.io/reserved-cpus"
RESERVED_NAME = "reserved"  # its pod name and container name


def reserved_holder(cpus: Iterable[int]) -> HeldPod:
    return HeldPod(RESERVED_UID, RESERVED_NAME, "",
                   ((RESERVED_NAME, ContainerAllocation(cpus=tuple(sorted(cpus)))),))


def reserved_cpus(settings: Mapping[str, Any]) -> HeldPod | None:
    """The kubelet's reserved CPUs as a holder the engine cannot take them from."""
    try:
        cpus = parse_cpulist(str(settings.get("reservedSystemCPUs") or ""))
    except ValueError:
        return None
    if not cpus:
        return None
    return reserved_holder(cpus)


def held_from_status(status: NodeTopologyStatusRead, node: str,
                     parse: Callable[[Mapping[str, Any], str], HeldPod] | None = None
                     ) -> tuple[list[HeldPod], list[str]]:
    """What a NodeTopology status says the node holds: the kubelet's reserved CPUs (a
    real node) first, then every ``status.admitted`` pod; also one note per entry that
    cannot be read (it is left out). ``parse``: reads one entry (default
    :func:`held_from_admitted`; a reader of many updates may keep what it read)."""
    parse = parse or held_from_admitted
    held: list[HeldPod] = []
    notes: list[str] = []
    settings = status.kubelet_settings
    if settings is not None:
        reserved = reserved_cpus(settings)
        if reserved is not None:
            held.append(reserved)
    for i, entry in enumerate(status.admitted):
        if not isinstance(entry, Mapping):
            continue
        try:
            held.append(parse(entry, f"NodeTopology {node} status.admitted[{i}]"))
        except TopologyError as e:
            notes.append(f"ignored: {e}")
    return held, notes


def held_from_document(doc: Any, source: str = "allocations") -> list[HeldPod]:
    """Allocations already on the machine, from any of: a NodeTopology object, its status,
    ``{"admitted": [...]}``, a list of ``status.admitted`` entries, a ledger dump
    (``{"pods": [{"uid", "containers": {NAME: {...}}}]}``), or a list of ``numalign admit``
    output lines (rejected pods are skipped)."""
    if isinstance(doc, Mapping):
        if isinstance(doc.get("status"), Mapping):
            doc = doc["status"]
        if isinstance(doc, Mapping) and "admitted" in doc:
            doc = doc.get("admitted") or []
        elif isinstance(doc, Mapping) and isinstance(doc.get("pods"), list):
            return [_held_from_ledger_pod(p, f"{source}: pods[{i}]")
                    for i, p in enumerate(doc["pods"])]
        elif isinstance(doc, Mapping) and "pod" in doc:
            doc = [doc]
    if not isinstance(doc, list):
        raise TopologyError(source, "must be a NodeTopology, its status, a list of admitted "
                                    "entries, a ledger or `numalign admit` output")
    out: list[HeldPod] = []
    for i, entry in enumerate(doc):
        where = f"{source}: [{i}]"
        entry = _mapping(entry, where)
        if "pod" not in entry and "uid" not in entry:
            raise TopologyError(where, "is not an admitted pod entry (no pod or uid)")
        if entry.get("admit") is False:
            continue
        out.append(held_from_admitted(entry, where))
    return out


def _held_from_ledger_pod(p: Any, where: str) -> HeldPod:
    p = _mapping(p, where)
    uid = p.get("uid")
    if not isinstance(uid, str) or not uid:
        raise TopologyError(f"{where}.uid", "is required")
    containers = _mapping(p.get("containers") or {}, f"{where}.containers")
    items = tuple((str(n), ContainerAllocation.from_json(a, f"{where}.containers.{n}"))
                  for n, a in containers.items())
    return HeldPod(uid, str(p.get("name") or uid), str(p.get("namespace") or "default"), items)
