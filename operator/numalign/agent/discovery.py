"""Node discovery: NUMA nodes, CPUs, memory, hugepages, distances and PCI devices from
sysfs, and GPUs from ``nvidia-smi``.

Reads a root directory (``/`` on a live node, an unpacked sysfs dump in tests) with the
kubelet's (cadvisor's) semantics, as ``tests/fixtures/sysfs/README.md`` states them:

- one NUMA node per ``sys/devices/system/node/nodeN`` directory (ids may be sparse);
- a node's CPUs come from its ``cpulist`` (else ``cpumap``, else its ``cpuN`` entries) and
  are kept only if ``sys/devices/system/cpu/cpuN`` exists and the CPU is online;
- memory is the node's ``MemTotal`` x 1024;
- a node's ``distance`` row has one column per online node id (per possible node id when the
  row's length says so);
- PCI devices carry ``numa_node`` (-1: no affinity).

Symbolic links are followed inside the root (an absolute link target means the root's
``/``), so a dump never reads the live machine's files. A missing or malformed file never
raises anything but :class:`DiscoveryError` (fatal) or adds a warning (not fatal).

A machine without NUMA node directories (a kernel built without NUMA) is reported as one
NUMA node 0 holding every online CPU and ``/proc/meminfo``'s ``MemTotal``, as ``numactl``
shows it. (cadvisor instead reports one node per CPU package with no memory; the Topology
Manager then aligns to sockets whose memory it cannot see. One node 0 is what the kernel
says, and what the memory manager would see.)
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from numalign.topology.errors import MachineError
from numalign.topology.hints import mask_ids
from numalign.topology.machine import CPU, Machine, machine_from_dict
from numalign.topology.quantity import format_bytes, format_cpulist, parse_cpulist

__all__ = [
    "CpuInfo",
    "DiscoveredMachine",
    "DiscoveredNode",
    "DiscoveryError",
    "GpuInfo",
    "NvidiaSmiError",
    "PciDevice",
    "TopoMatrix",
    "discover",
    "gpu_groups",
    "machine_dict",
    "nvlink_islands",
    "parse_gpu_query",
    "parse_topo_matrix",
    "run_nvidia_smi",
    "to_machine",
]

GPU_RESOURCE = "nvidia.com/gpu"
LOCAL_DISTANCE = 10
NVIDIA_SMI_TIMEOUT_S = 30.0
GPU_QUERY_ARGS = ["--query-gpu=index,uuid,pci.bus_id,memory.total,name",
                  "--format=csv,noheader,nounits"]
TOPO_ARGS = ["topo", "-m"]

_NODE_DIR = "sys/devices/system/node"
_CPU_DIR = "sys/devices/system/cpu"
_PCI_DIR = "sys/bus/pci/devices"
_MAX_LINK_HOPS = 40


class DiscoveryError(Exception):
    """Discovery cannot go on. ``str(err)`` is one line naming the file and the problem."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)


class NvidiaSmiError(DiscoveryError):
    """``nvidia-smi`` failed or printed something that cannot be parsed."""


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class HugePages:
    size_bytes: int
    pages: int

    @property
    def total_bytes(self) -> int:
        return self.size_bytes * self.pages


@dataclass
class DiscoveredNode:
    id: int
    cpus: list[int]
    memory_bytes: int
    hugepages: dict[str, HugePages] = field(default_factory=dict)  # "2Mi" -> pages


@dataclass
class CpuInfo:
    id: int
    numa: int
    socket: int | None  # physical_package_id; None when unknown
    core_id: int | None  # the kernel's core_id (unique within a package only)
    core: int  # machine-wide core: the smallest CPU id among its threads
    threads: list[int]  # the online CPUs of the same core, this one included


@dataclass
class PciDevice:
    address: str  # "0000:3b:00.0"
    numa_node: int | None  # None: no affinity (-1) or unknown
    has_numa_file: bool
    class_code: str | None = None  # "0x030200"
    vendor: str | None = None  # "0x10de"
    device: str | None = None  # "0x20b0"

    @property
    def vendor_device(self) -> str | None:
        if self.vendor is None or self.device is None:
            return None
        return f"{_hex4(self.vendor)}:{_hex4(self.device)}"


@dataclass
class GpuInfo:
    index: int
    uuid: str
    pci_bus_id: str  # sysfs form: "0000:07:00.0"
    memory_bytes: int | None
    name: str
    numa_node: int | None = None
    nvlinks: dict[int, int] = field(default_factory=dict)  # peer index -> number of links
    groups: dict[str, str] = field(default_factory=dict)  # level -> group id, outermost first

    @property
    def device_id(self) -> str:
        """The id the NVIDIA device plugin advertises (the UUID), else ``gpuN``."""
        return self.uuid if self.uuid else f"gpu{self.index}"


