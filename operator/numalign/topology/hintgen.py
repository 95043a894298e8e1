"""Hint generation for one admission decision, exact on small machines and reduced on
wide ones, with the same merge answer as the kubelet's full hint lists.

Up to ``FULL_LIMIT`` NUMA nodes every provider lists every fitting mask, as the kubelet
does (``providers.full_hints``). Past that, 2^N masks cannot be walked (64 nodes), and a
*reduced* list per resource is generated instead. Why it gives the same merge answer:

1. Every reduced list is a sub-list of the kubelet's list (only masks the provider would
   list, with the kubelet's ``preferred`` flag: width == the provider's capacity-based
   minimal width). So every merged hint reachable from the reduced lists is reachable
   from the full lists.
2. The merge keeps the best merged hint under a total order (``merge.merge``: preferred
   first, narrowest then fittest; non-preferred ranked around B, the largest over
   resources of the resource's narrowest hint width). B is kept: each reduced list
   holds its resource's narrowest fitting mask (found by an exhaustive search below).
3. The full answer is kept reachable: the reduced lists hold its witnesses. So the best
   of a subset that contains the overall best is the overall best.

The full answer is found by searching the structure instead of enumerating: fitting is
additive per node (sums of free CPUs / devices / bytes against the request, plus the
nodes reusable items pin, plus the memory manager's group rule), so

* preferred answer: when every resource with hints has the same minimal width w, the
  fittest w-wide mask every resource can use. ``best_subset`` finds it by a depth-first
  search in the merge's order (lowest mask value: the highest node id as low as
  possible, then the next; or, with prefer-closest-numa-nodes, a branch-and-bound on the
  sum of distances), pruned by per-resource upper bounds on what the remaining nodes can
  add;
* non-preferred answer (no preferred mask exists): the fittest mask s of width B (then
  narrower ones widest first, then wider ones) that is an AND of one hint per resource.
  s is such an AND if one resource can use s itself and the others some superset of it,
  or two resources can use s plus disjoint extra nodes (the other resources then take
  any superset). The witnesses found are put in the lists.
* single-numa-node keeps only preferred one-node hints and nil: every fitting one-node
  mask is listed, so its filtered lists are the kubelet's.
* lists the caller already has (``fixed``: device resources without a NUMA node, a GPU
  override's hints, "cannot satisfy") take part as they are: a preferred answer must be
  preferred in them too, and a non-preferred AND may use any of their masks.

``tests/unit/test_demands.py`` checks the claim: on random machines, states and
requests, the merge of the reduced lists equals the merge of the full kubelet lists.

Limits, reported as ``exact=False`` on the plan: a search that runs out of its budget
(very wide masks under prefer-closest-numa-nodes), and a non-preferred AND the greedy
witness completion does not find (needs three or more resources to cut one mask, or a
memory group rule the greedy completion trips over).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .demands import Demand, full_hints
from .hints import NumaMask, TopologyHint, mask_of
from .policies import get_policy
from .policies.base import AlignmentPolicy
from .subsets import SEARCH_BUDGET, SearchStats, Table, best_subset

__all__ = ["FULL_LIMIT", "HintPlan", "best_subset", "plan_hints"]

FULL_LIMIT = 10
CLOSEST_BUDGET = 20_000  # prefer-closest-numa-nodes: branch-and-bound nodes per search


# ---------------------------------------------------------------- the plan


@dataclass
class HintPlan:
    """Hint lists per demand (same order as the demands) and how they were made."""

    lists: list[list[TopologyHint]]
    method: str  # "full" | "reduced" | "none"
    exact: bool = True
    notes: list[str] = field(default_factory=list)


def plan_hints(demands: Sequence[Demand], numa_ids: Sequence[int],
               distances: Mapping[int, Mapping[int, int]] | None,
               policy: str | AlignmentPolicy,
               prefer_closest: bool, full_limit: int = FULL_LIMIT,
               fixed: Sequence[Sequence[TopologyHint] | None] = ()) -> HintPlan:
    """Hint lists for ``demands``. ``fixed`` are the other resources' lists of the same
    decision (None = no preference, [] = cannot satisfy), which take part in the merge
    as they are. ``policy``: a name or the policy itself."""
    pol = policy if isinstance(policy, AlignmentPolicy) else get_policy(policy)
    if not pol.aligns:
        return HintPlan([[] for _ in demands], "none")
    if len(numa_ids) <= full_limit:
        return HintPlan([full_hints(d) for d in demands], "full")
    return _reduced(demands, distances if prefer_closest and pol.closest_applies
                    else None, pol, [list(f) for f in fixed if f is not None],
                    mask_of(list(numa_ids)))


def _table(d: Demand) -> Table:
    return (d.free, d.request)


def _complete(d: Demand, s: NumaMask, exclude: NumaMask) -> NumaMask | None:
    """Greedy: ``s`` plus the pinned nodes plus the freest other nodes until ``d`` fits."""
    m = s | d.required
    if m & ~d.domain_mask:
        return None
    if d.fits(m):
        return m
    sums = d.sums(m)
    cap = d.sums(m, d.capacity)
    others = [n for n in d.domain if not (m | exclude) >> n & 1]
    others.sort(key=lambda n: (*(-x for x in d.free.get(n, ())), n))
    zero = (0,) * len(d.request)
    for n in others:
        if d.reach is not None and not d.reach(m | 1 << n):
            continue  # e.g. a node of another memory group: no hint can hold both
        m |= 1 << n
        for i, x in enumerate(d.free.get(n, zero)):
            sums[i] += x
        for i, x in enumerate(d.capacity.get(n, zero)):
            cap[i] += x
        if d.covers(sums) and d.covers(cap) and (d.valid is None or d.valid(m)):
            return m
    return None


def _fixed_ok_preferred(fixed: Sequence[Sequence[TopologyHint]], mask: NumaMask) -> bool:
    """Is ``mask`` a preferred merge with every fixed list (a preferred nil, or the same
    mask preferred)?"""
    for lst in fixed:
        if not any(h.preferred and (h.mask is None or h.mask == mask) for h in lst):
            return False
    return True


def _fixed_base(fixed: Sequence[Sequence[TopologyHint]], s: NumaMask,
                universe: NumaMask) -> NumaMask | None:
    """AND over fixed lists of each one's narrowest mask containing ``s`` (nil = all)."""
    base = universe
    for lst in fixed:
        sup = [universe if h.mask is None else h.mask for h in lst
               if h.mask is None or h.mask & s == s]
        if not sup:
            return None
        base &= min(sup, key=lambda m: (m.bit_count(), m))
    return base


