"""The best k-node subset of NUMA nodes with a property: a depth-first search in the
merge's order (or a branch and bound on distances), pruned by additive per-node bounds.
Used by the hint providers (minimal widths) and by hint generation (:mod:`.hintgen`)."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from .hints import NumaMask

Vector = tuple[int, ...]
SEARCH_BUDGET = 300_000

Table = tuple[Mapping[int, Vector], Vector]  # per-node vector, request


class _OutOfBudget(Exception):
    pass


@dataclass
class SearchStats:
    visits: int = 0
    truncated: bool = False


def best_subset(cands: Sequence[int], k: int, pred: Callable[[NumaMask], bool], *,
                tables: Sequence[Table] = (), forced: NumaMask = 0,
                distances: Mapping[int, Mapping[int, int]] | None = None,
                budget: int = SEARCH_BUDGET, stats: SearchStats | None = None,
                prune: Callable[[NumaMask], bool] | None = None) -> NumaMask | None:
    """The best ``k``-node mask over ``cands`` (containing ``forced``) with ``pred``: the
    lowest mask value, or with ``distances`` the lowest sum of distances over ordered
    pairs, then the lowest value. ``tables`` give additive bounds for pruning: a partial
    choice is dropped when even the best remaining nodes cannot reach a request; so is a
    partial mask for which ``prune`` says False (no answer can contain it)."""
    forced_ids = [c for c in cands if forced >> c & 1]
    if len(forced_ids) != forced.bit_count() or k < len(forced_ids):
        return None
    rest = [c for c in cands if not forced >> c & 1]
    m = k - len(forced_ids)
    if m > len(rest):
        return None
    st = stats if stats is not None else SearchStats()
    start = [0] * sum(len(r) for _, r in tables)
    base = _add(start, tables, forced_ids)
    reqs = [x for _, r in tables for x in r]
    cols = [[tbl.get(c, (0,) * len(r))[i] for c in rest] for tbl, r in tables
            for i in range(len(r))]
    top_cache: dict[tuple[int, int, int], int] = {}

    def top(col: int, count: int, hi: int) -> int:
        """Sum of the ``count`` largest values of column ``col`` among rest[:hi]."""
        if count <= 0:
            return 0
        key = (col, count, hi)
        got = top_cache.get(key)
        if got is None:
            got = sum(heapq.nlargest(count, cols[col][:hi]))
            top_cache[key] = got
        return got

    def tick() -> None:
        st.visits += 1
        if st.visits > budget:
            raise _OutOfBudget

    keep: Callable[[NumaMask], bool] = prune if prune is not None else _always
    if not keep(forced):
        return None
    incumbent: list[tuple[int, NumaMask]] = []
    try:
        if distances is None:
            return _numeric(rest, m, forced, base, reqs, cols, top, pred, tick, keep)
        return _closest(rest, m, forced, forced_ids, base, reqs, cols, top, pred, tick,
                        distances, keep, incumbent)
    except _OutOfBudget:
        st.truncated = True  # the best mask met so far (closest search) stands in
        return incumbent[0][1] if incumbent else None


def _always(mask: NumaMask) -> bool:
    return True


def _add(sums: list[int], tables: Sequence[Table], ids: Sequence[int]) -> list[int]:
    out = list(sums)
    for c in ids:
        j = 0
        for tbl, r in tables:
            v = tbl.get(c)
            for i in range(len(r)):
                if v is not None:
                    out[j] += v[i]
                j += 1
    return out


def _numeric(rest: list[int], m: int, forced: NumaMask, base: list[int], reqs: list[int],
             cols: list[list[int]], top: Callable[[int, int, int], int],
             pred: Callable[[NumaMask], bool], tick: Callable[[], None],
             keep: Callable[[NumaMask], bool]) -> NumaMask | None:
    def rec(chosen: NumaMask, sums: list[int], need: int, hi: int) -> NumaMask | None:
        tick()
        if need == 0:
            return chosen if pred(chosen) else None
        for t in range(need - 1, hi):
            new = [s + col[t] for s, col in zip(sums, cols, strict=True)]
            if any(new[j] + top(j, need - 1, t) < reqs[j] for j in range(len(reqs))):
                continue
            nxt = chosen | 1 << rest[t]
            if not keep(nxt):
                continue
            got = rec(nxt, new, need - 1, t)
            if got is not None:
                return got
        return None

    if any(base[j] + top(j, m, len(rest)) < reqs[j] for j in range(len(reqs))):
        return None
    return rec(forced, base, m, len(rest))


def _closest(rest: list[int], m: int, forced: NumaMask, forced_ids: list[int],
             base: list[int], reqs: list[int], cols: list[list[int]],
             top: Callable[[int, int, int], int], pred: Callable[[NumaMask], bool],
             tick: Callable[[], None], d: Mapping[int, Mapping[int, int]],
             keep: Callable[[NumaMask], bool],
             best: list[tuple[int, NumaMask]]) -> NumaMask | None:
    """Branch and bound on the distance sum. Nodes are decided from the highest id down,
    leaving a node out before taking it, so complete masks are met in increasing value:
    a later mask with the same distance sum loses, and bounds prune on >=."""
    n = len(rest)
    order = sorted(range(n), key=lambda i: -rest[i])  # positions in rest, highest id first
    start_sum = sum(d[a][b] for a in forced_ids for b in forced_ids)

    def rec(i: int, chosen: list[int], mask: NumaMask, dsum: int, sums: list[int]) -> None:
        tick()
        need = m - (len(chosen) - len(forced_ids))
        if need == 0:
            key = (dsum, mask)
            if (not best or key < best[0]) and pred(mask):
                best[:] = [key]
            return
        if n - i < need:
            return
        if any(sums[j] + top(j, need, n) < reqs[j] for j in range(len(reqs))):
            return
        if best:
            # each node still to take costs at least its self distance, twice its distances
            # to the nodes taken, and (need - 1) times its nearest other candidate
            left = [rest[p] for p in order[i:]]
            gains = sorted(
                d[c][c] + 2 * sum(d[a][c] for a in chosen)
                + (need - 1) * min((d[c][b] + d[b][c] for b in left if b != c), default=0) // 2
                for c in left)
            if dsum + sum(gains[:need]) >= best[0][0]:
                return
        p = order[i]
        c = rest[p]
        rec(i + 1, chosen, mask, dsum, sums)
        if keep(mask | 1 << c):
            add = d[c][c] + 2 * sum(d[a][c] for a in chosen)
            rec(i + 1, [*chosen, c], mask | 1 << c, dsum + add,
                [s + col[p] for s, col in zip(sums, cols, strict=True)])

    rec(0, list(forced_ids), forced, start_sum, base)
    return best[0][1] if best else None