@dataclass
class DiscoveredMachine:
    root: str
    nodes: list[DiscoveredNode]
    cpus: dict[int, CpuInfo]
    distances: dict[int, dict[int, int]]  # row node -> column node -> distance
    pci: list[PciDevice]
    gpus: list[GpuInfo] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    numa_in_sysfs: bool = True  # False: no node directories, one node 0 was made up

    @property
    def numa_ids(self) -> list[int]:
        return [n.id for n in self.nodes]

    def to_json(self) -> dict[str, Any]:
        """The ``numalign discover`` document: ``numaNodes``, ``distances`` and ``pci`` as
        the command-line contract states them, then everything else under extra keys."""
        doc: dict[str, Any] = {
            "numaNodes": {
                str(n.id): {"cpus": sorted(n.cpus), "memoryBytes": n.memory_bytes}
                for n in self.nodes
            },
            "distances": {
                str(i): {str(j): d for j, d in row.items()} for i, row in self.distances.items()
            },
            "pci": {p.address: p.numa_node for p in self.pci if p.has_numa_file},
        }
        doc["hugepages"] = {
            str(n.id): {size: {"pages": hp.pages, "bytes": hp.total_bytes}
                        for size, hp in n.hugepages.items()}
            for n in self.nodes
        }
        doc["cpuTopology"] = {
            str(c.id): {"numaNode": c.numa, "socket": c.socket, "coreId": c.core_id,
                        "core": c.core, "threads": c.threads}
            for c in sorted(self.cpus.values(), key=lambda c: c.id)
        }
        doc["pciDevices"] = {
            p.address: {"numaNode": p.numa_node, "class": p.class_code, "vendor": p.vendor,
                        "device": p.device}
            for p in self.pci
        }
        doc["gpus"] = [
            {"index": g.index, "uuid": g.uuid, "pciBusId": g.pci_bus_id,
             "memoryBytes": g.memory_bytes, "name": g.name, "numaNode": g.numa_node,
             "nvlinks": {str(k): v for k, v in sorted(g.nvlinks.items())},
             "groups": dict(g.groups)}
            for g in self.gpus
        ]
        doc["numaInSysfs"] = self.numa_in_sysfs
        doc["warnings"] = list(self.warnings)
        return doc


# --------------------------------------------------------------------------- the root


