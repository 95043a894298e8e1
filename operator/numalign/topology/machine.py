"""The hardware of one node: NUMA nodes, CPUs (with cores and sockets), memory,
hugepages, distances and devices. Loaded from a machine file (see
``tests/fixtures/machines/README.md`` for the format) or built by discovery.
"""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import MachineError
from .quantity import parse_cpulist, quantity_bytes

MAX_NUMA_ID = 255
MAX_NUMA_NODES = 64


@dataclass(frozen=True)
class CPU:
    id: int
    core: int  # a machine-wide core id: CPUs with the same core are hyperthread siblings
    socket: int
    numa: int


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...]
    memory: int  # bytes
    hugepages: Mapping[str, int] = field(default_factory=dict)  # page size ("2Mi") -> bytes


@dataclass(frozen=True)
class Device:
    resource: str
    id: str
    numa_node: int | None
    memory: int | None = None  # bytes
    groups: tuple[tuple[str, str], ...] = ()  # (level, group id), outermost first

    def group(self, level: str) -> str | None:
        for lvl, gid in self.groups:
            if lvl == level:
                return gid
        return None


@dataclass(frozen=True)
class Machine:
    name: str
    numa_nodes: tuple[NumaNode, ...]
    cpus: Mapping[int, CPU]
    devices: tuple[Device, ...] = ()
    distances: Mapping[int, Mapping[int, int]] | None = None  # id -> id -> distance
    description: str = ""

    @property
    def numa_ids(self) -> list[int]:
        return [n.id for n in self.numa_nodes]

    def node(self, numa_id: int) -> NumaNode:
        for n in self.numa_nodes:
            if n.id == numa_id:
                return n
        raise KeyError(numa_id)

    @functools.cached_property
    def _by_resource(self) -> dict[str, tuple[Device, ...]]:
        """The devices per resource, resources sorted (kept: a machine never changes)."""
        out: dict[str, list[Device]] = {}
        for d in self.devices:
            out.setdefault(d.resource, []).append(d)
        return {r: tuple(out[r]) for r in sorted(out)}

    def devices_of(self, resource: str) -> list[Device]:
        return list(self._by_resource.get(resource, ()))

    @property
    def device_resources(self) -> list[str]:
        return list(self._by_resource)

    @property
    def hugepage_sizes(self) -> list[str]:
        return sorted({s for n in self.numa_nodes for s in n.hugepages})


