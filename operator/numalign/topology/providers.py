"""Hint providers with the kubelet's semantics: CPU (static policy), memory and hugepages
(memory manager, static policy) and devices (device manager).

Every kubelet provider has the same shape: it walks every NUMA mask of its node set, and
a mask is a hint when what is usable now inside it can hold the request; a hint is
preferred iff its width equals the narrowest width whose *capacity* could hold the request
(``minAffinitySize``, which starts at the number of nodes). This module captures a
provider's request as a ``Demand`` (per node free and capacity vectors, nodes a hint must
contain, an extra validity rule) so that hints can be generated either exactly as the
kubelet does (``full_hints``, every mask: fine up to ~10 nodes) or reduced (see
``hintgen``) on wide machines.

What each provider does, as in the kubelet:

* CPU (cpumanager/policy_static.go): only Guaranteed pods with an integer CPU request get
  exclusive CPUs; otherwise no output ("no preference"). Masks range over the NUMA nodes
  that have CPUs (``CPUDetails.NUMANodes()``), never over CPU-less nodes. CPUs the pod's
  finished init containers hold are reusable and every one of them must lie in the mask.
* Memory (memorymanager/policy_static.go): Guaranteed pods only; one hint list shared by
  ``memory`` and every requested ``hugepages-<size>``; masks over all NUMA nodes; a
  mask must hold every requested kind by allocatable (this sets minAffinitySize) and by
  free memory; a NUMA node already used by a multi-node allocation may only be part of
  exactly that group, and a node used by single-node allocations never joins a group.
* Devices (devicemanager/topology_hints.go), per extended resource: if no device of the
  resource has a NUMA node, the resource gets a nil list (no preference); if fewer
  devices are available (plus reusable) than requested, an empty list; otherwise masks
  over all NUMA nodes counting only devices with a NUMA node in the mask (devices
  without one never count; reusable ones must lie in the mask).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from .hints import NumaMask, TopologyHint, mask_of
from .ledger import MEMORY, Ledger
from .machine import Machine
from .pod import QOS_GUARANTEED, Container, Pod, is_hugepages
from .subsets import Vector, best_subset


@dataclass
class Demand:
    """One provider's request in a decision, in the provider's units."""

    provider: str  # "cpu", "memory", "devices"
    keys: tuple[str, ...]  # resource names the hints are reported under (same list each)
    request: Vector
    domain: tuple[int, ...]  # NUMA node ids the provider's masks range over (sorted)
    free: Mapping[int, Vector]  # usable now per node (available + reusable)
    capacity: Mapping[int, Vector]  # per node, for the minimal width
    required: NumaMask = 0  # nodes every hint must contain (reusable items)
    valid: Callable[[NumaMask], bool] | None = None  # extra rule (memory groups)
    # False when no hint can contain the mask (for pruning searches); None: any subset of
    # the domain can be extended to a hint (monotone providers)
    reach: Callable[[NumaMask], bool] | None = None
    # extra free amount for exactly one mask: memory the pod's init containers hold with
    # that affinity, which its later containers reuse (the memory manager's
    # getPodReusableMemory). Exact below hintgen.FULL_LIMIT NUMA nodes (a full walk).
    bonus: Mapping[NumaMask, Vector] = field(default_factory=dict)
    _min_width: int | None = field(default=None, repr=False)
    _domain_mask: NumaMask = field(default=0, init=False, repr=False)
    _free: dict[int, Vector] = field(default_factory=dict, init=False, repr=False)
    _cap: dict[int, Vector] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._domain_mask = mask_of(self.domain)
        self._free = {n: v for n, v in self.free.items() if any(v)}
        self._cap = {n: v for n, v in self.capacity.items() if any(v)}

    @property
    def domain_mask(self) -> NumaMask:
        return self._domain_mask

    def sums(self, mask: NumaMask, table: Mapping[int, Vector] | None = None) -> list[int]:
        """Per-dimension sums of ``table`` (default: free) over the nodes of ``mask``."""
        tbl = self._free if table is None else table
        tot = [0] * len(self.request)
        while mask:
            low = mask & -mask
            v = tbl.get(low.bit_length() - 1)
            if v is not None:
                for i, x in enumerate(v):
                    tot[i] += x
            mask ^= low
        return tot

    def covers(self, sums: Sequence[int]) -> bool:
        return all(s >= r for s, r in zip(sums, self.request, strict=True))

    def fits(self, mask: NumaMask) -> bool:
        """Would the kubelet list ``mask`` as a hint?"""
        if mask & ~self._domain_mask or self.required & ~mask:
            return False
        if not self.covers(self.sums(mask, self._cap)):
            return False  # memory manager: allocatable first (others: implied by free)
        if self.valid is not None and not self.valid(mask):
            return False
        sums = self.sums(mask)
        extra = self.bonus.get(mask)
        if extra is not None:
            sums = [a + b for a, b in zip(sums, extra, strict=True)]
        return self.covers(sums)

    def extendable(self, mask: NumaMask) -> bool:
        """Could some hint contain ``mask``? (False is certain; True may be optimistic.)"""
        if mask & ~self.domain_mask:
            return False
        return self.reach is None or self.reach(mask)

    def fits_capacity(self, mask: NumaMask) -> bool:
        return self.covers(self.sums(mask, self._cap))

    def min_width(self) -> int:
        """The kubelet's minAffinitySize: narrowest width whose capacity holds the request
        (the number of nodes when none does)."""
        if self._min_width is None:
            found = len(self.domain)
            for k in range(1, len(self.domain) + 1):
                m = best_subset(list(self.domain), k, self.fits_capacity,
                                tables=[(self.capacity, self.request)], budget=200_000)
                if m is not None:
                    found = k
                    break
            self._min_width = found
        return self._min_width

    def hint(self, mask: NumaMask) -> TopologyHint:
        return TopologyHint(mask, mask.bit_count() == self.min_width())


def iterate_masks(ids: Sequence[int]) -> Iterator[NumaMask]:
    """Every non-empty mask over ``ids`` in the kubelet's IterateBitMasks order."""
    for k in range(1, len(ids) + 1):
        for combo in combinations(ids, k):
            yield mask_of(combo)


