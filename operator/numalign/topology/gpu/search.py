"""The joint placement of several GPU requests.

A depth-first branch and bound over each request's candidates
(:meth:`.candidates.Problem.candidates`), most constrained request first (every order of up
to four requests on small machines), pruned on the score bound. What keeps it cheap
whatever a pod's annotation asks, without changing its answer where it runs to the end:

- Requests with the same constraints (resource, count, eligible devices, pools,
  ``withResource``) are one class: orders that differ only by swapping requests of a class
  are searched once, and a complete allocation gives a class's device sets to its requests
  in ascending order (the tie-break's choice among those swaps). Consecutive one-device
  requests of a class take their devices in ascending order.
- A partial allocation is expanded once per free state: the rest of the search depends
  only on the requests still to place and the devices still free.
- Candidate lists are computed once per class and free state; the last request takes its
  first candidate only; more devices asked than eligible ends the search at once.
- The scored search stops after ``SEARCH_BUDGET`` steps with the best allocation found;
  the feasibility search (``find_any``, what hints use) has no budget and is bounded by
  the free states it can reach.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from ..hints import NumaMask, mask_ids
from .candidates import Candidate, Problem
from .scorers import Score

SMALL_TREE = 64  # leaves in all trees involved up to which the search tries every candidate
WIDE_BREADTH = 3  # candidates tried per request on bigger machines
SEARCH_BUDGET = 1000  # partial allocations expanded plus complete ones scored, per search

_INF = 1 << 62


@dataclass
class SearchStats:
    """What the searches did (summed over every search given the same object).

    ``expanded``: partial allocations whose next request's candidates were tried;
    ``evaluated``: candidate lists computed (the others came from the search's cache);
    ``scored``: complete allocations compared; ``truncated``: searches the budget stopped.
    """

    searches: int = 0
    expanded: int = 0
    evaluated: int = 0
    scored: int = 0
    truncated: int = 0


def joint_search(prob: Problem, state: Mapping[str, int], numa: NumaMask | None,
                 find_any: bool, stats: SearchStats | None = None
                 ) -> tuple[Score, list[Candidate]] | None:
    """The best (or, with ``find_any``, the first) joint allocation, or None."""
    st = stats if stats is not None else SearchStats()
    st.searches += 1
    n = len(prob.requests)
    cls = prob.classes[find_any]
    cache: dict[tuple[int, ...], list[Candidate]] = {}

    def cands(i: int, cur: Mapping[str, int], later: Mapping[str, int] | None
              ) -> list[Candidate]:
        res = prob.res(i)
        wr = prob.requests[i].with_resource
        nres = wr.resource if wr is not None else res
        av = later or {}
        key = (cls[i], cur[res], cur[nres], av.get(res, 0), av.get(nres, 0))
        got = cache.get(key)
        if got is None:
            st.evaluated += 1
            got = prob.candidates(i, cur, numa, state, later, find_any)
            cache[key] = got
        return got

    elig = [prob.eligible(i, state, numa) for i in range(n)]
    counts = [r.count for r in prob.requests]
    # More devices asked of a resource than its requests could take together: no search.
    need: dict[str, list[int]] = {}
    for i, r in enumerate(prob.requests):
        got = need.setdefault(prob.res(i), [0, 0])
        got[0] += r.count
        got[1] |= elig[i]
        if r.with_resource is not None:
            wr = r.with_resource
            got = need.setdefault(wr.resource, [0, 0])
            got[0] += wr.count
            got[1] |= state[wr.resource] & prob.trees[wr.resource].within_numa(numa)
    if any(k > bits.bit_count() for k, bits in need.values()):
        return None
    first = [cands(i, state, None) for i in range(n)]
    if any(not c for c in first):
        return None
    if n == 1:
        c = first[0][0]
        return (c.tight, c.frag), [c]
    slack = [elig[i].bit_count() - counts[i] for i in range(n)]
    base = sorted(range(n), key=lambda i: (slack[i], -counts[i], i))
    orders = [base]
    if n <= 4:
        orders += [list(o) for o in itertools.permutations(base) if list(o) != base]
    # Orders that differ by swapping requests of one class are the same search.
    seqs: set[tuple[int, ...]] = set()
    distinct: list[list[int]] = []
    for o in orders:
        seq = tuple(cls[i] for i in o)
        if seq not in seqs:
            seqs.add(seq)
            distinct.append(o)
    min_tight = [first[i][0].tight for i in range(n)]
    leaves = sum(len(prob.trees[r].devices) for r in prob.resources)
    small = leaves <= SMALL_TREE
    breadth = _INF if small else WIDE_BREADTH
    frag_floor = prob.frag_floor
    members: dict[int, list[int]] = {}
    for i in range(n):
        members.setdefault(cls[i], []).append(i)
    multi = [m for m in members.values() if len(m) > 1]
    resources = prob.resources
    best: list[tuple[Score, list[Candidate]]] = []
    picks: list[Candidate | None] = [None] * n
    spent = [0]
    # find_any: (classes still to place, free state) known to fail. Scored: (requests
    # still to place, free state, device sets of the classes split between placed and not)
    # -> the best prefix seen: score, and the placed requests of whole classes.
    failed: set[tuple[Hashable, ...]] = set()
    seen: dict[tuple[Hashable, ...], tuple[int, int, tuple[Candidate, ...]]] = {}
    suffix_ids: dict[tuple[int, ...], int] = {}

    def canon(ps: Sequence[Candidate], groups: list[list[int]]) -> list[Candidate]:
        """``ps`` with each group's sets in ascending order (groups index ``ps``)."""
        out = list(ps)
        for group in groups:
            for j, c in zip(group, sorted((ps[j] for j in group), key=_ids), strict=True):
                out[j] = c
        return out

    def out_of_budget() -> bool:
        if spent[0] < SEARCH_BUDGET:
            return False
        st.truncated += 1
        return True

    def run(order: list[int]) -> bool:
        rest_lb = [0] * (n + 1)
        later: list[dict[str, int]] = [{} for _ in range(n + 1)]
        for pos in range(n - 1, -1, -1):
            i = order[pos]
            rest_lb[pos] = rest_lb[pos + 1] + min_tight[i]
            later[pos] = dict(later[pos + 1])
            res = prob.res(i)
            later[pos][res] = later[pos].get(res, 0) | elig[i]
            wr = prob.requests[i].with_resource
            if wr is not None:
                nt = prob.trees[wr.resource]
                later[pos][wr.resource] = (later[pos].get(wr.resource, 0)
                                           | state[wr.resource] & nt.within_numa(numa))
        sfx: list[int] = []
        split: list[list[int]] = []
        whole: list[list[int]] = []  # placed requests of classes placed whole, by index
        whole_groups: list[list[list[int]]] = []  # their classes (positions in whole[pos])
        for pos in range(n + 1):
            rest = order[pos:]
            ident = tuple(cls[i] for i in rest) if find_any else tuple(rest)
            sfx.append(suffix_ids.setdefault(ident, len(suffix_ids)))
            if find_any:
                continue
            open_cls = {cls[i] for i in rest}
            done = sorted(order[:pos])
            split.append([j for j in done if cls[j] in open_cls])
            whole.append([j for j in done if cls[j] not in open_cls])
            at = {j: k for k, j in enumerate(whole[-1])}
            whole_groups.append([[at[j] for j in m] for m in multi if m[0] in at])
        # A run of single-device requests of one class, on a small machine, takes every
        # free eligible device as a candidate: its devices are tried in ascending order
        # when their sets can all be tried (else greedy first, as the budget will cut).
        run_left = [0] * (n + 1)
        if small and not find_any:
            for pos in range(n - 1, -1, -1):
                i = order[pos]
                if prob.singles[i]:
                    nxt_same = pos + 1 < n and cls[order[pos + 1]] == cls[i]
                    run_left[pos] = 1 + (run_left[pos + 1] if nxt_same else 0)
            for pos in range(n):
                r = run_left[pos]
                if r and (pos == 0 or run_left[pos - 1] != r + 1):
                    i = order[pos]
                    sets = math.comb((elig[i] & prob.pooled[i]).bit_count(), r)
                    if sets > SEARCH_BUDGET:
                        run_left[pos:pos + r] = [0] * r

        def dfs(pos: int, cur: dict[str, int], tight: int, frag: int) -> bool:
            if not find_any and out_of_budget():
                return True
            if pos == n:
                st.scored += 1
                spent[0] += 1
                if find_any:
                    best[:] = [((tight, frag), [p for p in picks if p is not None])]
                    return True
                score = (tight, frag)
                done = canon([p for p in picks if p is not None], multi)
                if not best or score < best[0][0] or (score == best[0][0] and _lower(
                        done, best[0][1])):
                    best[:] = [(score, done)]
                return False
            above = 0  # the devices of the run's earlier requests and below (in a run)
            if pos and run_left[pos] and run_left[pos - 1] == run_left[pos] + 1:
                p = picks[order[pos - 1]]
                assert p is not None
                above = (p.bits << 1) - 1
            state_key = (sfx[pos], *(cur[r] for r in resources))
            if find_any:
                if state_key in failed:
                    return False
            else:
                key = (*state_key, above, *sorted(
                    (cls[j], c.bits, c.extra) for j in split[pos]
                    if (c := picks[j]) is not None))
                prefix = tuple(c for j in whole[pos] if (c := picks[j]) is not None)
                prev = seen.get(key)
                if prev is not None:
                    if (tight, frag) > prev[:2]:
                        return False
                    if (tight, frag) == prev[:2]:
                        if not prefix:
                            return False
                        g = whole_groups[pos]
                        if ([_ids(c) for c in canon(prefix, g)]
                                >= [_ids(c) for c in canon(prev[2], g)]):
                            return False
                seen[key] = (tight, frag, prefix)
            st.expanded += 1
            spent[0] += 1
            i = order[pos]
            cs = cands(i, cur, later[pos + 1])
            wr = prob.requests[i].with_resource
            need = run_left[pos] - 1  # the run's later requests
            free_above = 0
            if need > 0:
                for c in cs:
                    free_above |= c.bits
            last = pos == n - 1 and not find_any
            done_last = False
            for tried, c in enumerate(cs):
                if tried >= breadth:
                    break
                if c.bits & above or (free_above & ~((c.bits << 1) - 1)).bit_count() < need:
                    continue
                if last and done_last:
                    # Best first, ties by the lowest devices: no later set of the last
                    # request scores better, or sorts lower among its class's sets.
                    break
                done_last = last
                if best:
                    bt, bf = best[0][0]
                    t = tight + c.tight + rest_lb[pos + 1]
                    if t > bt or (t == bt and frag + c.frag + frag_floor > bf):
                        break
                nxt = dict(cur)
                nxt[prob.res(i)] &= ~c.bits
                if wr is not None:
                    nxt[wr.resource] &= ~c.extra
                picks[i] = c
                if dfs(pos + 1, nxt, tight + c.tight, frag + c.frag):
                    picks[i] = None
                    return True
            picks[i] = None
            if find_any:
                failed.add(state_key)
            return False

        return dfs(0, dict(state), 0, 0)

    for order in distinct:
        stop = run(order)
        if stop or (best and (find_any or not small)):
            break
    return best[0] if best else None


def _ids(c: Candidate) -> list[int]:
    return mask_ids(c.bits)


def _lower(a: list[Candidate], b: list[Candidate]) -> bool:
    """Tie-break between equal scores: the lowest devices for the first request, ..."""
    return [mask_ids(c.bits) for c in a] < [mask_ids(c.bits) for c in b]
