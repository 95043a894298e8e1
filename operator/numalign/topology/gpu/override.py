"""GPU groups as the device manager's override (:class:`~numalign.topology.managers.
devices.DeviceOverride`) for pods with ``numalign.io/gpus``: the group allocator gives
the NUMA hints of all the pod's GPU requests and places them; the whole placement goes
to the first container asking for the GPU resource (or a ``withResource`` one)."""

from __future__ import annotations

from ..errors import TopologyError
from ..hints import NumaMask, TopologyHint
from ..machine import Machine
from ..managers.devices import OverrideAllocation, OverrideRequest
from .allocator import allocate, hints
from .requests import ANNOTATION, parse_gpu_requests


class GpuAnnotationOverride:
    def __init__(self, machine: Machine, text: str) -> None:
        self.machine = machine
        try:
            self.requests = parse_gpu_requests(text, machine)
        except TopologyError as e:
            sub = "" if e.field == ANNOTATION else _sub(e.field)
            raise TopologyError(f"metadata.annotations.{ANNOTATION}{sub}",
                                e.problem) from None
        res: list[str] = []
        for r in self.requests:
            for name in (r.resource, r.with_resource.resource if r.with_resource else None):
                if name is not None and name not in res:
                    res.append(name)
        self.resources = tuple(res)

    def hints(self, req: OverrideRequest) -> list[TopologyHint] | None:
        free = {r: req.free_by_resource.get(r, frozenset()) for r in self.resources}
        return list(hints(self.machine, free, self.requests))

    def allocate(self, req: OverrideRequest, mask: NumaMask | None) -> OverrideAllocation:
        free = {r: req.free_by_resource.get(r, frozenset()) for r in self.resources}
        got = allocate(self.machine, free, self.requests, mask)
        return OverrideAllocation({r: list(ids) for r, ids in got.devices.items()},
                                  {k: list(v) for k, v in got.gpus.items()})


def _sub(field_: str) -> str:
    if not field_:
        return ""
    return field_ if field_.startswith("[") else "." + field_
