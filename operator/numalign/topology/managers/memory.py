"""The memory manager's static policy as a hint provider: memory and hugepages of a
Guaranteed pod per NUMA node, its grouping rule, and the memory that a pod's init
containers leave for its later containers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..demands import Demand, iterate_masks, memory_demand, memory_request
from ..hintgen import FULL_LIMIT, best_subset
from ..hints import NumaMask, TopologyHint, mask_ids
from ..ledger import ContainerAllocation
from ..pod import Container
from .base import Admission, AllocationFailed, Ask


class MemoryProvider:
    name = "memory"
    manager = "memory"
    claims: frozenset[str] = frozenset()
    room_by_counts = True
    allocation_order = 2

    def __init__(self, admission: Admission) -> None:
        self.a = admission
        # memory of plain init containers reusable by later ones: (mask, kind) -> bytes
        self.reuse: dict[tuple[NumaMask, str], int] = {}

    def ask(self, unit: Sequence[Container]) -> Ask:
        a = self.a
        per = {c.name: memory_request(a.pod, c) for c in a.pod.all_containers}
        req = a.unit_map(unit, per)
        if len(unit) > 1:
            # the memory manager's pod request (getPodRequestedResources) has only the
            # memory types the app containers ask for: a type only init containers or
            # sidecars ask for takes no part in the pod's hints
            asked = {k for c in a.pod.containers for k in per[c.name]}
            req = {k: v for k, v in req.items() if k in asked}
        if not req:
            return Ask()
        return Ask([memory_demand(a.machine, a.work, req, self._reusable())])

    def hints(self, ask: Ask,
              lists: Sequence[list[TopologyHint]]) -> dict[str, list[TopologyHint] | None]:
        out: dict[str, list[TopologyHint] | None] = {}
        for d, hints in zip(ask.demands, lists, strict=True):
            # the memory manager returns no hint at all when no mask can hold the request:
            # no preference (its Allocate then fails), not "cannot satisfy"
            if hints:
                for k in d.keys:
                    out[k] = list(hints)
        return out

    def _reusable(self) -> dict[NumaMask, dict[str, int]]:
        out: dict[NumaMask, dict[str, int]] = {}
        for (m, kind), b in self.reuse.items():
            if b:
                out.setdefault(m, {})[kind] = b
        return out

    def report(self) -> None:
        return None

    def allocate(self, c: Container, hint: TopologyHint, alloc: ContainerAllocation) -> None:
        """The memory manager's Allocate: the default hint when the affinity is nil,
        extended when the affinity's free memory cannot hold the request, refused when it
        breaks the NUMA grouping rule; then bytes are taken node by node (lowest id
        first), less what the pod's init containers hold with the same affinity."""
        req = memory_request(self.a.pod, c)
        if not req:
            return
        work = self.a.work
        d = memory_demand(self.a.machine, work, req, self._reusable())

        def free_holds(m: NumaMask) -> bool:  # isAffinitySatisfyRequest: free memory only
            return all(sum(work.free_memory(nd, k) for nd in mask_ids(m)) >= v
                       for k, v in req.items())

        best, preferred = hint.mask, hint.preferred
        if best is None:
            best = self._best_hint(d, 0)
            if best is None:
                raise AllocationFailed("[memorymanager] failed to get the default NUMA "
                                       "affinity, no NUMA nodes with enough memory is available")
            if preferred and best.bit_count() != d.min_width():
                raise AllocationFailed("[memorymanager] failed to find the default preferred "
                                       "hint")
            preferred = best.bit_count() == d.min_width()
        if not free_holds(best):
            ext = self._best_hint(d, best)
            if ext is None:
                raise AllocationFailed("[memorymanager] failed to find NUMA nodes to extend "
                                       "the current topology hint")
            if preferred and ext.bit_count() != d.min_width():
                raise AllocationFailed("[memorymanager] failed to find the extended preferred "
                                       "hint")
            best = ext
        nodes = mask_ids(best)
        if len(nodes) > 1:
            for nd in nodes:
                if work.assignments.get(nd, 0) > 0:
                    group = work.cells.get(nd, 0)
                    if group.bit_count() <= 1 or group != best:
                        raise AllocationFailed("[memorymanager] preferred hint violates NUMA "
                                               "node allocation")
        self._take(c, req, best, alloc)

    def _take(self, c: Container, req: Mapping[str, int], best: NumaMask,
              alloc: ContainerAllocation) -> None:
        work = self.a.work
        nodes = mask_ids(best)
        for kind, size in req.items():
            r = self.reuse.get((best, kind), 0)
            left = 0 if r >= size else size - r
            per: dict[int, int] = {}
            for nd in nodes:
                if left <= 0:
                    break
                take = min(max(0, work.free_memory(nd, kind)), left)
                if take:
                    per[nd] = take
                    left -= take
            alloc.memory[kind] = per
            key = (best, kind)
            if c.is_init:  # what later containers may reuse: the largest init block
                self.reuse[key] = max(r, size)
            elif r:  # used up by this container
                self.reuse[key] = 0 if size >= r else r - size
        alloc.memory_mask = best

    def _best_hint(self, d: Demand, within: NumaMask) -> NumaMask | None:
        """The memory manager's findBestHint over its hints containing ``within``: the
        narrowest (preferred ones are the narrowest), then the lowest mask value."""
        if len(d.domain) <= FULL_LIMIT:
            found = [m for m in iterate_masks(d.domain) if m & within == within and d.fits(m)]
            if not found:
                return None
            return min(found, key=lambda m: (m.bit_count(), m))
        start = max(1, within.bit_count())
        for k in range(start, len(d.domain) + 1):
            m = best_subset(d.domain, k, d.fits, tables=[(d.free, d.request)],
                            forced=within | d.required, prune=d.extendable)
            if m is not None:
                return m
        return None