class _Root:
    """Files under a root directory, with symbolic links resolved inside the root."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def show(self, rel: str) -> str:
        return str(self.root / rel)

    def resolve(self, rel: str) -> Path | None:
        """The real path of ``rel`` (links followed, confined to the root); None if absent."""
        todo = [p for p in rel.split("/") if p]
        todo.reverse()
        cur: list[str] = []
        hops = 0
        while todo:
            part = todo.pop()
            if part == ".":
                continue
            if part == "..":
                if cur:
                    cur.pop()
                continue
            candidate = self.root.joinpath(*cur, part)
            try:
                st = os.lstat(candidate)
            except (OSError, ValueError):
                return None
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > _MAX_LINK_HOPS:
                    return None
                try:
                    target = os.readlink(candidate)
                except OSError:
                    return None
                if target.startswith("/"):
                    cur = []
                todo.extend(reversed([p for p in target.split("/") if p]))
            else:
                cur.append(part)
        return self.root.joinpath(*cur)

    def is_dir(self, rel: str) -> bool:
        p = self.resolve(rel)
        return p is not None and p.is_dir()

    def exists(self, rel: str) -> bool:
        p = self.resolve(rel)
        return p is not None and (p.exists() or p.is_symlink())

    def listdir(self, rel: str) -> list[str]:
        p = self.resolve(rel)
        if p is None:
            return []
        try:
            return sorted(os.listdir(p))
        except OSError:
            return []

    def read(self, rel: str, warnings: list[str] | None = None) -> str | None:
        """The text of a file, NULs dropped; None when absent or unreadable (warned)."""
        p = self.resolve(rel)
        if p is None:
            return None
        try:
            data = p.read_bytes()
        except IsADirectoryError:
            if warnings is not None:
                warnings.append(f"{self.show(rel)}: is a directory, expected a file")
            return None
        except OSError as e:
            if warnings is not None:
                warnings.append(f"{self.show(rel)}: cannot read: {e.strerror or e}")
            return None
        return data.replace(b"\x00", b"").decode("utf-8", errors="replace")


# --------------------------------------------------------------------------- parsing helpers


def _hex4(value: str) -> str:
    v = value.strip().lower()
    if v.startswith("0x"):
        v = v[2:]
    return v.rjust(4, "0")


def _parse_cpumask(text: str) -> list[int]:
    """A kernel CPU mask ("00000000,0000ffff") as sorted CPU ids."""
    digits = text.strip().replace(",", "")
    if not digits:
        return []
    return mask_ids(int(digits, 16))  # ValueError on garbage


def _parse_idlist(text: str) -> list[int]:
    return parse_cpulist(text.strip())


def _numbered(names: Iterable[str], prefix: str) -> list[int]:
    pat = re.compile(rf"^{re.escape(prefix)}(\d+)$")
    out: list[int] = []
    for name in names:
        m = pat.match(name)
        if m:
            out.append(int(m.group(1)))
    return sorted(out)


_MEMTOTAL = re.compile(r"^(?:Node\s+\d+\s+)?MemTotal:\s*(\d+)\s*(kB)?\s*$", re.MULTILINE)
_HUGEPAGE_DIR = re.compile(r"^hugepages-(\d+)kB$")


def _memtotal_bytes(text: str) -> int | None:
    m = _MEMTOTAL.search(text)
    if not m:
        return None
    return int(m.group(1)) * 1024


def _read_int(fs: _Root, rel: str, warnings: list[str], *, quiet_missing: bool = True,
              lo: int | None = None) -> int | None:
    text = fs.read(rel, warnings)
    if text is None:
        if not quiet_missing:
            warnings.append(f"{fs.show(rel)}: missing")
        return None
    try:
        v = int(text.strip(), 0) if text.strip().lower().startswith("0x") else int(text.strip())
    except ValueError:
        warnings.append(f"{fs.show(rel)}: not an integer: {text.strip()[:40]!r}")
        return None
    if lo is not None and v < lo:
        warnings.append(f"{fs.show(rel)}: {v} is out of range")
        return None
    return v


# --------------------------------------------------------------------------- discovery


def discover(root: str | os.PathLike[str] = "/", *, nvidia_smi: str | None = None,
             gpus: bool = True) -> DiscoveredMachine:
    """Discover the machine under ``root``.

    GPUs: with ``nvidia_smi`` (a path or command name) that program is run and must work;
    without it, ``nvidia-smi`` on PATH is run only when ``root`` is ``/`` (a dump's GPUs are
    not the live machine's), and a failure there is a warning. ``gpus=False`` skips GPUs.
    """
    root_path = Path(root)
    if not root_path.exists():
        raise DiscoveryError(str(root_path), "does not exist")
    if not root_path.is_dir():
        raise DiscoveryError(str(root_path), "is not a directory")
    fs = _Root(root_path)
    warnings: list[str] = []
    if not fs.is_dir(_NODE_DIR) and not fs.is_dir(_CPU_DIR):
        raise DiscoveryError(fs.show("sys/devices/system"),
                             "no NUMA node or CPU directories: is this a sysfs root?")

    online = _online_cpus(fs, warnings)
    existing = set(_numbered(fs.listdir(_CPU_DIR), "cpu"))
    existing = {c for c in existing if fs.is_dir(f"{_CPU_DIR}/cpu{c}")}

    def usable(cpus: Iterable[int]) -> list[int]:
        return sorted(c for c in set(cpus) if c in existing and online(c))

    node_ids = [n for n in _numbered(fs.listdir(_NODE_DIR), "node")
                if fs.is_dir(f"{_NODE_DIR}/node{n}")]
    nodes: list[DiscoveredNode] = []
    distances: dict[int, dict[int, int]] = {}
    numa_in_sysfs = bool(node_ids)
    if node_ids:
        columns = _distance_columns(fs, node_ids, warnings)
        for nid in node_ids:
            base = f"{_NODE_DIR}/node{nid}"
            cpus = usable(_node_cpus(fs, base, warnings))
            mem = _node_memory(fs, base, warnings)
            hp = _hugepages(fs, f"{base}/hugepages", warnings)
            nodes.append(DiscoveredNode(id=nid, cpus=cpus, memory_bytes=mem, hugepages=hp))
            row = _distance_row(fs, f"{base}/distance", columns, warnings)
            if row is not None:
                distances[nid] = row
    else:
        warnings.append(f"{fs.show(_NODE_DIR)}: no NUMA node directories; reporting one "
                        f"NUMA node 0 with every online CPU (a kernel without NUMA)")
        text = fs.read("proc/meminfo", warnings)
        total = _memtotal_bytes(text) if text is not None else None
        if total is None:
            warnings.append(f"{fs.show('proc/meminfo')}: no MemTotal line; memory reported as 0")
        hp = _hugepages(fs, "sys/kernel/mm/hugepages", warnings)
        nodes.append(DiscoveredNode(id=0, cpus=usable(existing), memory_bytes=total or 0,
                                    hugepages=hp))
        distances[0] = {0: LOCAL_DISTANCE}

    seen: dict[int, int] = {}
    for n in nodes:
        kept = []
        for c in n.cpus:
            if c in seen:
                warnings.append(f"{fs.show(_NODE_DIR)}: cpu {c} is listed on NUMA nodes "
                                f"{seen[c]} and {n.id}; kept on {seen[c]}")
                continue
            seen[c] = n.id
            kept.append(c)
        n.cpus = kept

    topology = _cpu_topology(fs, seen, warnings)
    pci = _pci_devices(fs, warnings)
    dm = DiscoveredMachine(root=str(root_path), nodes=nodes, cpus=topology, distances=distances,
                           pci=pci, warnings=warnings, numa_in_sysfs=numa_in_sysfs)
    if gpus:
        _add_gpus(dm, fs, nvidia_smi)
    return dm


def _online_cpus(fs: _Root, warnings: list[str]) -> Callable[[int], bool]:
    """A predicate: is CPU n online? ``cpu/online`` if present, else each ``cpuN/online``
    (a CPU without that file, like cpu0 that cannot go offline, is online)."""
    text = fs.read(f"{_CPU_DIR}/online", warnings)
    if text is not None:
        try:
            ids = set(_parse_idlist(text))
        except ValueError:
            warnings.append(f"{fs.show(_CPU_DIR + '/online')}: not a cpulist: "
                            f"{text.strip()[:60]!r}; using the per-CPU online files")
        else:
            return ids.__contains__

    def per_cpu(n: int) -> bool:
        t = fs.read(f"{_CPU_DIR}/cpu{n}/online")
        if t is None:
            return True
        if t.strip() not in ("0", "1"):
            warnings.append(f"{fs.show(f'{_CPU_DIR}/cpu{n}/online')}: expected 0 or 1, got "
                            f"{t.strip()[:20]!r}; taken as online")
            return True
        return t.strip() == "1"

    return per_cpu


def _node_cpus(fs: _Root, base: str, warnings: list[str]) -> list[int]:
    text = fs.read(f"{base}/cpulist", warnings)
    if text is not None:
        try:
            return _parse_idlist(text)
        except ValueError:
            warnings.append(f"{fs.show(base + '/cpulist')}: not a cpulist: "
                            f"{text.strip()[:60]!r}; trying cpumap")
    text = fs.read(f"{base}/cpumap", warnings)
    if text is not None:
        try:
            return _parse_cpumask(text)
        except ValueError:
            warnings.append(f"{fs.show(base + '/cpumap')}: not a CPU mask: "
                            f"{text.strip()[:60]!r}; using the cpuN entries")
    return _numbered(fs.listdir(base), "cpu")


def _node_memory(fs: _Root, base: str, warnings: list[str]) -> int:
    rel = f"{base}/meminfo"
    text = fs.read(rel, warnings)
    if text is None:
        warnings.append(f"{fs.show(rel)}: missing; the node's memory is reported as 0")
        return 0
    mem = _memtotal_bytes(text)
    if mem is None:
        warnings.append(f"{fs.show(rel)}: no MemTotal line; the node's memory is reported as 0")
        return 0
    return mem


def _hugepages(fs: _Root, rel: str, warnings: list[str]) -> dict[str, HugePages]:
    out: list[tuple[int, str, HugePages]] = []
    for name in fs.listdir(rel):
        m = _HUGEPAGE_DIR.match(name)
        if not m:
            continue
        size = int(m.group(1)) * 1024
        pages = _read_int(fs, f"{rel}/{name}/nr_hugepages", warnings, lo=0)
        if pages is None:
            continue
        out.append((size, format_bytes(size), HugePages(size_bytes=size, pages=pages)))
    return {label: hp for _, label, hp in sorted(out)}


def _distance_columns(fs: _Root, node_ids: list[int],
                      warnings: list[str]) -> dict[int, list[int]]:
    """Candidate column ids by row length: online node ids, else possible, else the dirs."""
    cands: dict[int, list[int]] = {}
    for fname in ("possible", "online"):  # online wins a tie of lengths
        text = fs.read(f"{_NODE_DIR}/{fname}", warnings)
        if text is None:
            continue
        try:
            ids = _parse_idlist(text)
        except ValueError:
            warnings.append(f"{fs.show(f'{_NODE_DIR}/{fname}')}: not a node list: "
                            f"{text.strip()[:60]!r}")
            continue
        if ids:
            cands[len(ids)] = ids
    cands.setdefault(len(node_ids), node_ids)
    return cands


def _distance_row(fs: _Root, rel: str, columns: Mapping[int, list[int]],
                  warnings: list[str]) -> dict[int, int] | None:
    text = fs.read(rel, warnings)
    if text is None:
        warnings.append(f"{fs.show(rel)}: missing; no distances for this node")
        return None
    try:
        values = [int(v) for v in text.split()]
    except ValueError:
        warnings.append(f"{fs.show(rel)}: not a row of integers: {text.strip()[:60]!r}; "
                        f"no distances for this node")
        return None
    if any(v < 0 for v in values):
        warnings.append(f"{fs.show(rel)}: negative distance in {text.strip()[:60]!r}; "
                        f"no distances for this node")
        return None
    ids = columns.get(len(values))
    if ids is None:
        known = ", ".join(f"{n}" for n in sorted(columns))
        warnings.append(f"{fs.show(rel)}: {len(values)} columns, but there are {known} "
                        f"online/possible nodes; no distances for this node")
        return None
    return dict(zip(ids, values, strict=True))


def _cpu_topology(fs: _Root, numa_of: Mapping[int, int],
                  warnings: list[str]) -> dict[int, CpuInfo]:
    """Socket and core of every CPU on a NUMA node, with cadvisor's core identity: CPUs
    with the same (NUMA node, physical_package_id, core_id) are one core; without core_id,
    the kernel's thread_siblings list decides."""
    raw: dict[int, tuple[int | None, int | None, list[int] | None]] = {}
    for c in sorted(numa_of):
        base = f"{_CPU_DIR}/cpu{c}/topology"
        pkg = _read_int(fs, f"{base}/physical_package_id", warnings)
        if pkg is not None and pkg < 0:
            pkg = None
        core_id = _read_int(fs, f"{base}/core_id", warnings)
        if core_id is not None and core_id < 0:
            core_id = None
        sib: list[int] | None = None
        for name, parse in (("thread_siblings_list", _parse_idlist),
                            ("core_cpus_list", _parse_idlist),
                            ("thread_siblings", _parse_cpumask)):
            text = fs.read(f"{base}/{name}", warnings)
            if text is None:
                continue
            try:
                sib = parse(text)
                break
            except ValueError:
                warnings.append(f"{fs.show(f'{base}/{name}')}: malformed: "
                                f"{text.strip()[:60]!r}")
        raw[c] = (pkg, core_id, sib)

    groups: dict[tuple[Any, ...], list[int]] = {}
    for c, (pkg, core_id, sib) in raw.items():
        key: tuple[Any, ...]
        if core_id is not None:
            key = ("core", numa_of[c], pkg, core_id)
        elif sib:
            key = ("sib", numa_of[c], tuple(sorted(s for s in set(sib) | {c} if s in numa_of)))
        else:
            key = ("cpu", c)
        groups.setdefault(key, []).append(c)
    out: dict[int, CpuInfo] = {}
    for members in groups.values():
        members.sort()
        for c in members:
            pkg, core_id, _ = raw[c]
            out[c] = CpuInfo(id=c, numa=numa_of[c], socket=pkg, core_id=core_id,
                             core=members[0], threads=list(members))
    return out


_PCI_ADDR = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def _pci_devices(fs: _Root, warnings: list[str]) -> list[PciDevice]:
    out: list[PciDevice] = []
    for addr in fs.listdir(_PCI_DIR):
        if not _PCI_ADDR.match(addr):
            continue
        base = f"{_PCI_DIR}/{addr}"
        rel = f"{base}/numa_node"
        text = fs.read(rel, warnings)
        numa: int | None = None
        has = False
        if text is not None:
            try:
                v = int(text.strip())
            except ValueError:
                warnings.append(f"{fs.show(rel)}: not an integer: {text.strip()[:40]!r}; "
                                f"the device is left out of the PCI map")
            else:
                has = True
                numa = v if v >= 0 else None

        def attr(name: str, base: str = base) -> str | None:
            t = fs.read(f"{base}/{name}")
            return t.strip().lower() if t is not None and t.strip() else None

        out.append(PciDevice(address=addr.lower(), numa_node=numa, has_numa_file=has,
                             class_code=attr("class"), vendor=attr("vendor"),
                             device=attr("device")))
    return out


# --------------------------------------------------------------------------- nvidia-smi


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|CPU|N/A|NA)$")
_TRAILERS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def _clean(text: str) -> str:
    return _ANSI.sub("", text).replace("\r", "")


