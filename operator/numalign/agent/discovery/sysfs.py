"""Node discovery from sysfs: NUMA nodes, CPUs, memory, hugepages, distances and PCI
devices (GPUs then come from :mod:`.nvidia_smi`).

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
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from numalign.topology.hints import mask_ids
from numalign.topology.quantity import format_bytes, parse_cpulist

from .model import (
    LOCAL_DISTANCE,
    PCI_DIR,
    CpuInfo,
    DiscoveredMachine,
    DiscoveredNode,
    DiscoveryError,
    HugePages,
    PciDevice,
)
from .nvidia_smi import add_gpus

_NODE_DIR = "sys/devices/system/node"
_CPU_DIR = "sys/devices/system/cpu"
_MAX_LINK_HOPS = 40


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
        add_gpus(dm, fs.root, nvidia_smi)
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


PCI_ADDR = re.compile(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


def _pci_devices(fs: _Root, warnings: list[str]) -> list[PciDevice]:
    out: list[PciDevice] = []
    for addr in fs.listdir(PCI_DIR):
        if not PCI_ADDR.match(addr):
            continue
        base = f"{PCI_DIR}/{addr}"
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
