"""Exhaustive search for GPU allocation: every combination of devices for every request,
scored with the same order as the allocator. Small machines only (tests)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from numalign.topology.gpu import (
    ANY_LEVEL,
    GpuRequest,
    Scorer,
    get_scorer,
    resolve_requests,
    score_allocation,
    trees_of,
)
from numalign.topology.gpu.groups import group_of
from numalign.topology.hints import mask_ids
from numalign.topology.machine import Machine

Pick = tuple[int, int]  # (GPU leaf bits, withResource leaf bits)


def brute_force(machine: Machine, free: Mapping[str, int], requests: Sequence[GpuRequest],
                mask: int | None = None, scorer: str | Scorer = "pack", *,
                lowest: bool = False) -> tuple[tuple[int, int], list[Pick]] | None:
    """The best score over every feasible allocation (and one allocation reaching it).

    ``free``: resource -> leaf bitmask of free devices in ``trees_of(machine)``.
    ``lowest``: among allocations of the best score, the one with the lowest devices for
    the first request, then the second, ... (the allocator's documented tie-break).
    """
    sc = get_scorer(scorer)
    trees = trees_of(machine)
    reqs = resolve_requests(machine, list(requests))
    best: list[tuple[tuple[int, int], list[Pick]]] = []

    def allowed(res: str, i: int) -> bool:
        d = trees[res].devices[i]
        return mask is None or d.numa_node is None or bool(mask >> d.numa_node & 1)

    def rec(pos: int, state: dict[str, int], picks: list[Pick]) -> None:
        if pos == len(reqs):
            primary = [(r.resource or "", p[0]) for r, p in zip(reqs, picks, strict=True)]
            extra = [(r.with_resource.resource, p[1]) for r, p in zip(reqs, picks, strict=True)
                     if r.with_resource is not None]
            score = score_allocation(sc, trees, free, primary, extra)
            if not best or score < best[0][0] or (
                    lowest and score == best[0][0]
                    and [mask_ids(p[0]) for p in picks] < [mask_ids(p[0]) for p in best[0][1]]):
                best[:] = [(score, list(picks))]
            return
        r = reqs[pos]
        res = r.resource or ""
        tree = trees[res]
        cands = [i for i in range(len(tree.devices))
                 if state[res] >> i & 1 and allowed(res, i)
                 and (r.min_memory == 0 or (tree.devices[i].memory or 0) >= r.min_memory)]
        for combo in itertools.combinations(cands, r.count):
            devs = [tree.devices[i] for i in combo]
            if r.same_group != ANY_LEVEL:
                gids = {group_of(d, r.same_group) for d in devs}
                if len(gids) != 1 or None in gids:
                    continue
            bits = sum(1 << i for i in combo)
            nxt = dict(state)
            nxt[res] &= ~bits
            wr = r.with_resource
            if wr is None:
                rec(pos + 1, nxt, [*picks, (bits, 0)])
                continue
            assert wr.level is not None
            gids = {group_of(d, wr.level) for d in devs}
            if len(gids) != 1 or None in gids:
                continue
            gid = next(iter(gids))
            nt = trees[wr.resource]
            ncands = [i for i in range(len(nt.devices))
                      if nxt[wr.resource] >> i & 1 and allowed(wr.resource, i)
                      and group_of(nt.devices[i], wr.level) == gid]
            for ncombo in itertools.combinations(ncands, wr.count):
                nbits = sum(1 << i for i in ncombo)
                n2 = dict(nxt)
                n2[wr.resource] &= ~nbits
                rec(pos + 1, n2, [*picks, (bits, nbits)])

    rec(0, dict(free), [])
    return best[0] if best else None