def _bus_id_to_sysfs(bus_id: str) -> str:
    """nvidia-smi's "00000000:07:00.0" as sysfs names it: "0000:07:00.0"."""
    m = re.match(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$",
                 bus_id.strip())
    if not m:
        raise ValueError(f"{bus_id!r} is not a PCI bus id like 00000000:07:00.0")
    dom = int(m.group(1), 16)
    return f"{dom:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def parse_gpu_query(text: str, source: str = "nvidia-smi --query-gpu") -> list[GpuInfo]:
    """Parse ``nvidia-smi --query-gpu=index,uuid,pci.bus_id,memory.total,name
    --format=csv,noheader,nounits`` (memory in MiB)."""
    gpus: list[GpuInfo] = []
    for lineno, line in enumerate(_clean(text).splitlines(), 1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",", 4)]
        if len(parts) != 5:
            raise NvidiaSmiError(source, f"line {lineno}: expected 5 comma-separated fields "
                                         f"(index, uuid, pci.bus_id, memory.total, name), "
                                         f"got {line.strip()[:80]!r}")
        idx_s, uuid, bus, mem_s, name = parts
        if not idx_s.isdigit():
            raise NvidiaSmiError(source, f"line {lineno}: index {idx_s!r} is not a number")
        try:
            bus_sys = _bus_id_to_sysfs(bus)
        except ValueError as e:
            raise NvidiaSmiError(source, f"line {lineno}: {e}") from None
        mem: int | None
        mem_clean = mem_s.removesuffix("MiB").strip()
        if mem_clean.isdigit():
            mem = int(mem_clean) * 2**20
        elif mem_clean.startswith("[") or mem_clean in ("N/A", ""):
            mem = None  # "[N/A]", "[Not Supported]"
        else:
            raise NvidiaSmiError(source, f"line {lineno}: memory.total {mem_s!r} is not a "
                                         f"number of MiB")
        if uuid.startswith("[") or uuid == "N/A":
            uuid = ""
        gpus.append(GpuInfo(index=int(idx_s), uuid=uuid, pci_bus_id=bus_sys,
                            memory_bytes=mem, name=name))
    if len({g.index for g in gpus}) != len(gpus):
        raise NvidiaSmiError(source, "a GPU index is listed twice")
    return gpus