def _req(obj: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise MachineError(f"{where}.{key}", "is required")
    return obj[key]


def _bytes(value: Any, where: str) -> int:
    try:
        return quantity_bytes(value)
    except ValueError as e:
        raise MachineError(where, str(e)) from None


def _int(value: Any, where: str, lo: int = 0, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MachineError(where, f"must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise MachineError(where, f"must be in {rng}, got {value}")
    return value


def machine_from_dict(doc: Any, source: str = "machine") -> Machine:
    """Validate a machine description; errors name ``source`` and the field."""
    try:
        return _machine_from_dict(doc)
    except MachineError as e:
        raise MachineError(f"{source}: {e.field}", e.problem) from None


def _machine_from_dict(doc: Any) -> Machine:
    if not isinstance(doc, Mapping):
        raise MachineError("", "a machine description must be a mapping")
    name = doc.get("name", "machine")
    if not isinstance(name, str) or not name:
        raise MachineError("name", "must be a non-empty string")
    raw_nodes = _req(doc, "numaNodes", "")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise MachineError("numaNodes", "must be a non-empty list")
    if len(raw_nodes) > MAX_NUMA_NODES:
        raise MachineError("numaNodes", f"has {len(raw_nodes)} nodes, at most {MAX_NUMA_NODES}")
    nodes: list[NumaNode] = []
    cpu_owner: dict[int, int] = {}
    for i, rn in enumerate(raw_nodes):
        w = f"numaNodes[{i}]"
        if not isinstance(rn, Mapping):
            raise MachineError(w, "must be a mapping with id, cpus and memory")
        nid = _int(_req(rn, "id", w), f"{w}.id", 0, MAX_NUMA_ID)
        if any(n.id == nid for n in nodes):
            raise MachineError(f"{w}.id", f"NUMA node {nid} is listed twice")
        cpus_raw = rn.get("cpus", "")
        if isinstance(cpus_raw, int) and not isinstance(cpus_raw, bool):
            cpus_raw = str(cpus_raw)
        if not isinstance(cpus_raw, str):
            raise MachineError(f"{w}.cpus",
                               f"must be a cpulist string like '0-3,8-11', got {cpus_raw!r}")
        try:
            cpus = parse_cpulist(cpus_raw)
        except ValueError as e:
            raise MachineError(f"{w}.cpus", str(e)) from None
        for c in cpus:
            if c in cpu_owner:
                raise MachineError(f"{w}.cpus", f"cpu {c} is also on NUMA node {cpu_owner[c]}")
            cpu_owner[c] = nid
        memory = _bytes(_req(rn, "memory", w), f"{w}.memory")
        hp_raw = rn.get("hugepages") or {}
        if not isinstance(hp_raw, Mapping):
            raise MachineError(f"{w}.hugepages", "must map a page size (2Mi, 1Gi) to a total")
        hugepages: dict[str, int] = {}
        for size, total in hp_raw.items():
            size_s = str(size)
            _bytes(size_s, f"{w}.hugepages.{size_s}")
            hugepages[size_s] = _bytes(total, f"{w}.hugepages.{size_s}")
        nodes.append(NumaNode(id=nid, cpus=tuple(cpus), memory=memory, hugepages=hugepages))
    ids = [n.id for n in nodes]

    distances: dict[int, dict[int, int]] | None = None
    raw_d = doc.get("distances")
    if raw_d is not None:
        if not isinstance(raw_d, list) or len(raw_d) != len(nodes):
            raise MachineError("distances", f"must have one row per NUMA node ({len(nodes)} rows)")
        distances = {}
        for i, row in enumerate(raw_d):
            if not isinstance(row, list) or len(row) != len(nodes):
                raise MachineError(f"distances[{i}]", f"must have {len(nodes)} entries")
            distances[ids[i]] = {
                ids[j]: _int(v, f"distances[{i}][{j}]", 0) for j, v in enumerate(row)
            }

    cpus_map = _cpu_topology(doc.get("cpuTopology"), nodes)

    devices: list[Device] = []
    raw_dev = doc.get("devices") or []
    if not isinstance(raw_dev, list):
        raise MachineError("devices", "must be a list")
    seen: set[tuple[str, str]] = set()
    for i, rd in enumerate(raw_dev):
        w = f"devices[{i}]"
        if not isinstance(rd, Mapping):
            raise MachineError(w, "must be a mapping with resource, id and numaNode")
        res = _req(rd, "resource", w)
        if not isinstance(res, str) or "/" not in res:
            raise MachineError(f"{w}.resource", f"must be an extended resource name like "
                               f"'example.com/gpu', got {res!r}")
        did = _req(rd, "id", w)
        if not isinstance(did, str | int) or isinstance(did, bool) or str(did) == "":
            raise MachineError(f"{w}.id", "must be a non-empty string")
        did = str(did)
        if (res, did) in seen:
            raise MachineError(f"{w}.id", f"device {did} of {res} is listed twice")
        seen.add((res, did))
        numa = rd.get("numaNode")
        if numa is not None:
            numa = _int(numa, f"{w}.numaNode", 0, MAX_NUMA_ID)
            if numa not in ids:
                raise MachineError(f"{w}.numaNode", f"NUMA node {numa} is not in numaNodes {ids}")
        mem = rd.get("memory")
        mem_b = _bytes(mem, f"{w}.memory") if mem is not None else None
        groups_raw = rd.get("groups") or {}
        if not isinstance(groups_raw, Mapping):
            raise MachineError(f"{w}.groups", "must map a group level to a group id")
        groups = tuple((str(k), str(v)) for k, v in groups_raw.items())
        devices.append(Device(resource=res, id=did, numa_node=numa, memory=mem_b, groups=groups))

    desc = doc.get("description", "")
    return Machine(name=name, description=str(desc or ""), numa_nodes=tuple(nodes),
                   cpus=cpus_map, devices=tuple(devices), distances=distances)


def _cpu_topology(raw: Any, nodes: list[NumaNode]) -> dict[int, CPU]:
    """Cores and sockets. Default: one thread per core, one socket per NUMA node."""
    all_cpus = sorted(c for n in nodes for c in n.cpus)
    numa_of = {c: n.id for n in nodes for c in n.cpus}
    threads = 1
    socket_of_numa: dict[int, int] = {n.id: n.id for n in nodes}
    siblings: list[list[int]] | None = None
    if raw is not None:
        if not isinstance(raw, Mapping):
            raise MachineError("cpuTopology", "must be a mapping")
        threads = _int(raw.get("threadsPerCore", 1), "cpuTopology.threadsPerCore", 1, 8)
        socks = raw.get("sockets")
        if socks is not None:
            if not isinstance(socks, list):
                raise MachineError("cpuTopology.sockets", "must be a list")
            socket_of_numa = {}
            for i, s in enumerate(socks):
                w = f"cpuTopology.sockets[{i}]"
                if not isinstance(s, Mapping):
                    raise MachineError(w, "must be a mapping with id and numaNodes")
                sid = _int(_req(s, "id", w), f"{w}.id", 0)
                nn = _req(s, "numaNodes", w)
                if not isinstance(nn, list):
                    raise MachineError(f"{w}.numaNodes", "must be a list of NUMA node ids")
                for nid in nn:
                    if nid not in numa_of.values() and nid not in [n.id for n in nodes]:
                        raise MachineError(f"{w}.numaNodes", f"NUMA node {nid} is not in numaNodes")
                    socket_of_numa[nid] = sid
            for n in nodes:
                if n.cpus and n.id not in socket_of_numa:
                    raise MachineError("cpuTopology.sockets", f"NUMA node {n.id} is in no socket")
        sib = raw.get("siblings")
        if sib is not None:
            if not isinstance(sib, list):
                raise MachineError("cpuTopology.siblings", "must be a list of cpulists")
            siblings = []
            for i, s in enumerate(sib):
                try:
                    siblings.append(parse_cpulist(str(s)))
                except ValueError as e:
                    raise MachineError(f"cpuTopology.siblings[{i}]", str(e)) from None
    core_of: dict[int, int] = {}
    if siblings is not None:
        for core, group in enumerate(siblings):
            for c in group:
                if c not in numa_of:
                    raise MachineError("cpuTopology.siblings", f"cpu {c} is on no NUMA node")
                core_of[c] = core
        for c in all_cpus:
            core_of.setdefault(c, len(siblings) + c)
    elif threads == 1:
        core_of = {c: c for c in all_cpus}
    else:
        if len(all_cpus) % threads:
            raise MachineError("cpuTopology.threadsPerCore",
                               f"{len(all_cpus)} CPUs do not split into cores of {threads} threads")
        per = len(all_cpus) // threads
        for idx, c in enumerate(all_cpus):
            core_of[c] = all_cpus[idx % per]
    return {c: CPU(id=c, core=core_of[c], socket=socket_of_numa.get(numa_of[c], numa_of[c]),
                   numa=numa_of[c]) for c in all_cpus}


# A machine file is a few KB (the 64-NUMA-node fixture is under 100 KB).
MAX_MACHINE_FILE_BYTES = 4 << 20


def read_machine_text(path: str | Path) -> str:
    """The text of a machine file: a regular file (never a FIFO or device, which could
    block forever), at most :data:`MAX_MACHINE_FILE_BYTES`, UTF-8. Errors name the file."""
    p = Path(path)
    try:
        with open(p, "rb", opener=lambda f, flags: os.open(f, flags | os.O_NONBLOCK)) as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise MachineError(str(p), "is not a regular file")
            data = fh.read(MAX_MACHINE_FILE_BYTES + 1)
    except OSError as e:
        raise MachineError(str(p), f"cannot read: {e.strerror or e}") from None
    if len(data) > MAX_MACHINE_FILE_BYTES:
        raise MachineError(str(p), f"is larger than {MAX_MACHINE_FILE_BYTES >> 20} MiB")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MachineError(str(p), f"is not UTF-8 text (byte {e.start}: "
                                   f"{data[e.start:e.start + 1]!r})") from None


def load_machine(path: str | Path) -> Machine:
    """Load a machine file; errors name the file and the field."""
    p = Path(path)
    text = read_machine_text(p)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", e)
        raise MachineError(str(p), f"is not valid YAML{where}: {problem}") from None
    return machine_from_dict(doc, source=str(p))
