"""The Topology Manager merge, exact to the kubelet, without walking the cross product.

The kubelet (pkg/kubelet/cm/topologymanager, policy.go) takes one hint per resource in
every combination, ANDs the masks (nil = any NUMA node; the result is also ANDed with the
machine's nodes), calls the merged hint preferred iff every hint is preferred and all
non-nil masks are equal, and keeps the best merged hint under ``HintMerger.compare``.
That comparison is a total order on merged masks (ties between equal masks keep the hint
seen first, which is the same hint), so the best hint is the minimum of a key over the
set of *reachable* merged hints, whatever the iteration order. This module computes that
minimum from the structure of the problem:

* Preferred merged hints: all non-nil masks equal means a preferred merged mask is one
  raw mask ``M`` that every resource offers as a preferred hint (or that resource offers
  a preferred nil hint, "any"), or the all-nodes mask when every resource offers a
  preferred nil hint. That is a hash intersection, linear in the number of hints.
* Non-preferred merged hints (only looked at when no preferred one is non-empty): the
  reachable set is the set of ANDs of one mask per resource, computed by
  :mod:`.reachable` without the cross product.

``numalign.topology`` does no I/O and imports nothing from Kubernetes.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from numalign.topology.errors import TopologyError
from numalign.topology.hints import NumaMask, ProviderHints, TopologyHint, mask_ids, mask_of
from numalign.topology.policies import get_policy
from numalign.topology.policies.base import AlignmentPolicy
from numalign.topology.policyconfig import POLICY_NONE, PolicyOptions, check_numa_node_count
from numalign.topology.reachable import reachable_non_preferred

# How many of the best merged candidates a MergeResult keeps for `numalign explain`.
EXPLAIN_CANDIDATES = 5

REJECT_REASON = "TopologyAffinityError"
REJECT_MESSAGE = "Pod was rejected: Resources cannot be allocated with Topology locality"


@dataclass(frozen=True, slots=True)
class ResourceHints:
    """One entry of the kubelet's filtered hint lists: a provider's resource (``None``
    when the provider gave no output at all) and the hints the merge works on."""

    provider: int
    resource: str | None
    hints: tuple[TopologyHint, ...]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A merged hint that took part in the final comparison."""

    mask: NumaMask
    preferred: bool
    width: int
    distance_sum: int | None = None  # over ordered pairs; average = sum / width**2

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "numaNodes": mask_ids(self.mask),
            "preferred": self.preferred,
            "width": self.width,
        }
        if self.distance_sum is not None and self.width:
            out["averageDistance"] = self.distance_sum / (self.width * self.width)
        return out


@dataclass(frozen=True, slots=True)
class MergeResult:
    hint: TopologyHint
    admit: bool
    policy: str = POLICY_NONE
    resources: tuple[ResourceHints, ...] = ()
    best_non_preferred_affinity_count: int = 0
    candidates: tuple[Candidate, ...] = ()  # best first
    reason: str = ""
    stats: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"hint": self.hint.to_json(), "admit": self.admit}


def _bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def filter_providers_hints(providers: Sequence[ProviderHints]) -> list[ResourceHints]:
    """The kubelet's ``filterProvidersHints``: no output from a provider (nil or empty map)
    and a nil list for a resource are "no preference" ([{nil, preferred}]); an empty list
    is "cannot satisfy" ([{nil, not preferred}])."""
    out: list[ResourceHints] = []
    for index, provider in enumerate(providers):
        if not provider:
            out.append(ResourceHints(index, None, (TopologyHint(None, True),)))
            continue
        for name, hints in provider.items():
            if hints is None:
                out.append(ResourceHints(index, name, (TopologyHint(None, True),)))
            elif len(hints) == 0:
                out.append(ResourceHints(index, name, (TopologyHint(None, False),)))
            else:
                out.append(ResourceHints(index, name, tuple(hints)))
    return out


def keep_hints(policy: AlignmentPolicy, resources: list[ResourceHints]) -> list[ResourceHints]:
    """What the merge sees of each resource's hints under ``policy`` (single-numa-node:
    the kubelet's ``filterSingleNumaHints``; a resource may be left with no hint)."""
    out: list[ResourceHints] = []
    for r in resources:
        kept = policy.keep_hints(r.hints)
        out.append(r if kept is r.hints else ResourceHints(r.provider, r.resource, kept))
    return out


def max_of_min_affinity_counts(lists: Iterable[Sequence[TopologyHint]]) -> int:
    """``bestNonPreferredAffinityCount``: over resources, the width of the resource's
    narrowest non-nil hint (raw mask); the largest of those, 0 when there is none."""
    best = 0
    for hints in lists:
        widths = [h.mask.bit_count() for h in hints if h.mask is not None]
        if widths:
            best = max(best, min(widths))
    return best


class _Distances:
    """Sums of NUMA distances over ordered pairs of a mask's nodes (self pairs
    included); the kubelet's CalculateAverageFor is that sum / width**2."""

    def __init__(self, distances: Mapping[int, Mapping[int, int]], numa_ids: Sequence[int]):
        self._d = distances
        self._cache: dict[int, int] = {}
        for a in numa_ids:
            row = distances.get(a)
            if row is None:
                raise TopologyError("distances", f"no distances for NUMA node {a}")
            for b in numa_ids:
                if b not in row:
                    raise TopologyError(
                        f"distances.{a}", f"no distance to NUMA node {b}"
                    )

    def sum(self, mask: int) -> int:
        got = self._cache.get(mask)
        if got is None:
            ids = list(_bits(mask))
            total = 0
            for a in ids:
                row = self._d[a]
                for b in ids:
                    total += row[b]
            self._cache[mask] = got = total
        return got