def full_hints(d: Demand) -> list[TopologyHint]:
    """The kubelet's hint list for a demand: every fitting mask (2^n walk), in its order.

    :meth:`Demand.fits` for every mask, with the free and capacity sums of all the
    domain's subsets built first, one addition per subset (the walk is what a scheduler
    extender pays for every node, so it is kept tight: one-dimensional requests, CPUs
    or plain memory, add numbers rather than vectors)."""
    width = d.min_width()
    masks = kubelet_masks(tuple(d.domain))
    if len(d.request) == 1:
        need, required, valid = d.request[0], d.required, d.valid
        free1 = _subset_totals(d.domain, {n: v[0] for n, v in d.free.items()})
        cap1 = _subset_totals(d.domain, {n: v[0] for n, v in d.capacity.items()})
        for m, extra in d.bonus.items():
            if m in free1:
                free1[m] += extra[0]
        return [TopologyHint(m, m.bit_count() == width) for m in masks
                if cap1[m] >= need and free1[m] >= need and not required & ~m
                and (valid is None or valid(m))]
    return [TopologyHint(m, m.bit_count() == width) for m in masks if d.fits(m)]


def _subset_totals(domain: Sequence[int], table: Mapping[int, int]) -> dict[NumaMask, int]:
    """The sum of ``table`` over every subset of ``domain``, by mask."""
    out: dict[NumaMask, int] = {0: 0}
    for n in domain:
        v = table.get(n, 0)
        bit = 1 << n
        out.update([(m | bit, t + v) for m, t in out.items()])
    return out


@functools.lru_cache(maxsize=256)
def kubelet_masks(ids: tuple[int, ...]) -> tuple[NumaMask, ...]:
    """:func:`iterate_masks` of ``ids``, kept (the walk repeats for every decision)."""
    return tuple(iterate_masks(ids))


# ---------------------------------------------------------------- per-provider requests


def guaranteed_cpus(pod: Pod, c: Container) -> int:
    """The static policy's exclusive CPU count: Guaranteed QoS and an integer request."""
    if pod.qos != QOS_GUARANTEED:
        return 0
    q = c.request("cpu")
    if q <= 0 or q != q.to_integral_value():
        return 0
    return int(q)


def memory_request(pod: Pod, c: Container) -> dict[str, int]:
    """The memory manager's request: memory and hugepages bytes, Guaranteed pods only."""
    if pod.qos != QOS_GUARANTEED:
        return {}
    out: dict[str, int] = {}
    for res, q in c.requests.items():
        if res == MEMORY or is_hugepages(res):
            b = int(q.to_integral_value(rounding="ROUND_CEILING"))
            if b > 0:
                out[res] = b
    return out


