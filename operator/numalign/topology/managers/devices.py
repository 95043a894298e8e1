"""The device manager as a hint provider: each extended resource's devices by NUMA node,
the pod's reusable devices first. A resource another provider claims
(:attr:`~numalign.topology.managers.base.HintProvider.claims`: GPU groups, the NRI agent's
devices the kubelet assigned) is left to that provider."""

from __future__ import annotations

from collections.abc import Sequence

from ..demands import Demand, device_hints_or_demand, device_request
from ..hints import NumaMask, TopologyHint
from ..ledger import ContainerAllocation
from ..pod import Container
from .base import Admission, AllocationFailed, Ask


class DeviceProvider:
    name = "devices"
    manager = "devices"
    allocation_order = 0
    claims: frozenset[str] = frozenset()
    room_by_counts = True

    def __init__(self, admission: Admission) -> None:
        self.a = admission

    def ask(self, unit: Sequence[Container]) -> Ask:
        a = self.a
        ask = Ask()
        per = {c.name: device_request(c, a.machine) for c in a.pod.all_containers}
        for res, count in a.unit_map(unit, per).items():
            if res in a.claimed:
                continue
            got = device_hints_or_demand(a.machine, a.work, a.pod.uid, res, count)
            if isinstance(got, Demand):
                ask.demands.append(got)
            else:
                ask.fixed[res] = got
        return ask

    def hints(self, ask: Ask,
              lists: Sequence[list[TopologyHint]]) -> dict[str, list[TopologyHint] | None]:
        out: dict[str, list[TopologyHint] | None] = {
            d.keys[0]: hints for d, hints in zip(ask.demands, lists, strict=True)}
        out.update(ask.fixed)
        return out

    def allocate(self, c: Container, hint: TopologyHint, alloc: ContainerAllocation) -> None:
        a = self.a
        for res, count in device_request(c, a.machine).items():
            if res not in a.claimed:
                alloc.devices[res] = tuple(self._devices(res, count, hint.mask))

    def report(self) -> None:
        return None

    def _devices(self, res: str, count: int, mask: NumaMask | None) -> list[str]:
        """The device manager's devicesToAllocate: the pod's reusable devices first, then
        devices inside the affinity, then the others (each set in id order)."""
        work, machine = self.a.work, self.a.machine
        reusable = sorted(work.reusable_devices(self.a.pod.uid, res))
        out = reusable[:count]
        if len(out) == count:
            return out
        free = set(work.free_devices(res))
        need = count - len(out)
        if len(free) < need:
            raise AllocationFailed(f"requested number of devices unavailable for {res}. "
                                   f"Requested: {need}, Available: {len(free)}")
        devs = {dv.id: dv for dv in machine.devices_of(res)}
        aligned_possible = any(dv.numa_node is not None for dv in devs.values())
        if mask is None or not aligned_possible:
            aligned: list[str] = []
            rest = sorted(free)
        else:
            aligned = sorted(i for i in free if devs[i].numa_node is not None
                             and mask >> (devs[i].numa_node or 0) & 1)
            rest = sorted(free - set(aligned))
        return [*out, *(aligned + rest)[:need]]