def merge(
    policy: str | AlignmentPolicy,
    providers: Sequence[ProviderHints],
    numa_ids: Sequence[int],
    distances: Mapping[int, Mapping[int, int]] | None,
    options: PolicyOptions,
) -> MergeResult:
    """Merge the providers' hints under ``policy`` exactly as the kubelet does.

    Raises TopologyError for input the kubelet would refuse when building the policy:
    an unknown policy, more NUMA nodes than ``max-allowable-numa-nodes``, or
    ``prefer-closest-numa-nodes`` without distances. ``policy`` is a name or the
    policy itself (admission looks it up once and passes it).
    """
    pol = policy if isinstance(policy, AlignmentPolicy) else get_policy(policy)
    policy = pol.name
    if not pol.aligns:
        # The kubelet's none policy does not merge (and does not even parse options).
        return MergeResult(TopologyHint(None, False), True, policy,
                           reason=f"policy {policy}")

    ids = list(numa_ids)
    if len(set(ids)) != len(ids):
        raise TopologyError("numaNodes", "NUMA node ids must be distinct")
    for i in ids:
        if i < 0:
            raise TopologyError("numaNodes", f"NUMA node id {i} is negative")
    check_numa_node_count(ids, options)
    dist: _Distances | None = None
    if options.prefer_closest_numa_nodes:
        if distances is None:
            raise TopologyError(
                "distances",
                "prefer-closest-numa-nodes needs NUMA distances "
                "(the kubelet: error getting NUMA distances from cadvisor)",
            )
        dist = _Distances(distances, ids)
    closest = dist is not None and pol.closest_applies

    default = mask_of(ids)
    resources = keep_hints(pol, filter_providers_hints(providers))
    lists = [r.hints for r in resources]
    bnp = max_of_min_affinity_counts(lists)

    def tie(mask: int) -> tuple[int, ...]:
        if closest and dist is not None:
            return (dist.sum(mask), mask)
        return (mask,)

    def preferred_key(mask: int) -> tuple[int, ...]:
        return (mask.bit_count(), *tie(mask))

    def non_preferred_key(mask: int) -> tuple[int, ...]:
        c = mask.bit_count()
        if c == bnp:
            head = (0, 0)
        elif c < bnp:
            head = (1, -c)
        else:
            head = (2, c)
        return (*head, *tie(mask))

    stats: dict[str, int] = {"resources": len(lists), "hints": sum(len(h) for h in lists)}
    best: int | None = None
    preferred = False
    pool: list[int] = []
    reason: str
    top: list[int] = []
    if any(len(h) == 0 for h in lists):
        reason = "a resource has no usable hint, so there is no combination to merge"
    else:
        pool = _preferred_masks(lists, default)
        stats["preferred_candidates"] = len(pool)
        if pool:
            top = heapq.nsmallest(EXPLAIN_CANDIDATES, pool, key=preferred_key)
            best = top[0]
            preferred = True
            reason = (
                "preferred: every resource prefers this mask (or has no preference); "
                + (
                    "narrowest, then lowest average distance, then lowest node ids"
                    if closest
                    else "narrowest, then lowest node ids"
                )
            )
        else:
            pool = reachable_non_preferred(lists, default, bnp, stats)
            if pool:
                top = heapq.nsmallest(EXPLAIN_CANDIDATES, pool, key=non_preferred_key)
                best = top[0]
                c = best.bit_count()
                where = (
                    f"width == {bnp}"
                    if c == bnp
                    else f"widest below {bnp}" if c < bnp else f"narrowest above {bnp}"
                )
                reason = (
                    "no mask is preferred by every resource; non-preferred, best "
                    f"non-preferred affinity count {bnp}: {where}"
                )
            else:
                reason = "every combination of hints has an empty NUMA mask"

    if best is None:
        hint = TopologyHint(default, False)
        reason += "; default: all NUMA nodes, not preferred"
    else:
        hint = TopologyHint(best, preferred)
    hint = pol.report(hint, default)
    admit = pol.admits(hint)

    candidates = tuple(
        Candidate(m, preferred, m.bit_count(), dist.sum(m) if closest and dist else None)
        for m in top
    )
    return MergeResult(
        hint, admit, policy, tuple(resources), bnp, candidates, reason, stats
    )


def _preferred_masks(lists: Sequence[Sequence[TopologyHint]], default: int) -> list[int]:
    """Every non-empty merged mask of a preferred combination."""
    pref_sets: list[set[int]] = []
    any_ok: list[bool] = []
    for hints in lists:
        s: set[int] = set()
        nil = False
        for h in hints:
            if h.preferred:
                if h.mask is None:
                    nil = True
                else:
                    s.add(h.mask)
        pref_sets.append(s)
        any_ok.append(nil)
    out: set[int] = set()
    if all(any_ok) and default:
        out.add(default)  # every resource picks its preferred nil hint
    constrained = [s for s, nil in zip(pref_sets, any_ok, strict=True) if not nil]
    if constrained:
        seeds: set[int] = min(constrained, key=len)
    else:
        seeds = set().union(*pref_sets)
    for m in seeds:
        if all(nil or m in s for s, nil in zip(pref_sets, any_ok, strict=True)):
            merged = m & default
            if merged:
                out.add(merged)
    return list(out)
