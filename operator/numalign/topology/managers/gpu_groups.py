"""GPU groups as a hint provider, for pods with ``numalign.io/gpus``: the group allocator
gives the NUMA hints of all the pod's GPU requests and places them (NVLink islands, GPU
memory, ``withResource`` devices); the whole placement goes to the first container asking
for one of its resources. It claims those resources from the device manager's plain
provider and is part of the device manager (its hints stand in the device manager's map,
after the plain devices'); it reports request name -> device ids."""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import InvalidPodRequest, TopologyError
from ..gpu.allocator import allocate, hints
from ..gpu.requests import ANNOTATION, parse_gpu_requests
from ..hints import TopologyHint
from ..ledger import ContainerAllocation
from ..pod import Container
from .base import Admission, AllocationFailed, Ask

NAME = "gpu-groups"
HINT_ORDER = 50


class GpuGroupsProvider:
    name = NAME
    manager = "devices"
    allocation_order = 0  # with the device manager, after its plain devices
    room_by_counts = False  # groups, not counts

    def __init__(self, admission: Admission, text: str) -> None:
        self.a = admission
        try:
            self.requests = parse_gpu_requests(text, admission.machine)
        except TopologyError as e:
            sub = "" if e.field == ANNOTATION else _sub(e.field)
            raise InvalidPodRequest(f"metadata.annotations.{ANNOTATION}{sub}",
                                    e.problem) from None
        res: list[str] = []
        for r in self.requests:
            for name in (r.resource, r.with_resource.resource if r.with_resource else None):
                if name is not None and name not in res:
                    res.append(name)
        self.resources = tuple(res)
        self.claims = frozenset(res)
        self.done = False  # the whole placement went to a container
        self.gpus: dict[str, list[str]] = {}  # request name -> device ids

    def _asks(self, unit: Sequence[Container]) -> bool:
        return any(r in c.requests for c in unit for r in self.resources)

    def ask(self, unit: Sequence[Container]) -> Ask:
        if not self._asks(unit):
            return Ask()
        free = self.a.free_of(self.resources)
        return Ask(fixed={self.resources[0]: list(hints(self.a.machine, free, self.requests))})

    def hints(self, ask: Ask,
              lists: Sequence[list[TopologyHint]]) -> dict[str, list[TopologyHint] | None]:
        return dict(ask.fixed)

    def allocate(self, c: Container, hint: TopologyHint, alloc: ContainerAllocation) -> None:
        if self.done or not self._asks((c,)):
            return
        self.done = True
        free = self.a.free_of(self.resources)
        try:
            got = allocate(self.a.machine, free, self.requests, hint.mask)
        except TopologyError as e:
            raise AllocationFailed(str(e)) from None
        for r, ids in got.devices.items():
            alloc.devices[r] = tuple(ids)
        self.gpus.update({k: list(v) for k, v in got.gpus.items()})

    def report(self) -> dict[str, list[str]]:
        return self.gpus


class GpuGroups:
    """The registry's kind: a provider for a pod with the annotation."""

    name = NAME
    hint_order = HINT_ORDER

    def for_pod(self, admission: Admission) -> GpuGroupsProvider | None:
        text = admission.pod.annotations.get(ANNOTATION)
        return None if text is None else GpuGroupsProvider(admission, text)


def _sub(field_: str) -> str:
    if not field_:
        return ""
    return field_ if field_.startswith("[") else "." + field_
