"""Exclusive CPU picking as the kubelet's static CPU manager policy does it.

``take_by_topology`` follows ``takeByTopologyNUMAPacked`` (cpu_assignment.go): take whole
NUMA nodes and whole sockets (the level higher in the hierarchy first) when the request
needs at least that many CPUs, then whole cores, then single threads, always walking the
candidates "packed": the socket / NUMA node / core with the fewest available CPUs first,
ties by lower id. ``allocate_cpus`` follows ``allocateCPUs``: the CPUs inside the NUMA
affinity first, the rest (if the affinity cannot hold the request) from anywhere.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable

from .hints import NumaMask
from .machine import Machine


class _Topo:
    def __init__(self, machine: Machine) -> None:
        cpus = machine.cpus.values()
        self.numa_of = {c.id: c.numa for c in cpus}
        self.core_of = {c.id: c.core for c in cpus}
        self.socket_of = {c.id: c.socket for c in cpus}
        self.by_numa: dict[int, set[int]] = {}
        self.by_core: dict[int, set[int]] = {}
        self.by_socket: dict[int, set[int]] = {}
        for c in cpus:
            self.by_numa.setdefault(c.numa, set()).add(c.id)
            self.by_core.setdefault(c.core, set()).add(c.id)
            self.by_socket.setdefault(c.socket, set()).add(c.id)
        n = len(self.numa_of)
        self.cpus_per_core = n // max(1, len(self.by_core))
        self.cpus_per_socket = n // max(1, len(self.by_socket))
        # NUMA nodes above sockets in the hierarchy (one NUMA node spans sockets) when there
        # are at least as many sockets as NUMA nodes: then NUMA nodes are taken first.
        self.numa_first = len(self.by_socket) >= len(self.by_numa)


# A machine's _Topo (read, never changed), by live Machine object (an entry goes with
# its machine) and by CPU layout (machines read from separate documents of the same
# hardware share one; bounded, oldest out first).
_BY_MACHINE: dict[int, _Topo] = {}
_BY_LAYOUT: dict[tuple[tuple[int, int, int, int], ...], _Topo] = {}
LAYOUT_CACHE_SIZE = 64


def _topo(machine: Machine) -> _Topo:
    t = _BY_MACHINE.get(id(machine))
    if t is not None:
        return t
    layout = tuple((c.id, c.core, c.socket, c.numa) for c in machine.cpus.values())
    t = _BY_LAYOUT.get(layout)
    if t is None:
        t = _Topo(machine)
        if len(_BY_LAYOUT) >= LAYOUT_CACHE_SIZE:
            _BY_LAYOUT.pop(next(iter(_BY_LAYOUT)), None)
        _BY_LAYOUT[layout] = t
    _BY_MACHINE[id(machine)] = t
    weakref.finalize(machine, _BY_MACHINE.pop, id(machine), None)
    return t


class _Acc:
    def __init__(self, topo: _Topo, available: set[int], n: int) -> None:
        self.t = topo
        self.avail = set(available)
        self.need = n
        self.result: list[int] = []

    def take(self, cpus: Iterable[int]) -> None:
        s = sorted(cpus)
        self.result.extend(s)
        self.avail.difference_update(s)
        self.need -= len(s)

    def count(self, group: dict[int, set[int]], gid: int) -> int:
        return len(group[gid] & self.avail)

    def _sorted(self, ids: Iterable[int], group: dict[int, set[int]]) -> list[int]:
        return sorted(ids, key=lambda i: (self.count(group, i), i))

    def _present(self, group: dict[int, set[int]], of: dict[int, int],
                 within: set[int] | None = None) -> set[int]:
        cpus = self.avail if within is None else self.avail & within
        return set(map(of.__getitem__, cpus))

    def sorted_sockets(self) -> list[int]:
        t = self.t
        if t.numa_first:
            out: list[int] = []
            for numa in self.sorted_numas():
                out += self._sorted(self._present(t.by_socket, t.socket_of, t.by_numa[numa]),
                                    t.by_socket)
            return out
        return self._sorted(self._present(t.by_socket, t.socket_of), t.by_socket)

    def sorted_numas(self) -> list[int]:
        t = self.t
        if t.numa_first:
            return self._sorted(self._present(t.by_numa, t.numa_of), t.by_numa)
        out: list[int] = []
        for sock in self.sorted_sockets():
            out += self._sorted(self._present(t.by_numa, t.numa_of, t.by_socket[sock]), t.by_numa)
        return out

    def sorted_cores(self) -> list[int]:
        t = self.t
        out: list[int] = []
        if t.numa_first:
            for sock in self.sorted_sockets():
                out += self._sorted(self._present(t.by_core, t.core_of, t.by_socket[sock]),
                                    t.by_core)
        else:
            for numa in self.sorted_numas():
                out += self._sorted(self._present(t.by_core, t.core_of, t.by_numa[numa]),
                                    t.by_core)
        return out

    def _take_full(self, ids: Callable[[], list[int]], group: dict[int, set[int]],
                   is_free: Callable[[int], bool]) -> None:
        for gid in ids():
            if self.need <= 0:
                return
            if not is_free(gid):
                continue
            cpus = group[gid]
            if self.need < len(cpus):
                continue
            self.take(cpus)

    def take_full_numas(self) -> None:
        t = self.t
        self._take_full(self.sorted_numas, t.by_numa,
                        lambda i: t.by_numa[i] <= self.avail)

    def take_full_sockets(self) -> None:
        t = self.t
        self._take_full(self.sorted_sockets, t.by_socket,
                        lambda i: len(t.by_socket[i] & self.avail) == t.cpus_per_socket)

    def take_full_cores(self) -> None:
        t = self.t
        self._take_full(self.sorted_cores, t.by_core,
                        lambda i: len(t.by_core[i] & self.avail) == t.cpus_per_core)

    def take_remaining(self) -> None:
        for core in self.sorted_cores():
            for c in sorted(self.t.by_core[core] & self.avail):
                if self.need <= 0:
                    return
                self.take([c])


def take_by_topology(machine: Machine, available: Iterable[int], n: int) -> list[int] | None:
    """Pick ``n`` CPUs out of ``available`` the way the static policy packs them; None if
    there are not enough."""
    avail = set(available)
    if n <= 0:
        return []
    if n > len(avail):
        return None
    acc = _Acc(_topo(machine), avail, n)
    if acc.t.numa_first:
        acc.take_full_numas()
        acc.take_full_sockets()
    else:
        acc.take_full_sockets()
        acc.take_full_numas()
    if acc.need > 0:
        acc.take_full_cores()
    if acc.need > 0:
        acc.take_remaining()
    if acc.need > 0:  # pragma: no cover - enough CPUs were checked above
        return None
    return sorted(acc.result)


def allocate_cpus(machine: Machine, available: Iterable[int], n: int,
                  affinity: NumaMask | None) -> list[int] | None:
    """CPUs inside the NUMA affinity first (by topology), then the rest from anywhere."""
    avail = set(available)
    if n > len(avail):
        return None
    result: list[int] = []
    if affinity is not None:
        numa_of = _topo(machine).numa_of
        aligned = {c for c in avail if affinity >> numa_of[c] & 1}
        got = take_by_topology(machine, aligned, min(n, len(aligned)))
        if got is None:  # pragma: no cover
            return None
        result = got
        if len(result) == n:
            return sorted(result)
    rest = take_by_topology(machine, avail.difference(result), n - len(result))
    if rest is None:
        return None
    return sorted(result + rest)
