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
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations

from .hints import NumaMask, TopologyHint, mask_of
from .ledger import MEMORY, Ledger
from .machine import Machine
from .pod import QOS_GUARANTEED, Container, Pod, is_hugepages
from .subsets import Vector, best_subset

_UNSET: Hashable = object()


@dataclass(frozen=True, slots=True)
class GroupRule:
    """The memory manager's grouping rule over a node's memory assignments: ``assigned``,
    the NUMA nodes holding memory assignments; ``singles``, those used by single-node
    allocations; ``groups``, (node, its multi-node group) for the others."""

    assigned: NumaMask = 0
    singles: NumaMask = 0
    groups: tuple[tuple[int, NumaMask], ...] = ()
    _group_of: dict[int, NumaMask] = field(default_factory=dict, init=False, repr=False,
                                           compare=False, hash=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_group_of", dict(self.groups))

    @staticmethod
    def of(ledger: Ledger) -> GroupRule:
        assigned = singles = 0
        groups: list[tuple[int, NumaMask]] = []
        for n, count in sorted(ledger.assignments.items()):
            if count > 0:
                assigned |= 1 << n
                group = ledger.cells.get(n, 1 << n)
                if group.bit_count() <= 1:
                    singles |= 1 << n
                else:
                    groups.append((n, group))
        return GroupRule(assigned, singles, tuple(groups))

    def _in_groups(self, mask: NumaMask, exact: bool) -> bool:
        a = mask & self.assigned
        if a & self.singles:
            return False
        group_of = self._group_of
        while a:
            low = a & -a
            group = group_of[low.bit_length() - 1]
            if (group != mask) if exact else bool(mask & ~group):
                return False
            a ^= low
        return True

    def valid(self, mask: NumaMask) -> bool:
        """The memory manager's grouping rule for a hint mask."""
        if mask.bit_count() == 1:
            return not mask & self.assigned or bool(mask & self.singles)
        if not mask & self.assigned:
            return True
        return self._in_groups(mask, exact=True)

    def reach(self, mask: NumaMask) -> bool:
        """Could a valid multi-node mask contain ``mask``?"""
        if mask.bit_count() < 2:
            return True
        return self._in_groups(mask, exact=False)


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
    # the memory grouping rule; when given, it is ``valid`` and ``reach``
    rule: GroupRule | None = None
    _min_width: int | None = field(default=None, repr=False)
    _key: Hashable | None = field(default=_UNSET, init=False, repr=False, compare=False)
    _domain_mask: NumaMask = field(default=0, init=False, repr=False)
    _tables: tuple[dict[int, Vector], dict[int, Vector]] | None = field(
        default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.rule is not None:
            self.valid, self.reach = self.rule.valid, self.rule.reach
        self._domain_mask = mask_of(self.domain)

    @property
    def _free(self) -> dict[int, Vector]:
        """``free`` less its zero vectors (made when first asked: a kept hint list needs
        none of the per-mask sums)."""
        return self._nonzero()[0]

    @property
    def _cap(self) -> dict[int, Vector]:
        return self._nonzero()[1]

    def _nonzero(self) -> tuple[dict[int, Vector], dict[int, Vector]]:
        if self._tables is None:
            self._tables = ({n: v for n, v in self.free.items() if any(v)},
                            {n: v for n, v in self.capacity.items() if any(v)})
        return self._tables

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
            zero = (0,) * len(self.request)
            self._min_width = _min_width(
                tuple(self.domain), tuple(self.capacity.get(n, zero) for n in self.domain),
                tuple(self.request))
        return self._min_width

    def key(self) -> Hashable | None:
        """Everything the kubelet's hint list of this demand depends on (None when an
        extra rule other than the memory grouping rule takes part). A node's free amount
        counts up to the request only: with none negative, a mask's sum reaches the
        request (bonus or not) exactly when the sum of the amounts so capped does, so
        nodes with more room than the pod asks share one key."""
        if self._key is _UNSET:
            if self.valid is not None and self.rule is None:
                self._key = None
            else:
                zero = (0,) * len(self.request)
                request = tuple(self.request)
                free = [self.free.get(n, zero) for n in self.domain]
                if len(request) == 1:
                    if free and min(v[0] for v in free) >= 0:
                        top = request
                        free = [v if v[0] < top[0] else top for v in free]
                elif all(x >= 0 for v in free for x in v):
                    free = [tuple(min(x, r) for x, r in zip(v, request, strict=True))
                            for v in free]
                self._key = (request, tuple(self.domain), tuple(free),
                             tuple(self.capacity.get(n, zero) for n in self.domain),
                             self.required, self.rule, tuple(sorted(self.bonus.items())))
        return self._key

    def hint(self, mask: NumaMask) -> TopologyHint:
        return TopologyHint(mask, mask.bit_count() == self.min_width())


def iterate_masks(ids: Sequence[int]) -> Iterator[NumaMask]:
    """Every non-empty mask over ``ids`` in the kubelet's IterateBitMasks order."""
    for k in range(1, len(ids) + 1):
        for combo in combinations(ids, k):
            yield mask_of(combo)


# Hint lists by Demand.key(): a scheduler extender walks the same free counts on many
# nodes (and again for every new pod shape asking the same). Bounded, oldest out first.
HINT_CACHE_SIZE = 2048
_hint_cache: dict[Hashable, tuple[TopologyHint, ...]] = {}


def full_hints(d: Demand) -> list[TopologyHint]:
    """The kubelet's hint list for a demand: every fitting mask (2^n walk), in its order.

    :meth:`Demand.fits` for every mask, with the free and capacity sums of all the
    domain's subsets built first, one addition per subset (the walk is what a scheduler
    extender pays for every node, so it is kept tight: one-dimensional requests, CPUs
    or plain memory, add numbers rather than vectors), and kept by what it depends on
    (:meth:`Demand.key`)."""
    key = d.key()
    got = None if key is None else _hint_cache.get(key)
    if got is None:
        got = _walk(d)
        if key is not None:
            if len(_hint_cache) >= HINT_CACHE_SIZE:
                _hint_cache.pop(next(iter(_hint_cache)), None)
            _hint_cache[key] = got
    return list(got)


def _walk(d: Demand) -> tuple[TopologyHint, ...]:
    domain = tuple(d.domain)
    pairs = _mask_hints(domain, d.min_width())
    if len(d.request) != 1:
        return tuple(h for m, h in pairs if d.fits(m))
    need, required, valid = d.request[0], d.required, d.valid
    free = tuple(d.free.get(n, (0,))[0] for n in domain)
    cap = tuple(d.capacity.get(n, (0,))[0] for n in domain)
    free1 = _subset_totals(domain, free)
    for m, extra in d.bonus.items():
        if m in free1:
            free1[m] += extra[0]
    if not d.bonus and all(f <= c for f, c in zip(free, cap, strict=True)):
        # free sums never pass capacity sums: capacity holds wherever free memory does
        if valid is None and not required:
            return tuple(h for m, h in pairs if free1[m] >= need)
        return tuple(h for m, h in pairs if free1[m] >= need and not required & ~m
                     and (valid is None or valid(m)))
    cap1 = _capacity_totals(domain, cap)
    return tuple(h for m, h in pairs if free1[m] >= need and cap1[m] >= need
                 and not required & ~m and (valid is None or valid(m)))


@functools.lru_cache(maxsize=64)
def _mask_hints(domain: tuple[int, ...], width: int
                ) -> tuple[tuple[NumaMask, TopologyHint], ...]:
    """Every mask of ``domain`` in the kubelet's order with its hint (preferred iff
    ``width`` wide); hints are immutable, the cached lists share them."""
    return tuple((m, TopologyHint(m, m.bit_count() == width)) for m in kubelet_masks(domain))


def _subset_totals(domain: Sequence[int], values: Sequence[int]) -> dict[NumaMask, int]:
    """The sum of ``values`` (one per node of ``domain``) over every subset of
    ``domain``, by mask."""
    out: dict[NumaMask, int] = {0: 0}
    for n, v in zip(domain, values, strict=True):
        bit = 1 << n
        out.update([(m | bit, t + v) for m, t in out.items()])
    return out


@functools.lru_cache(maxsize=32)
def _capacity_totals(domain: tuple[int, ...], values: tuple[int, ...]) -> dict[NumaMask, int]:
    """:func:`_subset_totals` kept (a machine's capacities repeat on every decision; the
    answer is read, never changed)."""
    return _subset_totals(domain, values)


@functools.lru_cache(maxsize=1024)
def _min_width(domain: tuple[int, ...], capacity: tuple[Vector, ...], request: Vector) -> int:
    """The narrowest width whose capacity holds ``request`` (the number of nodes when
    none does); ``capacity`` per node of ``domain``."""
    table = dict(zip(domain, capacity, strict=True))

    def holds(mask: NumaMask) -> bool:
        tot = [0] * len(request)
        for n in domain:
            if mask >> n & 1:
                for i, x in enumerate(table[n]):
                    tot[i] += x
        return all(t >= r for t, r in zip(tot, request, strict=True))

    for k in range(1, len(domain) + 1):
        if best_subset(list(domain), k, holds, tables=[(table, request)],
                       budget=200_000) is not None:
            return k
    return len(domain)


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
    def parts() -> tuple[tuple[int, ...], dict[int, Vector], dict[int, Vector], NumaMask]:
        return _cpu_counts(machine, ledger, uid)

    # kept per holder: a pod the ledger does not hold reuses nothing (one entry for all)
    holder = uid if uid in ledger.pods else None
    domain, free, cap, required = (ledger.derived(("cpu", holder), parts)
                                   if machine is ledger.machine else parts())
    return Demand("cpu", ("cpu",), (request,), domain, free, cap, required)


def _cpu_counts(machine: Machine, ledger: Ledger, uid: str
                ) -> tuple[tuple[int, ...], dict[int, Vector], dict[int, Vector], NumaMask]:
    """CPU demand parts: the domain, CPUs usable by ``uid`` and all CPUs per NUMA node,
    and the nodes of its reusable CPUs."""
    reusable = ledger.reusable_cpus(uid)
    usable = ledger.free_cpus() | reusable
    domain = tuple(sorted({c.numa for c in machine.cpus.values()}))
    free: dict[int, Vector] = {n: (0,) for n in domain}
    cap: dict[int, Vector] = {n: (0,) for n in domain}
    for c in machine.cpus.values():
        cap[c.numa] = (cap[c.numa][0] + 1,)
        if c.id in usable:
            free[c.numa] = (free[c.numa][0] + 1,)
    required = mask_of({machine.cpus[c].numa for c in reusable})
    return domain, free, cap, required


def memory_demand(machine: Machine, ledger: Ledger, request: Mapping[str, int],
                  reusable: Mapping[NumaMask, Mapping[str, int]] | None = None) -> Demand:
    """The memory manager's request; ``reusable``: bytes per memory type the pod's init
    containers hold per exact NUMA affinity (counted as free for that mask only)."""
    kinds = tuple(sorted(request, key=lambda k: (k != MEMORY, k)))
    def parts() -> tuple[tuple[int, ...], dict[int, Vector], dict[int, Vector], GroupRule]:
        return _memory_parts(machine, ledger, kinds)

    domain, free, cap, rule = (ledger.derived(("memory", kinds), parts)
                               if machine is ledger.machine else parts())
    bonus = {m: tuple(per.get(k, 0) for k in kinds)
             for m, per in (reusable or {}).items() if any(per.get(k, 0) for k in kinds)}
    return Demand("memory", kinds, tuple(request[k] for k in kinds), domain, free, cap,
                  bonus=bonus, rule=rule)


def _memory_parts(machine: Machine, ledger: Ledger, kinds: tuple[str, ...]
                  ) -> tuple[tuple[int, ...], dict[int, Vector], dict[int, Vector], GroupRule]:
    """Memory demand parts: the domain, free and allocatable bytes of ``kinds`` per NUMA
    node, the grouping rule."""
    domain = tuple(sorted(machine.numa_ids))
    free = {n: tuple(max(0, ledger.free_memory(n, k)) for k in kinds) for n in domain}
    cap = {n: tuple(ledger.capacity(n, k) for k in kinds) for n in domain}
    return domain, free, cap, GroupRule.of(ledger)


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
