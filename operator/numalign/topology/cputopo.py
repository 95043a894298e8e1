"""A machine's CPU topology (core and socket of every CPU) as compact plain data, and back.

The node agent publishes it in ``NodeTopology status.cpuTopology`` so that the live mode
of ``numalign explain`` rebuilds :attr:`Machine.cpus` exactly: the static CPU policy picks
whole sockets and cores, with ties broken by id, so a replay with another core numbering
could pick other CPUs. The form (the NUMA node of each CPU comes from the zones)::

    threadsPerCore: 2              # sibling threads are cpu N and N + (total cpus / 2) ...
    sockets:                       # ... with core id = the lowest sibling, unless
    - {id: 0, numaNodes: [0, 1]}   # siblings is given
    siblings: ["0,64", "1,65"]     # optional: one cpulist per core, in core id order
    coreIds: [0, 1]                # optional: the core ids of siblings (default 0, 1, ...)

A socket lists ``cpus`` (a cpulist) only when some NUMA node's CPUs sit on more than one
socket; then every socket lists them and they decide. The form is the machine file's
``cpuTopology`` (``threadsPerCore``, ``sockets``, ``siblings``) plus ``coreIds`` and the
sockets' ``cpus``, so a machine file's own topology is published as written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import MachineError
from .machine import CPU, Machine
from .quantity import format_cpulist, parse_cpulist

JSON = dict[str, Any]


def _default_cores(all_cpus: list[int], threads: int) -> dict[int, int] | None:
    """The machine file's core numbering for ``threadsPerCore`` (None: not applicable)."""
    if threads <= 1:
        return {c: c for c in all_cpus}
    if len(all_cpus) % threads:
        return None
    per = len(all_cpus) // threads
    return {c: all_cpus[i % per] for i, c in enumerate(all_cpus)}


def cpu_topology_json(machine: Machine) -> JSON:
    """The compact form of ``machine.cpus`` (see the module docstring)."""
    cpus = machine.cpus
    all_cpus = sorted(cpus)
    by_core: dict[int, list[int]] = {}
    for c in all_cpus:
        by_core.setdefault(cpus[c].core, []).append(c)
    threads = max((len(v) for v in by_core.values()), default=1)
    out: JSON = {"threadsPerCore": threads}

    sockets: dict[int, list[int]] = {}
    numa_sockets: dict[int, set[int]] = {}
    for c in all_cpus:
        cpu = cpus[c]
        sockets.setdefault(cpu.socket, []).append(c)
        numa_sockets.setdefault(cpu.numa, set()).add(cpu.socket)
    split = any(len(s) > 1 for s in numa_sockets.values())
    entries: list[JSON] = []
    for sid in sorted(sockets):
        numa = sorted({cpus[c].numa for c in sockets[sid]})
        entry: JSON = {"id": sid, "numaNodes": numa}
        if split:
            entry["cpus"] = format_cpulist(sockets[sid])
        entries.append(entry)
    out["sockets"] = entries

    want = {c: cpus[c].core for c in all_cpus}
    if _default_cores(all_cpus, threads) != want:
        core_ids = sorted(by_core)
        out["siblings"] = [format_cpulist(by_core[k]) for k in core_ids]
        if core_ids != list(range(len(core_ids))):
            out["coreIds"] = core_ids
    return out


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise MachineError(where, f"must be a non-negative integer, got {v!r}")
    return v


def _cpulist(v: Any, where: str) -> list[int]:
    try:
        return parse_cpulist(str(v))
    except ValueError as e:
        raise MachineError(where, str(e)) from None


def cpus_from_topology(numa_of: Mapping[int, int], raw: Mapping[str, Any] | None,
                       where: str = "cpuTopology") -> dict[int, CPU]:
    """``Machine.cpus`` from the NUMA node of every CPU and the compact form ``raw``
    (None: one thread per core, one socket per NUMA node). Raises MachineError naming
    the field."""
    all_cpus = sorted(numa_of)
    if raw is None:
        return {c: CPU(id=c, core=c, socket=numa_of[c], numa=numa_of[c]) for c in all_cpus}
    if not isinstance(raw, Mapping):
        raise MachineError(where, "must be a mapping")
    threads = _int(raw.get("threadsPerCore", 1), f"{where}.threadsPerCore") or 1

    socket_of: dict[int, int] = {}
    socket_of_numa: dict[int, int] = {}
    socks = raw.get("sockets") or []
    if not isinstance(socks, list):
        raise MachineError(f"{where}.sockets", "must be a list")
    for i, s in enumerate(socks):
        w = f"{where}.sockets[{i}]"
        if not isinstance(s, Mapping):
            raise MachineError(w, "must be a mapping with id and numaNodes")
        sid = _int(s.get("id"), f"{w}.id")
        for n in s.get("numaNodes") or []:
            socket_of_numa[_int(n, f"{w}.numaNodes")] = sid
        if s.get("cpus") is not None:
            for c in _cpulist(s["cpus"], f"{w}.cpus"):
                socket_of[c] = sid

    core_of: dict[int, int] = {}
    siblings = raw.get("siblings")
    if siblings is not None:
        if not isinstance(siblings, list):
            raise MachineError(f"{where}.siblings", "must be a list of cpulists")
        ids = raw.get("coreIds")
        if ids is None:
            core_ids = list(range(len(siblings)))
        elif isinstance(ids, list) and len(ids) == len(siblings):
            core_ids = [_int(k, f"{where}.coreIds[{j}]") for j, k in enumerate(ids)]
        else:
            raise MachineError(f"{where}.coreIds", "must list one core id per siblings entry")
        for i, group in enumerate(siblings):
            for c in _cpulist(group, f"{where}.siblings[{i}]"):
                core_of[c] = core_ids[i]
        for c in all_cpus:
            core_of.setdefault(c, len(siblings) + c)
    else:
        default = _default_cores(all_cpus, threads)
        if default is None:
            raise MachineError(f"{where}.threadsPerCore", f"{len(all_cpus)} CPUs do not "
                               f"split into cores of {threads} threads")
        core_of = default
    out: dict[int, CPU] = {}
    for c in all_cpus:
        numa = numa_of[c]
        sock = socket_of.get(c, socket_of_numa.get(numa, numa))
        out[c] = CPU(id=c, core=core_of[c], socket=sock, numa=numa)
    return out
