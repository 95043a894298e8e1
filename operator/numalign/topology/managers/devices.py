"""The device manager as a hint provider: each extended resource's devices by NUMA node,
the pod's reusable devices first. A :class:`DeviceOverride` replaces it for the resources
it names (GPU groups plug in here, and the NRI agent's devices the kubelet assigned)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import TopologyError
from ..hints import NumaMask, TopologyHint
from ..ledger import ContainerAllocation
from ..machine import Machine
from ..pod import Container, Pod
from ..providers import Demand, device_hints_or_demand, device_request
from .base import Admission, AllocationFailed, Ask


@dataclass(frozen=True)
class OverrideRequest:
    """What a device provider override is asked about: one decision (hints) or one
    container's allocation (``allocate``)."""

    machine: Machine
    pod: Pod
    resource: str
    containers: tuple[Container, ...]  # the decision unit, or the one container
    count: int  # devices of ``resource`` the unit asks for
    free: frozenset[str]  # free device ids of ``resource`` (plus the pod's reusable ones)
    free_by_resource: Mapping[str, frozenset[str]]  # the same for every device resource


@dataclass
class OverrideAllocation:
    devices: dict[str, list[str]]  # resource -> device ids for the container
    gpus: dict[str, list[str]] = field(default_factory=dict)  # request name -> device ids


class DeviceOverride(Protocol):
    """Replaces the device manager for the resources it names: ``allocate`` is asked for the
    first container requesting one (for each, with a true ``per_container`` attribute)."""

    resources: tuple[str, ...]

    def hints(self, req: OverrideRequest) -> list[TopologyHint] | None:
        """Hints for the decision; None = no preference, [] = cannot satisfy."""
        ...

    def allocate(self, req: OverrideRequest, mask: NumaMask | None) -> OverrideAllocation:
        """Devices for one container inside ``mask``; raise TopologyError if impossible."""
        ...


def _count_of(resource: str) -> Callable[[Container], int]:
    def count(c: Container) -> int:
        return int(c.request(resource))

    return count


class DeviceProvider:
    name = "devices"
    allocation_order = 0

    def __init__(self, admission: Admission, overrides: Sequence[DeviceOverride]) -> None:
        self.a = admission
        self.overrides = {r: o for o in overrides for r in o.resources}
        self.done: set[int] = set()  # overrides that gave their whole allocation
        self.gpus: dict[str, list[str]] = {}  # GPU request name -> device ids

    def ask(self, unit: Sequence[Container]) -> Ask:
        a = self.a
        ask = Ask()
        per = {c.name: device_request(c, a.machine) for c in a.pod.all_containers}
        for res, count in a.unit_map(unit, per).items():
            if res in self.overrides:
                continue
            got = device_hints_or_demand(a.machine, a.work, a.pod.uid, res, count)
            if isinstance(got, Demand):
                ask.demands.append(got)
            else:
                ask.fixed[res] = got
        free_sets: dict[str, frozenset[str]] | None = None
        seen: set[int] = set()
        for res, ov in self.overrides.items():
            if id(ov) in seen or not any(r in c.requests for c in unit for r in ov.resources):
                continue
            seen.add(id(ov))
            free_sets = a.free_sets() if free_sets is None else free_sets
            req = OverrideRequest(a.machine, a.pod, res, tuple(unit),
                                  a.unit_value(unit, _count_of(res)),
                                  free_sets.get(res, frozenset()), free_sets)
            ask.fixed[res] = ov.hints(req)
        return ask

    def hints(self, ask: Ask,
              lists: Sequence[list[TopologyHint]]) -> dict[str, list[TopologyHint] | None]:
        out: dict[str, list[TopologyHint] | None] = {
            d.keys[0]: hints for d, hints in zip(ask.demands, lists, strict=True)}
        out.update(ask.fixed)
        return out

    def allocate(self, c: Container, hint: TopologyHint, alloc: ContainerAllocation) -> None:
        a = self.a
        mask = hint.mask
        free_sets: dict[str, frozenset[str]] | None = None
        for res, count in device_request(c, a.machine).items():
            if res in self.overrides:
                continue
            alloc.devices[res] = tuple(self._devices(res, count, mask))
        for res, ov in self.overrides.items():
            if id(ov) in self.done or res not in c.requests:
                continue
            if not getattr(ov, "per_container", False):  # GPU groups: all to the first
                self.done.add(id(ov))
            free_sets = a.free_sets() if free_sets is None else free_sets
            req = OverrideRequest(a.machine, a.pod, res, (c,), int(c.request(res)),
                                  free_sets.get(res, frozenset()), free_sets)
            try:
                got = ov.allocate(req, mask)
            except TopologyError as e:
                raise AllocationFailed(str(e)) from None
            for r, ids in got.devices.items():
                alloc.devices[r] = tuple(ids)
            self.gpus.update(got.gpus)

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
