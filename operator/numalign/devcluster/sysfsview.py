"""A sysfs view of a machine file, for a real kubelet to see that machine's NUMA layout.

:func:`write_sysfs_view` writes ``sys/devices/system/{node,cpu}`` under a directory: what
the kubelet (cadvisor) and numalign's own discovery read — each NUMA node's ``cpuN``
links, ``cpulist``, ``cpumap``, ``meminfo``, ``distance`` and hugepages, and each CPU's
``topology/{core_id,physical_package_id,thread_siblings_list,...}``. The real node lays
the two folders over the machine's own in the kubelet's mount namespace.

The machine file's CPUs are mapped onto this machine's real CPU ids (in order), so that
the cpusets the kubelet writes stay valid: a machine file of two NUMA nodes with CPUs 0
and 1 on a machine whose usable CPUs are 4 and 5 puts CPU 4 on node 0 and CPU 5 on node 1.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from numalign.topology.machine import CPU, Machine, NumaNode
from numalign.topology.quantity import format_cpulist, quantity_bytes

LOCAL_DISTANCE = 10
REMOTE_DISTANCE = 20
VIEW_DIRS = ("sys/devices/system/node", "sys/devices/system/cpu")


class SysfsViewError(ValueError):
    """The machine file does not fit onto this machine's CPUs."""


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (what a container's cpuset may use)."""
    return sorted(os.sched_getaffinity(0))


def map_onto(machine: Machine, real_cpus: Sequence[int]) -> Machine:
    """``machine`` with its CPUs renumbered onto ``real_cpus`` (the i-th smallest CPU id
    becomes the i-th smallest real one); errors when the machine has more CPUs."""
    ids = sorted(machine.cpus)
    real = sorted(set(real_cpus))
    if len(ids) > len(real):
        raise SysfsViewError(
            f"machine {machine.name!r} has {len(ids)} CPUs but this machine has only "
            f"{len(real)} usable ({format_cpulist(real)}): use a machine file with at most "
            f"{len(real)} CPUs")
    to_real = dict(zip(ids, real, strict=False))
    if all(k == v for k, v in to_real.items()):
        return machine
    nodes = tuple(replace(n, cpus=tuple(to_real[c] for c in n.cpus)) for n in machine.numa_nodes)
    # Core ids stay machine-wide: a core is named by its smallest (renumbered) thread.
    by_core: dict[int, list[int]] = {}
    for c in ids:
        by_core.setdefault(machine.cpus[c].core, []).append(to_real[c])
    core_name = {core: min(threads) for core, threads in by_core.items()}
    cpus = {to_real[c]: CPU(id=to_real[c], core=core_name[cpu.core], socket=cpu.socket,
                            numa=cpu.numa)
            for c, cpu in machine.cpus.items()}
    return replace(machine, numa_nodes=nodes, cpus=cpus)


def _cpumap(cpus: Sequence[int], width: int) -> str:
    """A kernel CPU mask: 32-bit hex words, most significant first, comma-separated."""
    mask = 0
    for c in cpus:
        mask |= 1 << c
    words = max(1, (width + 31) // 32)
    parts = [f"{(mask >> (32 * i)) & 0xFFFFFFFF:08x}" for i in reversed(range(words))]
    return ",".join(parts)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")


def _meminfo(node: NumaNode) -> str:
    kb = node.memory // 1024
    hp = sum(node.hugepages.values()) // 1024
    return "".join(f"Node {node.id} {key}:{val:>16} kB\n" for key, val in (
        ("MemTotal", kb), ("MemFree", max(kb - hp, 0)), ("MemUsed", hp)))


def _hugepage_dir(size: str) -> str:
    return f"hugepages-{quantity_bytes(size) // 1024}kB"


def _distances(machine: Machine, node: NumaNode) -> list[int]:
    ids = machine.numa_ids
    if machine.distances is not None:
        return [machine.distances[node.id][other] for other in ids]
    return [LOCAL_DISTANCE if other == node.id else REMOTE_DISTANCE for other in ids]


def write_sysfs_view(machine: Machine, root: Path, real_cpus: Sequence[int] | None = None
                     ) -> Machine:
    """Write ``root/sys/devices/system/{node,cpu}`` for ``machine`` mapped onto
    ``real_cpus`` (default: :func:`usable_cpus`); return the mapped machine. Replaces a
    view that is already there."""
    mapped = map_onto(machine, usable_cpus() if real_cpus is None else real_cpus)
    for rel in VIEW_DIRS:
        shutil.rmtree(root / rel, ignore_errors=True)
    node_dir = root / VIEW_DIRS[0]
    cpu_dir = root / VIEW_DIRS[1]
    all_cpus = sorted(mapped.cpus)
    width = (max(all_cpus) + 1) if all_cpus else 1
    ids = mapped.numa_ids
    with_cpus = [n.id for n in mapped.numa_nodes if n.cpus]
    with_mem = [n.id for n in mapped.numa_nodes if n.memory]
    for name, listed in (("online", ids), ("possible", ids), ("has_cpu", with_cpus),
                         ("has_memory", with_mem), ("has_normal_memory", with_mem)):
        _write(node_dir / name, format_cpulist(listed))
    for node in mapped.numa_nodes:
        d = node_dir / f"node{node.id}"
        d.mkdir(parents=True, exist_ok=True)
        _write(d / "cpulist", format_cpulist(node.cpus))
        _write(d / "cpumap", _cpumap(node.cpus, width))
        _write(d / "meminfo", _meminfo(node))
        _write(d / "distance", " ".join(str(v) for v in _distances(mapped, node)))
        for size, total in sorted(node.hugepages.items()):
            pages = total // quantity_bytes(size)
            hd = d / "hugepages" / _hugepage_dir(size)
            for f, n in (("nr_hugepages", pages), ("free_hugepages", pages),
                         ("surplus_hugepages", 0)):
                _write(hd / f, str(n))
        for c in node.cpus:
            (d / f"cpu{c}").symlink_to(f"../../cpu/cpu{c}")
    text = format_cpulist(all_cpus)
    for name in ("online", "possible", "present"):
        _write(cpu_dir / name, text)
    _write(cpu_dir / "offline", "")
    for c in all_cpus:
        cpu = mapped.cpus[c]
        siblings = sorted(o for o, other in mapped.cpus.items()
                          if other.core == cpu.core and other.socket == cpu.socket)
        package = sorted(o for o, other in mapped.cpus.items() if other.socket == cpu.socket)
        t = cpu_dir / f"cpu{c}" / "topology"
        for f, v in (("core_id", str(cpu.core)), ("physical_package_id", str(cpu.socket)),
                     ("die_id", "0"), ("cluster_id", str(cpu.core)),
                     ("thread_siblings_list", format_cpulist(siblings)),
                     ("core_cpus_list", format_cpulist(siblings)),
                     ("thread_siblings", _cpumap(siblings, width)),
                     ("core_siblings_list", format_cpulist(package)),
                     ("package_cpus_list", format_cpulist(package))):
            _write(t / f, v)
        _write(cpu_dir / f"cpu{c}" / "online", "1")
        (cpu_dir / f"cpu{c}" / f"node{cpu.numa}").symlink_to(f"../../node/node{cpu.numa}")
    return mapped