def _reduced(demands: Sequence[Demand], dist: Mapping[int, Mapping[int, int]] | None,
             policy: AlignmentPolicy, fixed: Sequence[Sequence[TopologyHint]] = (),
             universe: NumaMask = 0) -> HintPlan:
    stats = SearchStats()
    chosen: list[dict[NumaMask, None]] = [{} for _ in demands]
    plan = HintPlan([], "reduced")
    narrowest: list[int | None] = []
    for i, d in enumerate(demands):
        w: int | None = None
        for k in range(1, len(d.domain) + 1):
            m = best_subset(d.domain, k, d.fits, tables=[_table(d)], forced=d.required,
                            stats=stats, prune=d.extendable)
            if m is not None:
                chosen[i][m] = None
                w = k
                break
            if stats.truncated:
                break
        narrowest.append(w)
        if w is not None:
            for n in d.domain:
                if d.fits(1 << n):
                    chosen[i][1 << n] = None
    live = [i for i, w in enumerate(narrowest) if w is not None]
    widths = {demands[i].min_width() for i in live}
    found = False
    if live and len(live) == len(demands) and len(widths) == 1 and all(fixed):
        w = widths.pop()
        cands = _common_domain([demands[i] for i in live])
        forced = 0
        for i in live:
            forced |= demands[i].required

        def fits_all(mask: NumaMask) -> bool:
            return (all(demands[i].fits(mask) for i in live)
                    and _fixed_ok_preferred(fixed, mask))

        def reach_all(mask: NumaMask) -> bool:
            return all(demands[i].extendable(mask) for i in live)

        p = best_subset(cands, w, fits_all, tables=[_table(demands[i]) for i in live],
                        forced=forced, distances=dist, stats=stats, prune=reach_all,
                        budget=CLOSEST_BUDGET if dist is not None else SEARCH_BUDGET)
        if p is not None:
            found = True
            for i in live:
                chosen[i][p] = None
    if not found and live and not policy.single_numa:
        ok = _non_preferred(demands, live, narrowest, chosen, dist, stats,
                            [f for f in fixed if f], universe)
        common = universe or -1
        for i in live:
            common &= demands[i].domain_mask
        if not ok and common:  # (with no node common to all, no AND exists: exact)
            plan.notes.append("no non-preferred AND found by the witness search")
            plan.exact = False
    if stats.truncated:
        plan.exact = False
        plan.notes.append("a search ran out of its budget")
    plan.lists = [[demands[i].hint(m) for m in chosen[i]] if narrowest[i] is not None else []
                  for i in range(len(demands))]
    return plan