@dataclass
class TopoMatrix:
    labels: list[str]  # column labels in order: "GPU0", ..., "NIC0" / "mlx5_0", ...
    cells: dict[str, dict[str, str]]  # row label -> column label -> "NV12" / "PIX" / "X" ...
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, int | None] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)  # "NIC0" -> "mlx5_0"

    def gpu_indices(self) -> list[int]:
        return [int(lbl[3:]) for lbl in self.labels if re.fullmatch(r"GPU\d+", lbl)]

    def link(self, a: str, b: str) -> str | None:
        v = self.cells.get(a, {}).get(b)
        w = self.cells.get(b, {}).get(a)
        return v if v is not None else w


def parse_topo_matrix(text: str, source: str = "nvidia-smi topo -m") -> TopoMatrix:
    """Parse ``nvidia-smi topo -m``: tab or space separated, with or without the ANSI
    underline on the header, with or without NIC rows, ``NUMA Affinity`` and
    ``GPU NUMA ID`` columns."""
    lines = _clean(text).splitlines()
    header_at = None
    for i, line in enumerate(lines):
        toks = line.split()
        if toks and toks[0] == "GPU0" and (line[:1].isspace() or (len(toks) > 1
                                                                   and toks[1] != "X")):
            header_at = i
            break
    if header_at is None:
        raise NvidiaSmiError(source, "no header line with GPU0 found: not the output of "
                                     "'nvidia-smi topo -m'")
    header = lines[header_at].strip()
    fields = [f for f in re.split(r"\t+| {2,}", header) if f.strip()]
    labels: list[str] = []
    trailers: list[str] = []
    for f in fields:
        f = f.strip()
        if f in _TRAILERS or trailers:
            trailers.append(f)
            continue
        # a space-separated header cannot be told from "CPU Affinity" by width: split it
        for tok in f.split():
            if tok in ("CPU", "NUMA", "GPU") or trailers:
                trailers.append(tok)
            else:
                labels.append(tok)
    if not labels:
        raise NvidiaSmiError(source, "the header names no devices")
    if len(set(labels)) != len(labels):
        raise NvidiaSmiError(source, f"the header repeats a device: {labels}")
    has_numa = "NUMA" in " ".join(trailers)
    cells: dict[str, dict[str, str]] = {}
    cpu_aff: dict[str, str] = {}
    numa_aff: dict[str, int | None] = {}
    nic_names: dict[str, str] = {}
    label_set = set(labels)
    for lineno, line in enumerate(lines[header_at + 1:], header_at + 2):
        toks = line.split()
        if not toks:
            continue
        m = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", line)
        if m:
            nic_names[m.group(1)] = m.group(2)
            continue
        if toks[0].rstrip(":") == "Legend":
            continue
        if toks[0] not in label_set:
            continue
        row = toks[0]
        if row in cells:
            raise NvidiaSmiError(source, f"line {lineno}: row {row} is listed twice")
        vals = toks[1:]
        if len(vals) < len(labels):
            raise NvidiaSmiError(source, f"line {lineno}: row {row} has {len(vals)} cells, "
                                         f"expected {len(labels)}")
        rowcells: dict[str, str] = {}
        for lbl, v in zip(labels, vals[:len(labels)], strict=True):
            if not _CELL.match(v):
                raise NvidiaSmiError(source, f"line {lineno}: row {row}, column {lbl}: "
                                             f"unknown link {v!r}")
            rowcells[lbl] = v
        cells[row] = rowcells
        extra = vals[len(labels):]
        if extra:
            cpu_aff[row] = extra[0]
        if has_numa and len(extra) >= 2:
            numa_aff[row] = int(extra[1]) if extra[1].isdigit() else None
    missing = [lbl for lbl in labels if lbl.startswith("GPU") and lbl not in cells]
    if missing:
        raise NvidiaSmiError(source, f"no rows for {', '.join(missing)}")
    return TopoMatrix(labels=labels, cells=cells, cpu_affinity=cpu_aff,
                      numa_affinity=numa_aff, nic_names=nic_names)


