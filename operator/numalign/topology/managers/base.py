"""The Topology Manager's hint providers as one interface (the kubelet's ``HintProvider``:
a manager gives the hints of one decision, then allocates each container inside the
merged affinity), and the state of one pod's admission that they share.

For one decision (a container, or the pod) the engine asks each provider what it needs
(:meth:`HintProvider.ask`: demands the hint generator turns into hints, and hint lists
taken as they are), generates the hints of all the decision's demands together
(:func:`numalign.topology.hintgen.plan_hints`, which needs every resource's demand at
once), hands each provider its lists back (:meth:`HintProvider.hints`: its part of the
merge's input), merges, and once the decision admits, has the providers allocate every
container of the unit in the kubelet's order of ``Allocate`` calls
(:attr:`HintProvider.allocation_order`). A new kind of resource is one provider.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..hints import TopologyHint
from ..ledger import ContainerAllocation, Ledger
from ..machine import Machine
from ..pod import Container, Pod, effective_request
from ..providers import Demand


class AllocationFailed(Exception):
    """A manager cannot allocate what the merge admitted (kubelet: Allocate error)."""


@dataclass
class Admission:
    """One pod's admission: the machine, the pod and the working copy of the ledger that
    every provider allocates from (it replaces the ledger only when the pod is admitted)."""

    machine: Machine
    pod: Pod
    work: Ledger

    def unit_value(self, unit: Sequence[Container], value: Callable[[Container], int]) -> int:
        """A unit's request of one resource: the container's, or the pod's effective
        request (the largest init container against the app containers and sidecars)."""
        if len(unit) == 1:
            return value(unit[0])
        return effective_request(self.pod.init_containers, self.pod.containers, value, 0)

    def unit_map(self, unit: Sequence[Container],
                 per: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
        """:meth:`unit_value` of every resource the unit's containers ask for (``per``:
        container name -> resource -> amount); zero amounts left out."""
        out: dict[str, int] = {}
        for k in sorted({k for c in unit for k in per[c.name]}):
            v = self.unit_value(unit, _getter(per, k))
            if v:
                out[k] = v
        return out

    def free_sets(self) -> dict[str, frozenset[str]]:
        """Free device ids per device resource, plus the pod's own reusable ones."""
        uid = self.pod.uid
        return {r: frozenset(self.work.free_devices(r)) | self.work.reusable_devices(uid, r)
                for r in self.machine.device_resources}


def _getter(per: Mapping[str, Mapping[str, int]], key: str) -> Callable[[Container], int]:
    def get(c: Container) -> int:
        return per[c.name].get(key, 0)

    return get


@dataclass
class Ask:
    """What a provider needs for one decision: demands for the hint generator (in the
    order :meth:`HintProvider.hints` gets their lists back) and hint lists as they are
    (resource -> hints; None = no preference, [] = cannot satisfy)."""

    demands: list[Demand] = field(default_factory=list)
    fixed: dict[str, list[TopologyHint] | None] = field(default_factory=dict)


class HintProvider(Protocol):
    """One of the kubelet's hint providers (see the module docstring)."""

    name: str  # as explain shows it: "cpu", "memory", "devices"
    allocation_order: int  # lower allocates first (kubelet: devices, CPUs, memory)

    def ask(self, unit: Sequence[Container]) -> Ask:
        """What the provider needs for the decision of ``unit``."""
        ...

    def hints(self, ask: Ask,
              lists: Sequence[list[TopologyHint]]) -> dict[str, list[TopologyHint] | None]:
        """Its hints per resource for the merge, from the lists generated for
        ``ask.demands`` (same order) and ``ask.fixed``; empty: no output at all."""
        ...

    def allocate(self, c: Container, hint: TopologyHint, alloc: ContainerAllocation) -> None:
        """Allocate container ``c`` inside ``hint`` into ``alloc``; raise
        :class:`AllocationFailed` with the kubelet's message when it cannot."""
        ...