def device_request(c: Container, machine: Machine) -> dict[str, int]:
    """Extended resources served by devices of this machine, in devices."""
    served = set(machine.device_resources)
    return {res: int(q) for res, q in c.requests.items() if res in served and q > 0}


def cpu_demand(machine: Machine, ledger: Ledger, uid: str, request: int) -> Demand:
    free_cpus = ledger.free_cpus()
    reusable = ledger.reusable_cpus(uid)
    usable = free_cpus | reusable
    domain = tuple(sorted({c.numa for c in machine.cpus.values()}))
    free: dict[int, Vector] = {n: (0,) for n in domain}
    cap: dict[int, Vector] = {n: (0,) for n in domain}
    for c in machine.cpus.values():
        cap[c.numa] = (cap[c.numa][0] + 1,)
        if c.id in usable:
            free[c.numa] = (free[c.numa][0] + 1,)
    required = mask_of({machine.cpus[c].numa for c in reusable})
    return Demand("cpu", ("cpu",), (request,), domain, free, cap, required)


def memory_demand(machine: Machine, ledger: Ledger, request: Mapping[str, int],
                  reusable: Mapping[NumaMask, Mapping[str, int]] | None = None) -> Demand:
    """The memory manager's request; ``reusable``: bytes per memory type the pod's init
    containers hold per exact NUMA affinity (counted as free for that mask only)."""
    kinds = tuple(sorted(request, key=lambda k: (k != MEMORY, k)))
    domain = tuple(sorted(machine.numa_ids))
    free = {n: tuple(max(0, ledger.free_memory(n, k)) for k in kinds) for n in domain}
    cap = {n: tuple(ledger.capacity(n, k) for k in kinds) for n in domain}
    assigned = 0  # nodes with memory assignments
    singles = 0  # nodes used by single-node allocations
    group_of: dict[int, NumaMask] = {}
    for n, count in ledger.assignments.items():
        if count > 0:
            assigned |= 1 << n
            group = ledger.cells.get(n, 1 << n)
            if group.bit_count() <= 1:
                singles |= 1 << n
            else:
                group_of[n] = group

    def _in_groups(mask: NumaMask, exact: bool) -> bool:
        a = mask & assigned
        if a & singles:
            return False
        while a:
            low = a & -a
            group = group_of[low.bit_length() - 1]
            if (group != mask) if exact else bool(mask & ~group):
                return False
            a ^= low
        return True

    def valid(mask: NumaMask) -> bool:
        """The memory manager's grouping rule for a hint mask."""
        if mask.bit_count() == 1:
            return not mask & assigned or bool(mask & singles)
        return _in_groups(mask, exact=True)

    def reach(mask: NumaMask) -> bool:
        """Could a valid multi-node mask contain ``mask``?"""
        if mask.bit_count() < 2:
            return True
        return _in_groups(mask, exact=False)

    bonus = {m: tuple(per.get(k, 0) for k in kinds)
             for m, per in (reusable or {}).items() if any(per.get(k, 0) for k in kinds)}
    return Demand("memory", kinds, tuple(request[k] for k in kinds), domain, free, cap,
                  valid=valid, reach=reach, bonus=bonus)


def device_hints_or_demand(machine: Machine, ledger: Ledger, uid: str, resource: str,
                           request: int) -> Demand | list[TopologyHint] | None:
    """A device resource's Demand, or its hint list when the kubelet decides without a
    walk: None (no device has a NUMA node) or [] (not enough devices available)."""
    devices = machine.devices_of(resource)
    if not any(d.numa_node is not None for d in devices):
        return None
    free_ids = set(ledger.free_devices(resource))
    reusable = ledger.reusable_devices(uid, resource)
    if len(free_ids | reusable) < request:
        return []
    # the device manager's masks range over the NUMA nodes that have devices of the
    # resource (deviceNUMANodes), not over every node of the machine
    domain = tuple(sorted({d.numa_node for d in devices if d.numa_node is not None}
                          & set(machine.numa_ids)))
    free: dict[int, Vector] = {n: (0,) for n in domain}
    cap: dict[int, Vector] = {n: (0,) for n in domain}
    required = 0
    for d in devices:
        if d.numa_node is None:
            continue
        cap[d.numa_node] = (cap[d.numa_node][0] + 1,)
        if d.id in free_ids or d.id in reusable:
            free[d.numa_node] = (free[d.numa_node][0] + 1,)
        if d.id in reusable:
            required |= 1 << d.numa_node
    return Demand("devices", (resource,), (request,), domain, free, cap, required)