def _nv_links(cell: str | None) -> int:
    if cell and cell.startswith("NV") and cell[2:].isdigit():
        return int(cell[2:])
    return 0


def nvlink_islands(topo: TopoMatrix) -> list[list[int]]:
    """Partition the GPUs linked by NVLink into islands: cliques (every GPU linked to every
    other), largest first. A hybrid cube mesh (DGX-1) gives its two quads, an NVSwitch
    system (DGX A100) one island of all GPUs. GPUs without NVLink peers are in none."""
    gpus = topo.gpu_indices()
    adj: dict[int, set[int]] = {g: set() for g in gpus}
    for a in gpus:
        for b in gpus:
            if a != b and _nv_links(topo.link(f"GPU{a}", f"GPU{b}")):
                adj[a].add(b)
                adj[b].add(a)
    left = {g for g in gpus if adj[g]}
    islands: list[list[int]] = []
    while left:
        best: list[int] = []
        for clique in _maximal_cliques(left, adj):
            c = sorted(clique)
            if len(c) > len(best) or (len(c) == len(best) and c < best):
                best = c
        if len(best) < 2:
            break
        islands.append(best)
        left -= set(best)
    return sorted(islands, key=lambda isl: isl[0])


def _maximal_cliques(nodes: set[int], adj: Mapping[int, set[int]]) -> list[set[int]]:
    out: list[set[int]] = []

    def bk(r: set[int], p: set[int], x: set[int]) -> None:
        if not p and not x:
            out.append(r)
            return
        pivot = max(p | x, key=lambda v: len(adj[v] & p))
        for v in sorted(p - adj[pivot]):
            bk(r | {v}, p & adj[v], x & adj[v])
            p = p - {v}
            x = x | {v}

    bk(set(), set(nodes), set())
    return out


