"""The CPU manager's static policy as a hint provider: exclusive whole CPUs for a
Guaranteed pod's integer CPU requests, picked by topology inside the affinity."""

from __future__ import annotations

from collections.abc import Sequence

from ..cpu_assign import allocate_cpus
from ..demands import cpu_demand, guaranteed_cpus
from ..hints import TopologyHint
from ..ledger import ContainerAllocation
from ..pod import Container
from .base import Admission, AllocationFailed, Ask


class CpuProvider:
    name = "cpu"
    manager = "cpu"
    claims: frozenset[str] = frozenset()
    room_by_counts = True
    allocation_order = 1

    def __init__(self, admission: Admission) -> None:
        self.a = admission

    def ask(self, unit: Sequence[Container]) -> Ask:
        a = self.a
        n = a.unit_value(unit, lambda c: guaranteed_cpus(a.pod, c))
        return Ask([cpu_demand(a.machine, a.work, a.pod.uid, n)] if n else [])

    def hints(self, ask: Ask,
              lists: Sequence[list[TopologyHint]]) -> dict[str, list[TopologyHint] | None]:
        return {"cpu": lists[0]} if lists else {}

    def report(self) -> None:
        return None

    def allocate(self, c: Container, hint: TopologyHint, alloc: ContainerAllocation) -> None:
        a = self.a
        n = guaranteed_cpus(a.pod, c)
        if not n:
            return
        mask = hint.mask
        usable = a.work.free_cpus() | a.work.reusable_cpus(a.pod.uid)
        cpus = allocate_cpus(a.machine, usable, n, mask)
        if cpus is None:
            # the CPU manager takes the CPUs inside the affinity first, then fails on the
            # remainder: its message counts what is left after the aligned ones
            aligned = 0 if mask is None else min(n, sum(
                1 for x in usable if mask >> a.machine.cpus[x].numa & 1))
            raise AllocationFailed(cpus_short(n - aligned, len(usable) - aligned))
        alloc.cpus = tuple(cpus)


def cpus_short(requested: int, available: int) -> str:
    """The CPU manager's allocation failure, counting the CPUs it still needs after the
    aligned ones and those free besides them."""
    return (f"not enough cpus available to satisfy request: requested={requested}, "
            f"available={available}")
