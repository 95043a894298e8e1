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
(:attr:`HintProvider.allocation_order`). A new kind of resource is one provider, made
for each pod by a :class:`ProviderKind` in the registry (:mod:`numalign.topology.managers`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..demands import Demand
from ..hints import TopologyHint
from ..ledger import ContainerAllocation, Ledger
from ..machine import Machine
from ..pod import Container, Pod, effective_request


class AllocationFailed(Exception):
    """A manager cannot allocate what the merge admitted (kubelet: Allocate error)."""


@dataclass
class Admission:
    """One pod's admission: the machine, the pod and the working copy of the ledger that
    every provider allocates from (it replaces the ledger only when the pod is admitted)."""

    machine: Machine
    pod: Pod
    work: Ledger
    # device resources a provider other than the device manager's claims (the device
    # provider leaves them alone); set once every provider of the pod is made
    claimed: frozenset[str] = frozenset()

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

    def free_of(self, resources: Sequence[str]) -> dict[str, frozenset[str]]:
        """:meth:`free_sets` of ``resources`` only (none free of one the machine lacks)."""
        uid, have = self.pod.uid, self.machine.device_resources
        return {r: frozenset(self.work.free_devices(r)) | self.work.reusable_devices(uid, r)
                if r in have else frozenset() for r in resources}


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
    """One kind of resource as the kubelet's hint providers handle it, for one pod (see
    the module docstring)."""

    name: str  # its kind's name, as explain labels its hints: "cpu", "gpu-groups", ...
    # the kubelet's hint provider it is part of ("cpu", "memory" or "devices"): providers
    # of one manager give the merge one hint map, as that manager does
    manager: str
    allocation_order: int  # lower allocates first (kubelet: devices, CPUs, memory)
    # device resources it takes over from the device manager's plain provider
    claims: frozenset[str]
    # its allocation is counts per NUMA node (CPUs, bytes, interchangeable devices): as
    # many free on the same NUMA nodes admit the pod the same way (the scheduler
    # extender's room check skips the engine only when every provider says so)
    room_by_counts: bool

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

    def report(self) -> Any:
        """What it reports of the pod's allocation beyond the containers' records
        (:attr:`~numalign.topology.admit.AdmitResult.reports`, under :attr:`name`);
        None: nothing."""
        ...


class ProviderKind(Protocol):
    """A kind of resource in the registry: makes the pod's :class:`HintProvider`, or
    None when the pod asks nothing of the kind."""

    name: str
    # where its hints stand among the others (cpu 10, memory 20, devices 30,
    # gpu-groups 50): the order of the merge's input and of explain's rows
    hint_order: int

    def for_pod(self, admission: Admission) -> HintProvider | None:
        """The provider for ``admission``'s pod; None: the kind takes no part. May raise
        :class:`~numalign.topology.errors.InvalidPodRequest` when the pod's own request
        for the kind cannot be read."""
        ...


@dataclass
class Kind:
    """A :class:`ProviderKind` from a function making the provider."""

    name: str
    hint_order: int
    make: Callable[[Admission], HintProvider | None]

    def for_pod(self, admission: Admission) -> HintProvider | None:
        return self.make(admission)
