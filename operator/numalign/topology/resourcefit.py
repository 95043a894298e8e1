"""The kubelet's resource-fit admission (its predicate admit handler, which runs the
scheduler's NodeResourcesFit on the node): a pod is admitted only if its requests fit in
the node's allocatable after the pods already admitted.

Units are the scheduler's: CPU in millicores, memory, ephemeral storage and hugepages in
bytes, extended resources in whole units; a pod's request is its effective request
(max(largest init container + sidecars started before it, apps + all sidecars)).
Checked in the kubelet's order: pod count, cpu, memory, ephemeral-storage, then the
scalar resources (hugepages and extended resources, by name); the first shortfall is
the reason (``OutOfcpu``, ``OutOfmemory``, ``OutOf<resource>``), with its message.
Extended resources the node does not have are ignored, as the kubelet ignores them.

An emulated node reserves nothing: allocatable is the machine's capacity.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from .machine import Machine
from .pod import HUGEPAGES_PREFIX, Pod, is_extended, is_hugepages

CPU = "cpu"
MEMORY = "memory"
EPHEMERAL_STORAGE = "ephemeral-storage"
PODS = "pods"
OUT_OF_PREFIX = "OutOf"
DEFAULT_MAX_PODS = 110
DEFAULT_EPHEMERAL_STORAGE = 100 << 30  # what an emulated node reports


@dataclass(frozen=True)
class FitFailure:
    resource: str
    requested: int
    used: int
    capacity: int

    @property
    def reason(self) -> str:
        return OUT_OF_PREFIX + self.resource

    @property
    def message(self) -> str:
        return (f"Node didn't have enough resource: {self.resource}, requested: "
                f"{self.requested}, used: {self.used}, capacity: {self.capacity}")


def allocatable(machine: Machine, max_pods: int = DEFAULT_MAX_PODS) -> dict[str, int]:
    """What the node offers, in the scheduler's units (the emulated node's allocatable)."""
    out: dict[str, int] = {
        CPU: 1000 * len(machine.cpus),
        MEMORY: sum(n.memory for n in machine.numa_nodes),
        EPHEMERAL_STORAGE: DEFAULT_EPHEMERAL_STORAGE,
        PODS: max_pods,
    }
    for size in machine.hugepage_sizes:
        out[HUGEPAGES_PREFIX + size] = sum(n.hugepages.get(size, 0) for n in machine.numa_nodes)
    for r in machine.device_resources:
        out[r] = len(machine.devices_of(r))
    return out


def _units(resource: str, q: Decimal) -> int:
    """A quantity in the scheduler's units, rounded up as Quantity.MilliValue/Value do."""
    if resource == CPU:
        return math.ceil(q * 1000)
    return math.ceil(q)


# fit_requests of live Pod objects (a pod is immutable; an entry goes with its pod): a
# scheduler extender checks one pod on many nodes
_BY_POD: dict[int, Mapping[str, int]] = {}


def _pod_fit_requests(pod: Pod) -> Mapping[str, int]:
    """:func:`fit_requests`, kept while ``pod`` lives (read, never changed)."""
    got = _BY_POD.get(id(pod))
    if got is None:
        got = _BY_POD[id(pod)] = fit_requests(pod)
        weakref.finalize(pod, _BY_POD.pop, id(pod), None)
    return got


def fit_requests(pod: Pod) -> dict[str, int]:
    """The pod's requests as the fit check counts them (zero requests left out)."""
    out: dict[str, int] = {}
    for res, q in pod.effective_requests().items():
        if res in (CPU, MEMORY, EPHEMERAL_STORAGE) or is_hugepages(res) or is_extended(res):
            v = _units(res, q)
            if v:
                out[res] = v
    return out


def check_fit(machine: Machine, pod: Pod, others: Iterable[Mapping[str, int]],
              max_pods: int = DEFAULT_MAX_PODS) -> FitFailure | None:
    """The first resource ``pod`` does not fit in, given the requests of the pods
    already admitted (``others``), or None if it fits."""
    count = 0
    used: dict[str, int] = {}
    for o in others:
        count += 1
        for res, v in o.items():
            used[res] = used.get(res, 0) + v
    return check_fit_totals(machine, pod, count, used, max_pods)


def check_fit_totals(machine: Machine, pod: Pod, count: int, used: Mapping[str, int],
                     max_pods: int = DEFAULT_MAX_PODS) -> FitFailure | None:
    """:func:`check_fit` given how many pods are admitted (``count``) and the sum of
    their requests per resource (``used``)."""
    alloc = allocatable(machine, max_pods)
    if count + 1 > alloc[PODS]:
        return FitFailure(PODS, 1, count, alloc[PODS])
    req = _pod_fit_requests(pod)
    scalars = sorted(r for r in req if r not in (CPU, MEMORY, EPHEMERAL_STORAGE))
    for res in (CPU, MEMORY, EPHEMERAL_STORAGE, *scalars):
        want = req.get(res, 0)
        if not want or (is_extended(res) and res not in alloc):
            continue
        have = used.get(res, 0)
        cap = alloc.get(res, 0)
        if want > cap - have:
            return FitFailure(res, want, have, cap)
    return None
