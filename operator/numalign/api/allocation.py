"""What an admitted pod holds: the allocation annotation (:class:`Allocation`,
``numalign.io/allocation``) and the NodeTopology ``status.admitted`` entries
(:class:`Admitted`), each with one encoder and one decoder, here."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from numalign.topology import jsontext
from numalign.topology.machine import MAX_NUMA_ID, MAX_NUMA_NODES
from numalign.topology.policies import known as known_policy
from numalign.topology.policies import names as policy_names
from numalign.topology.policyconfig import SCOPES
from numalign.topology.quantity import MAX_CPU_ID, format_cpulist, parse_cpulist, quantity_bytes
from numalign.topology.text import clip, quote

from .errors import WireError  # what its decoders raise
from .names import ANN_ALLOCATION, SOURCE_NONE
from .resolved import DEFAULT_SCOPE, NO_OPTIONS, Resolved, parse_options

JSON = dict[str, Any]

# An allocation's containers, and ids of one device resource, at most (a pod has far fewer;
# the bound keeps a hostile record's cost small)
MAX_ALLOCATION_ITEMS = 1024


# ---------------------------------------------------------------- the allocation


@dataclass
class ContainerRecord:
    cpus: list[int] = field(default_factory=list)
    memory: dict[str, int] = field(default_factory=dict)  # zone ("0") -> bytes
    devices: dict[str, list[str]] = field(default_factory=dict)
    numa_nodes: list[int] | None = None
    hugepages: dict[str, dict[str, int]] = field(default_factory=dict)  # size -> zone -> bytes
    # the NUMA nodes the container's memory may use (the memory manager's block affinity;
    # set even when it took no bytes of its own, reusing its init container's memory)
    memory_numa_nodes: list[int] | None = None
    # DRA devices the scheduler allocated to its claims: request key
    # (``dra:<claim>/<request>``) -> ``driver/pool/device`` (not in the ledger)
    dra_devices: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> JSON:
        out: JSON = {"cpus": list(self.cpus), "memory": dict(self.memory),
                     "devices": {k: list(v) for k, v in self.devices.items()}}
        if self.dra_devices:
            out["draDevices"] = {k: list(v) for k, v in self.dra_devices.items()}
        if self.numa_nodes is not None:
            out["numaNodes"] = list(self.numa_nodes)
        if self.hugepages:
            out["hugepages"] = {k: dict(v) for k, v in self.hugepages.items()}
        if self.memory_numa_nodes is not None:
            out["memoryNumaNodes"] = list(self.memory_numa_nodes)
        return out


@dataclass
class Allocation:
    """What one admitted pod holds (``numalign.io/allocation``)."""

    numa_nodes: list[int] = field(default_factory=list)
    containers: dict[str, ContainerRecord] = field(default_factory=dict)
    gpus: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> JSON:
        return {"numaNodes": list(self.numa_nodes),
                "containers": {k: v.to_json() for k, v in self.containers.items()},
                "gpus": {k: list(v) for k, v in self.gpus.items()}}

    def to_annotation(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    def pod_patch(self, uid: str) -> JSON:
        """The pod (status) merge patch recording this allocation, the pod's uid as a
        precondition."""
        return {"metadata": {"uid": uid, "annotations": {ANN_ALLOCATION: self.to_annotation()}}}

    @property
    def cpus(self) -> list[int]:
        return sorted({c for ca in self.containers.values() for c in ca.cpus})

    @property
    def devices(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for ca in self.containers.values():
            for r, ids in ca.devices.items():
                out.setdefault(r, []).extend(ids)
        return {r: sorted(set(v)) for r, v in sorted(out.items())}

    @property
    def memory(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ca in self.containers.values():
            for z, b in ca.memory.items():
                out[z] = out.get(z, 0) + b
        return dict(sorted(out.items(), key=lambda kv: _zone_key(kv[0])))


def _zone_key(z: str) -> int:
    return int(z) if z.isdigit() else 0


def _zone_order(z: str) -> int:
    return int(z) if z.lstrip("-").isdigit() else 1 << 30


def _int_list(v: Any, where: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                          for x in v):
        raise WireError(f"{where} must be a list of integers")
    return [int(x) for x in v]


def _ids(v: Any, where: str, top: int, what: str) -> list[int]:
    """A list of ids each in 0..top, at most top + 1 of them (bounded: the engine builds
    masks and sets from them)."""
    if isinstance(v, list) and len(v) > top + 1:
        raise WireError(f"{where}: {len(v)} ids, at most {top + 1}")
    ids = _int_list(v, where)
    for i in ids:
        if not 0 <= i <= top:
            raise WireError(f"{where}: {i} is not a {what} id (0-{top})")
    return ids


def _numa_ids(v: Any, where: str) -> list[int]:
    if isinstance(v, list) and len(v) > MAX_NUMA_NODES:
        raise WireError(f"{where}: {len(v)} ids, at most {MAX_NUMA_NODES}")
    return _ids(v, where, MAX_NUMA_ID, "NUMA node")


def _cpus(v: Any, where: str) -> list[int]:
    """A cpulist string ("0-3,8") or a list of CPU ids."""
    if isinstance(v, str):
        try:
            return parse_cpulist(v)
        except ValueError as e:
            raise WireError(f"{where}: {e}") from None
    return _ids(v or [], where, MAX_CPU_ID, "CPU")


def _str_lists(v: Any, where: str) -> dict[str, list[str]]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise WireError(f"{where} must be an object")
    out: dict[str, list[str]] = {}
    for k, ids in v.items():
        if not isinstance(ids, list):
            raise WireError(f"{where}.{clip(k)} must be a list of ids")
        if len(ids) > MAX_ALLOCATION_ITEMS:
            raise WireError(f"{where}.{clip(k)}: {len(ids)} ids, at most "
                            f"{MAX_ALLOCATION_ITEMS}")
        out[str(k)] = [str(i) for i in ids]
    return out


def _zone(z: Any, where: str) -> str:
    """A memory zone: a NUMA node id, or several joined by commas ("0,1": a block the
    kubelet reports on more than one node)."""
    parts = str(z).split(",")
    if len(parts) > MAX_NUMA_NODES or not all(
            p.isascii() and p.isdigit() and len(p) <= 3 and int(p) <= MAX_NUMA_ID
            for p in parts):
        raise WireError(f"{where}: zone {quote(str(z), 40)} is not a NUMA node id (0-"
                        f"{MAX_NUMA_ID}) or a list of them")
    return str(z)


def _bytes_per_zone(raw: Any, where: str) -> dict[str, int]:
    """Zone -> bytes; integers, digit strings or quantities ("32Gi")."""
    if not isinstance(raw, Mapping):
        raise WireError(f"{where} must be an object")
    if len(raw) > MAX_NUMA_NODES:
        raise WireError(f"{where}: {len(raw)} zones, at most {MAX_NUMA_NODES}")
    out: dict[str, int] = {}
    for z, b in raw.items():
        _zone(z, where)
        if isinstance(b, bool) or not isinstance(b, int | str):
            raise WireError(f"{where}.{z} must be an integer (bytes) or a quantity")
        try:
            out[str(z)] = b if isinstance(b, int) else quantity_bytes(b)
        except ValueError as e:
            raise WireError(f"{where}.{z}: {e}") from None
    return out


def _container(c: Any, w: str) -> ContainerRecord:
    if not isinstance(c, Mapping):
        raise WireError(f"{w} must be an object")
    memory = _bytes_per_zone(c.get("memory") or {}, f"{w}.memory")
    hp_raw = c.get("hugepages") or {}
    if not isinstance(hp_raw, Mapping):
        raise WireError(f"{w}.hugepages must be an object")
    if len(hp_raw) > MAX_ALLOCATION_ITEMS:
        raise WireError(f"{w}.hugepages: {len(hp_raw)} sizes, at most {MAX_ALLOCATION_ITEMS}")
    hugepages = {str(k): _bytes_per_zone(v, f"{w}.hugepages.{clip(k)}")
                 for k, v in hp_raw.items()}
    numa_raw = c.get("numaNodes")
    mem_numa_raw = c.get("memoryNumaNodes")
    return ContainerRecord(
        cpus=_cpus(c.get("cpus"), f"{w}.cpus"), memory=memory,
        devices=_str_lists(c.get("devices"), f"{w}.devices"),
        numa_nodes=None if numa_raw is None else _numa_ids(numa_raw, f"{w}.numaNodes"),
        hugepages=hugepages,
        memory_numa_nodes=None if mem_numa_raw is None
        else _numa_ids(mem_numa_raw, f"{w}.memoryNumaNodes"),
        dra_devices=_str_lists(c.get("draDevices"), f"{w}.draDevices"))


def allocation_from_json(doc: Any, where: str = f"annotation {ANN_ALLOCATION}") -> Allocation:
    if not isinstance(doc, Mapping):
        raise WireError(f"{where} must be a JSON object")
    numa = _numa_ids(doc.get("numaNodes") or [], f"{where}.numaNodes")
    raw_c = doc.get("containers") or {}
    if not isinstance(raw_c, Mapping):
        raise WireError(f"{where}.containers must be an object")
    if len(raw_c) > MAX_ALLOCATION_ITEMS:
        raise WireError(f"{where}.containers: {len(raw_c)} containers, at most "
                        f"{MAX_ALLOCATION_ITEMS}")
    containers = {str(name): _container(c, f"{where}.containers.{clip(name)}")
                  for name, c in raw_c.items()}
    return Allocation(numa_nodes=numa, containers=containers,
                      gpus=_str_lists(doc.get("gpus"), f"{where}.gpus"))


def parse_allocation(value: str) -> Allocation:
    """Parse ``numalign.io/allocation``; raises WireError naming what is wrong."""
    try:
        doc = jsontext.loads(value, f"annotation {ANN_ALLOCATION}")
    except ValueError as e:
        raise WireError(str(e)) from None
    return allocation_from_json(doc)


# ---------------------------------------------------------------- status.admitted


@dataclass
class Admitted:
    """One ``NodeTopology.status.admitted`` entry: a pod the node admitted, the policy it
    was admitted with and what it holds."""

    pod: str
    namespace: str
    uid: str
    resolved: Resolved
    allocation: Allocation

    def to_json(self) -> JSON:
        """The published entry: the pod's totals (cpulist, bytes per zone) and, per
        container, what it holds."""
        a, r = self.allocation, self.resolved
        entry: JSON = {"pod": self.pod, "namespace": self.namespace, "uid": self.uid,
                       "policy": r.policy, "scope": r.scope, "source": r.source,
                       "numaNodes": list(a.numa_nodes)}
        options = r.options.to_json()
        if options:
            entry["options"] = options
        cpus = a.cpus
        if cpus:
            entry["cpus"] = format_cpulist(cpus)
        if a.memory:
            entry["memory"] = dict(a.memory)
        if a.devices:
            entry["devices"] = a.devices
        if a.gpus:
            entry["gpus"] = {k: list(v) for k, v in a.gpus.items()}
        containers = []
        for name, ca in a.containers.items():
            c: JSON = {"name": name}
            if ca.numa_nodes is not None:
                c["numaNodes"] = list(ca.numa_nodes)
            if ca.cpus:
                c["cpus"] = format_cpulist(ca.cpus)
            if ca.memory:
                c["memory"] = dict(sorted(ca.memory.items(), key=lambda kv: _zone_order(kv[0])))
            if ca.hugepages:
                c["hugepages"] = {size: dict(sorted(per.items(),
                                                    key=lambda kv: _zone_order(kv[0])))
                                  for size, per in sorted(ca.hugepages.items()) if per}
            if ca.devices:
                c["devices"] = {k: list(v) for k, v in ca.devices.items()}
            if ca.memory_numa_nodes is not None:
                c["memoryNumaNodes"] = list(ca.memory_numa_nodes)
            if ca.dra_devices:
                c["draDevices"] = {k: list(v) for k, v in ca.dra_devices.items()}
            containers.append(c)
        if containers:
            entry["containers"] = containers
        return entry


def parse_admitted(entry: Any, where: str = "status.admitted entry") -> Admitted:
    """Decode one ``status.admitted`` entry (per-container detail when present, else the
    pod's totals as one container named ""). Raises WireError naming the field when the
    allocation is malformed; a bad policy, scope or options is none, the default scope
    or no options, said in ``resolved.problems`` (the allocation still counts)."""
    if not isinstance(entry, Mapping):
        raise WireError(f"{where} must be an object")
    uid = str(entry.get("uid") or "")
    name = str(entry.get("pod") or uid)
    ns = str(entry.get("namespace") or "default")
    problems: list[str] = []
    policy = entry.get("policy") or "none"
    if not known_policy(policy):
        problems.append(f"{where}.policy: must be one of {', '.join(policy_names())}, "
                        f"got {quote(policy)}")
        policy = "none"
    scope = entry.get("scope") or DEFAULT_SCOPE
    if scope not in SCOPES:
        problems.append(f"{where}.scope: must be container or pod, got {quote(scope)}")
        scope = DEFAULT_SCOPE
    try:
        options = parse_options(entry.get("options"), f"{where}.options")
    except WireError as e:
        problems.append(str(e))
        options = NO_OPTIONS
    resolved = Resolved(str(policy), str(scope), options,
                        str(entry.get("source") or SOURCE_NONE), problems=tuple(problems))
    raw = entry.get("containers")
    containers: dict[str, ContainerRecord] = {}
    if isinstance(raw, list) and len(raw) > MAX_ALLOCATION_ITEMS:
        raise WireError(f"{where}.containers: {len(raw)} containers, at most "
                        f"{MAX_ALLOCATION_ITEMS}")
    if isinstance(raw, list) and raw:
        for i, c in enumerate(raw):
            w = f"{where}.containers[{i}]"
            if not isinstance(c, Mapping):
                raise WireError(f"{w} must be an object")
            containers[str(c.get("name") or i)] = _container(c, w)
    elif raw:
        raise WireError(f"{where}.containers must be a list")
    else:
        totals = ("cpus", "memory", "hugepages", "devices", "numaNodes")
        containers[""] = _container({k: entry.get(k) for k in totals}, where)
    allocation = Allocation(_numa_ids(entry.get("numaNodes") or [], f"{where}.numaNodes"),
                            containers, _str_lists(entry.get("gpus"), f"{where}.gpus"))
    return Admitted(name, ns, uid or f"{ns}/{name}", resolved, allocation)