def _common_domain(ds: Sequence[Demand]) -> list[int]:
    common = ds[0].domain_mask
    for d in ds[1:]:
        common &= d.domain_mask
    return [n for n in ds[0].domain if common >> n & 1]


def _non_preferred(demands: Sequence[Demand], live: list[int], narrowest: list[int | None],
                   chosen: list[dict[NumaMask, None]],
                   dist: Mapping[int, Mapping[int, int]] | None, stats: SearchStats,
                   fixed: Sequence[Sequence[TopologyHint]], universe: NumaMask) -> bool:
    ds = [demands[i] for i in live]
    b = max(w for w in narrowest if w is not None)
    for lst in fixed:
        widths = [h.mask.bit_count() for h in lst if h.mask is not None]
        if widths:
            b = max(b, min(widths))
    cands = _common_domain(ds)
    witnesses: dict[NumaMask, dict[int, NumaMask]] = {}

    def achievable(s: NumaMask) -> bool:
        base = _fixed_base(fixed, s, universe)
        if base is None:
            return False
        w = _witnesses(ds, s, base)
        if w is None:
            return False
        witnesses[s] = {live[j]: m for j, m in w.items()}
        return True

    def reach_all(mask: NumaMask) -> bool:
        return all(d.extendable(mask) for d in ds)

    single = len(ds) == 1 and not fixed
    tables = [_table(ds[0])] if single else []
    forced = ds[0].required if single else 0
    order = [b, *range(b - 1, 0, -1), *range(b + 1, len(cands) + 1)]
    for k in order:
        if k > len(cands):
            continue
        s = best_subset(cands, k, achievable, tables=tables, forced=forced, distances=dist,
                        stats=stats, prune=reach_all,
                        budget=CLOSEST_BUDGET if dist is not None else SEARCH_BUDGET)
        if s is not None:
            for i, m in witnesses[s].items():
                chosen[i][m] = None
            return True
        if stats.truncated:
            return False
    return False


def _witnesses(ds: Sequence[Demand], s: NumaMask, base: NumaMask) -> dict[int, NumaMask] | None:
    """One hint per demand whose AND (with ``base``, the fixed lists' part) is exactly
    ``s`` (see the module docstring)."""
    plain = [_complete(d, s, 0) for d in ds]
    if any(m is None for m in plain):
        return None  # some demand has no hint containing s (by the greedy completion)
    total = base
    for m in plain:
        total &= m or 0
    if total == s:
        return {j: m for j, m in enumerate(plain) if m is not None}
    for a in range(len(ds)):
        ma = plain[a]
        if ma is None:  # pragma: no cover - excluded above
            continue
        if ma & base == s:
            return {j: m for j, m in enumerate(plain) if m is not None}
        for b in range(len(ds)):
            if b == a:
                continue
            mb = _complete(ds[b], s, ma & base & ~s)
            if mb is None or ma & mb & base != s:
                continue
            out = {j: m for j, m in enumerate(plain) if m is not None}
            out[a], out[b] = ma, mb
            return out
    return None