def _pcie_groups(topo: TopoMatrix) -> list[list[int]]:
    """GPUs behind a shared PCIe switch, as connected components: two GPUs are joined when
    their cell is PIX or PXB, or when both are PIX/PXB to the same other device (a NIC).
    The second rule matters where NVLink hides the PCIe path: a GPU pair linked by NVLink
    shows ``NV#``, not ``PIX``."""
    gpus = topo.gpu_indices()
    parent = {g: g for g in gpus}
    near = ("PIX", "PXB")

    def find(g: int) -> int:
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    others = [lbl for lbl in topo.labels if not re.fullmatch(r"GPU\d+", lbl)]
    for a in gpus:
        for b in gpus:
            if a >= b:
                continue
            if topo.link(f"GPU{a}", f"GPU{b}") in near or any(
                    topo.link(f"GPU{a}", o) in near and topo.link(f"GPU{b}", o) in near
                    for o in others):
                parent[find(b)] = find(a)
    comps: dict[int, list[int]] = {}
    for g in gpus:
        comps.setdefault(find(g), []).append(g)
    return sorted((sorted(c) for c in comps.values()), key=lambda c: c[0])


def gpu_groups(topo: TopoMatrix) -> dict[int, dict[str, str]]:
    """GPU index -> ``{nvlink: nvlinkK, pcie: pcieK}`` (outermost first). Every GPU has a
    ``pcie`` group; only GPUs with NVLink peers have an ``nvlink`` group."""
    out: dict[int, dict[str, str]] = {g: {} for g in topo.gpu_indices()}
    for k, island in enumerate(nvlink_islands(topo)):
        for g in island:
            out[g]["nvlink"] = f"nvlink{k}"
    for k, comp in enumerate(_pcie_groups(topo)):
        for g in comp:
            out[g]["pcie"] = f"pcie{k}"
    return out


def _run(cmd: Sequence[str]) -> str:
    shown = " ".join(cmd)
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True,
                              timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise NvidiaSmiError(cmd[0], "not found") from None
    except PermissionError:
        raise NvidiaSmiError(cmd[0], "is not executable") from None
    except subprocess.TimeoutExpired:
        raise NvidiaSmiError(shown, f"did not finish in {NVIDIA_SMI_TIMEOUT_S:g}s") from None
    except OSError as e:
        raise NvidiaSmiError(cmd[0], f"cannot run: {e.strerror or e}") from None
    if proc.returncode != 0:
        msg = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        first = _clean(msg[0]) if msg else ""
        raise NvidiaSmiError(shown, f"exited with status {proc.returncode}"
                                    + (f": {first}" if first else ""))
    return proc.stdout


def run_nvidia_smi(program: str = "nvidia-smi") -> tuple[list[GpuInfo], TopoMatrix | None]:
    """Run ``nvidia-smi`` twice (the GPU query and ``topo -m``) and parse both. The
    topology matrix is None on a machine with one GPU or where ``topo`` fails."""
    gpus = parse_gpu_query(_run([program, *GPU_QUERY_ARGS]))
    topo: TopoMatrix | None = None
    if len(gpus) > 1:
        topo = parse_topo_matrix(_run([program, *TOPO_ARGS]))
    return gpus, topo


def _add_gpus(dm: DiscoveredMachine, fs: _Root, program: str | None) -> None:
    explicit = program is not None
    if program is None:
        try:
            live = fs.root.resolve() == Path("/")
        except OSError:
            live = False
        found = shutil.which("nvidia-smi") if live else None
        if found is None:
            return
        program = found
    try:
        gpus, topo = run_nvidia_smi(program)
    except NvidiaSmiError as e:
        if explicit:
            raise
        dm.warnings.append(f"{e}; no GPUs reported")
        return
    attach_gpus(dm, gpus, topo)


def attach_gpus(dm: DiscoveredMachine, gpus: list[GpuInfo], topo: TopoMatrix | None) -> None:
    """Give the GPUs their NUMA node (sysfs first, ``topo -m``'s NUMA Affinity second),
    NVLink peers and groups, and add them to ``dm``."""
    pci = {p.address: p for p in dm.pci}
    groups = gpu_groups(topo) if topo is not None else {}
    for g in gpus:
        dev = pci.get(g.pci_bus_id)
        if dev is not None and dev.has_numa_file:
            g.numa_node = dev.numa_node
        elif topo is not None and topo.numa_affinity.get(f"GPU{g.index}") is not None:
            g.numa_node = topo.numa_affinity[f"GPU{g.index}"]
        elif dev is None:
            dm.warnings.append(f"GPU {g.index} ({g.pci_bus_id}) is not under "
                               f"{_PCI_DIR}; its NUMA node is unknown")
        if topo is not None:
            for other in topo.gpu_indices():
                n = _nv_links(topo.link(f"GPU{g.index}", f"GPU{other}"))
                if other != g.index and n:
                    g.nvlinks[other] = n
        g.groups = dict(groups.get(g.index, {}))
    if topo is not None:
        known = {g.index for g in gpus}
        extra = [i for i in topo.gpu_indices() if i not in known]
        if extra:
            dm.warnings.append(f"nvidia-smi topo -m lists GPUs {extra} that the GPU query "
                               f"does not")
    dm.gpus = sorted(gpus, key=lambda g: g.index)


# --------------------------------------------------------------------------- machine model


