"""Reading a NodeTopology status as the engine's objects: the machine it describes
(:func:`machine_from_status`), the pods it holds (:func:`held_from_admitted`,
:func:`held_from_document`) and a ledger of them (:func:`ledger_from_held`). Plain
mappings in, no API objects."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from numalign.topology.cputopo import cpus_from_topology
from numalign.topology.errors import MachineError, TopologyError
from numalign.topology.hints import NumaMask, mask_of
from numalign.topology.ledger import MEMORY, ContainerAllocation, Ledger, LedgerError
from numalign.topology.machine import Machine, machine_from_dict
from numalign.topology.pod import HUGEPAGES_PREFIX
from numalign.topology.quantity import parse_cpulist, quantity_bytes

JSON = dict[str, Any]


def _mapping(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise TopologyError(where, "must be a mapping")
    return v


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


def _cpus(v: Any, where: str) -> tuple[int, ...]:
    if v is None or v == "":
        return ()
    if isinstance(v, str):
        try:
            return tuple(parse_cpulist(v))
        except ValueError as e:
            raise LedgerError(where, str(e)) from None
    if isinstance(v, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in v):
        return tuple(v)
    raise LedgerError(where, "must be a cpulist string or a list of CPU ids")


def _zone_bytes(v: Any, where: str) -> dict[int, int]:
    if not v:
        return {}
    if not isinstance(v, Mapping):
        raise LedgerError(where, "must map a NUMA node id to an amount")
    out: dict[int, int] = {}
    for z, b in v.items():
        try:
            out[int(z)] = quantity_bytes(b)
        except (TypeError, ValueError) as e:
            raise LedgerError(f"{where}.{z}", str(e)) from None
    return out


def container_allocation(entry: Mapping[str, Any], where: str) -> ContainerAllocation:
    """A container's holdings from published or annotated data: ``cpus`` (cpulist or
    ids), ``memory`` ({zone: bytes or quantity}), ``hugepages`` ({size: {zone: ...}}),
    ``devices`` ({resource: [ids]}), ``numaNodes`` (the memory affinity)."""
    memory: dict[str, dict[int, int]] = {}
    mem = _zone_bytes(entry.get("memory"), f"{where}.memory")
    if mem:
        memory[MEMORY] = mem
    huge = entry.get("hugepages") or {}
    if not isinstance(huge, Mapping):
        raise LedgerError(f"{where}.hugepages", "must map a page size to zones")
    for size, per in huge.items():
        got = _zone_bytes(per, f"{where}.hugepages.{size}")
        if got:
            memory[HUGEPAGES_PREFIX + str(size)] = got
    devices_raw = entry.get("devices") or {}
    if not isinstance(devices_raw, Mapping):
        raise LedgerError(f"{where}.devices", "must map a resource to device ids")
    devices = {str(r): tuple(str(i) for i in ids) for r, ids in devices_raw.items()
               if isinstance(ids, list) and ids}
    mask: NumaMask | None = None
    if memory:
        numa = entry.get("numaNodes")
        nodes = ([int(n) for n in numa] if isinstance(numa, list) and numa
                 else sorted({n for per in memory.values() for n in per}))
        mask = mask_of(nodes)
    return ContainerAllocation(cpus=_cpus(entry.get("cpus"), f"{where}.cpus"), memory=memory,
                               memory_mask=mask, devices=devices)


@dataclass(frozen=True)
class HeldPod:
    uid: str
    name: str
    namespace: str
    containers: tuple[tuple[str, ContainerAllocation], ...]


def held_from_admitted(entry: Mapping[str, Any], where: str) -> HeldPod:
    """One ``status.admitted`` entry of a NodeTopology (per-container detail when present,
    else the pod's totals as one container)."""
    uid = str(entry.get("uid") or "")
    name = str(entry.get("pod") or uid)
    ns = str(entry.get("namespace") or "default")
    items: list[tuple[str, ContainerAllocation]] = []
    raw = entry.get("containers")
    if isinstance(raw, list) and raw:
        for i, c in enumerate(raw):
            c = _mapping(c, f"{where}.containers[{i}]")
            items.append((str(c.get("name") or i),
                          container_allocation(c, f"{where}.containers[{i}]")))
    elif isinstance(raw, Mapping) and raw:  # `numalign admit` output / allocation annotation
        for cname, c in raw.items():
            items.append((str(cname),
                          container_allocation(_mapping(c, f"{where}.containers.{cname}"),
                                               f"{where}.containers.{cname}")))
    else:
        items.append(("", container_allocation(entry, where)))
    return HeldPod(uid or f"{ns}/{name}", name, ns, tuple(items))


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
