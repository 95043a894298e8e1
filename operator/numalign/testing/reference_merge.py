"""A brute-force reference of the kubelet Topology Manager merge.

Written straight from the kubelet's algorithm (pkg/kubelet/cm/topologymanager: policy.go
HintMerger / mergePermutation / compare, numa_info.go Narrowest / Closest /
CalculateAverageFor, policy_single_numa_node.go): walk the whole cross product, merge each
permutation, and fold the merged hints with the kubelet's pairwise ``compare``. Clear and
slow on purpose; the fast engine is checked against it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from numalign.topology.hints import ProviderHints, TopologyHint
from numalign.topology.policyconfig import PolicyOptions


def _count(mask: int) -> int:
    return bin(mask).count("1")


def _is_narrower_than(a: int, b: int) -> bool:
    # bitmask.IsNarrowerThan: fewer bits; equal counts -> IsLessThan (smaller uint64).
    if _count(a) == _count(b):
        return a < b
    return _count(a) < _count(b)


def _average_distance(distances: Mapping[int, Mapping[int, int]], mask: int) -> float:
    # NUMADistances.CalculateAverageFor: all ordered pairs, self pairs included.
    if _count(mask) == 0:
        return 0.0
    bits = [i for i in range(mask.bit_length()) if mask >> i & 1]
    total = 0.0
    count = 0.0
    for a in bits:
        for b in bits:
            total += float(distances[a][b])
            count += 1
    return total / count


def reference_merge(
    policy: str,
    providers: Sequence[ProviderHints],
    numa_ids: Sequence[int],
    distances: Mapping[int, Mapping[int, int]] | None,
    options: PolicyOptions,
) -> tuple[TopologyHint, bool]:
    if policy == "none":
        return TopologyHint(None, False), True

    # filterProvidersHints
    lists: list[list[TopologyHint]] = []
    for provider in providers:
        if not provider:
            lists.append([TopologyHint(None, True)])
            continue
        for hints in provider.values():
            if hints is None:
                lists.append([TopologyHint(None, True)])
            elif len(hints) == 0:
                lists.append([TopologyHint(None, False)])
            else:
                lists.append(list(hints))

    if policy == "single-numa-node":
        # filterSingleNumaHints
        lists = [
            [
                h
                for h in hints
                if h.preferred and (h.mask is None or _count(h.mask) == 1)
            ]
            for hints in lists
        ]

    default = 0
    for i in numa_ids:
        default |= 1 << i

    # maxOfMinAffinityCounts
    best_np = 0
    for hints in lists:
        narrowest: int | None = None
        for h in hints:
            if h.mask is None:
                continue
            if narrowest is None or _is_narrower_than(h.mask, narrowest):
                narrowest = h.mask
        if narrowest is not None and _count(narrowest) > best_np:
            best_np = _count(narrowest)

    closest = options.prefer_closest_numa_nodes and policy != "single-numa-node"

    def narrowest_of(a: int, b: int) -> int:
        return a if _is_narrower_than(a, b) else b

    def closest_of(a: int, b: int) -> int:
        assert distances is not None
        if _count(a) != _count(b):
            return narrowest_of(a, b)
        da = _average_distance(distances, a)
        db = _average_distance(distances, b)
        if da == db:
            return a if a < b else b
        return a if da < db else b

    def compare_masks(current: TopologyHint, candidate: TopologyHint) -> TopologyHint:
        assert current.mask is not None and candidate.mask is not None
        if candidate.mask == current.mask:
            return current
        chosen = (closest_of if closest else narrowest_of)(current.mask, candidate.mask)
        return current if chosen == current.mask else candidate

    def compare(current: TopologyHint | None, candidate: TopologyHint) -> TopologyHint | None:
        assert candidate.mask is not None
        if _count(candidate.mask) == 0:
            return current
        if current is None:
            return candidate
        assert current.mask is not None
        if not current.preferred and candidate.preferred:
            return candidate
        if current.preferred and not candidate.preferred:
            return current
        if current.preferred and candidate.preferred:
            return compare_masks(current, candidate)
        cur, cand = _count(current.mask), _count(candidate.mask)
        if cur > best_np:
            return compare_masks(current, candidate)
        if cur == best_np:
            if cand != best_np:
                return current
            return compare_masks(current, candidate)
        if cand > best_np:
            return current
        if cand == best_np:
            return candidate
        if cand > cur:
            return candidate
        if cand < cur:
            return current
        return compare_masks(current, candidate)

    best: TopologyHint | None = None
    for permutation in itertools.product(*lists):
        # mergePermutation
        preferred = True
        merged = default
        first: int | None = None
        for h in permutation:
            if h.mask is not None:
                if first is None:
                    first = h.mask
                elif h.mask != first:
                    preferred = False
                merged &= h.mask
            if not h.preferred:
                preferred = False
        best = compare(best, TopologyHint(merged, preferred))

    if best is None:
        best = TopologyHint(default, False)
    if policy == "single-numa-node" and best.mask == default:
        best = TopologyHint(None, best.preferred)
    admit = best.preferred if policy in ("restricted", "single-numa-node") else True
    return best, admit