def _parse_pci_resources(pci_resources: Mapping[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, res in (pci_resources or {}).items():
        if "/" not in res:
            raise MachineError(f"pci resource {key}", f"{res!r} is not an extended resource "
                                                      f"name like 'example.com/nic'")
        k = key.strip().lower()
        if ":" in k and not _PCI_ADDR.match(k):
            v, _, d = k.partition(":")
            k = f"{_hex4(v)}:{_hex4(d)}"
        out[k] = res
    return out


def machine_dict(dm: DiscoveredMachine, name: str, *, description: str = "",
                 pci_resources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The discovered machine as a machine file document (``tests/fixtures/machines``).

    Devices: GPUs found by nvidia-smi as ``nvidia.com/gpu`` (id = UUID, memory, groups);
    PCI devices whose ``vendor:device`` (e.g. ``15b3:101b``) or address is a key of
    ``pci_resources`` as that resource. Distances only when every node has a full row."""
    ids = dm.numa_ids
    doc: dict[str, Any] = {"name": name}
    doc["description"] = description or f"discovered from {dm.root}"
    nodes: list[dict[str, Any]] = []
    for n in dm.nodes:
        entry: dict[str, Any] = {"id": n.id, "cpus": _cpulist_str(n.cpus),
                                 "memory": format_bytes(n.memory_bytes)}
        hp = {size: format_bytes(h.total_bytes) for size, h in n.hugepages.items()
              if h.pages > 0}
        if hp:
            entry["hugepages"] = hp
        nodes.append(entry)
    doc["numaNodes"] = nodes
    if all(i in dm.distances and all(j in dm.distances[i] for j in ids) for i in ids):
        doc["distances"] = [[dm.distances[i][j] for j in ids] for i in ids]

    cpus = [dm.cpus[c] for c in sorted(dm.cpus)]
    if cpus:
        topo: dict[str, Any] = {}
        threads = max(len(c.threads) for c in cpus)
        topo["threadsPerCore"] = min(max(threads, 1), 8)
        socket_of_numa: dict[int, int] = {}
        for nid in ids:
            socks = Counter(c.socket for c in cpus if c.numa == nid and c.socket is not None)
            if socks:
                socket_of_numa[nid] = socks.most_common(1)[0][0]
            elif any(c.numa == nid for c in cpus):
                socket_of_numa[nid] = -1  # unknown: filled in below
        next_free = max([s for s in socket_of_numa.values()] + [-1]) + 1
        for nid, s in sorted(socket_of_numa.items()):
            if s == -1:
                socket_of_numa[nid] = next_free
                next_free += 1
        by_socket: dict[int, list[int]] = {}
        for nid, s in socket_of_numa.items():
            by_socket.setdefault(s, []).append(nid)
        topo["sockets"] = [{"id": s, "numaNodes": sorted(ns)} for s, ns in
                           sorted(by_socket.items())]
        cores: dict[int, list[int]] = {}
        for c in cpus:
            cores.setdefault(c.core, []).append(c.id)
        topo["siblings"] = [_cpulist_str(m) for _, m in sorted(cores.items())]
        doc["cpuTopology"] = topo

    devices: list[dict[str, Any]] = []
    for g in dm.gpus:
        d: dict[str, Any] = {"resource": GPU_RESOURCE, "id": g.device_id,
                             "numaNode": g.numa_node if g.numa_node in ids else None}
        if g.memory_bytes is not None:
            d["memory"] = format_bytes(g.memory_bytes)
        if g.groups:
            d["groups"] = dict(g.groups)
        devices.append(d)
    resources = _parse_pci_resources(pci_resources)
    if resources:
        gpu_addrs = {g.pci_bus_id for g in dm.gpus}
        counts: Counter[str] = Counter()
        for p in sorted(dm.pci, key=lambda p: p.address):
            res = resources.get(p.address) or resources.get(p.vendor_device or "")
            if res is None or p.address in gpu_addrs:
                continue
            devices.append({"resource": res, "id": p.address,
                            "numaNode": p.numa_node if p.numa_node in ids else None})
            counts[res] += 1
    if devices:
        doc["devices"] = devices
    return doc


def to_machine(dm: DiscoveredMachine, name: str, *, description: str = "",
               pci_resources: Mapping[str, str] | None = None) -> Machine:
    """The engine's machine model of a discovered machine, checked exactly as a machine
    file is (:func:`machine_from_dict`; raises ``MachineError``). Cores are numbered as the
    machine file numbers them; each CPU keeps its exact socket, which the file format can
    only give per NUMA node."""
    doc = machine_dict(dm, name, description=description, pci_resources=pci_resources)
    m = machine_from_dict(doc, source=f"discovered machine {name}")
    numa_of = {c: n.id for n in m.numa_nodes for c in n.cpus}
    sockets = {cpu.numa: cpu.socket for cpu in m.cpus.values()}
    exact = {
        c: CPU(id=c, core=m.cpus[c].core,  # the machine file's numbering of the same cores
               socket=info.socket if info.socket is not None else sockets.get(numa_of[c], 0),
               numa=numa_of[c])
        for c, info in dm.cpus.items() if c in numa_of and c in m.cpus
    }
    return replace(m, cpus=exact)


def _cpulist_str(cpus: Iterable[int]) -> str:
    return format_cpulist(set(cpus))
