"""Hierarchical GPU group allocation and its NUMA hints.

For one request the allocator runs one bottom-up pass over the resource's group tree: at
every node a table of the least fragmentation cost of taking ``j`` eligible devices from
that subtree (a min-plus merge of the children's tables, plus the node's own weight when
it is whole). Every node that can hold the request (and satisfies ``sameGroup`` and
``withResource``) is an anchor; its table entry plus the cost of its whole ancestors is the
cost of the best set inside it. The best set per anchor is a candidate.

Several requests are placed together by a depth-first branch and bound over those
candidates (most constrained request first), pruned on the tightness bound; every
complete allocation is scored with :func:`~.scorers.score_allocation`'s order, which does
not depend on the order the requests were placed in.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import TopologyError
from ..hints import NumaMask, TopologyHint, mask_ids
from ..machine import Machine
from .groups import ANY_LEVEL, GroupTree, build_tree, group_of
from .requests import GpuRequest, resolve_requests
from .scorers import Score, Scorer, get_scorer, score_allocation, touched_cost

# Free devices: None (all free), resource -> free ids (resources not listed are all free),
# or a flat collection of ids (matched in every resource).
FreeDevices = Mapping[str, Collection[str]] | Collection[str] | None

SMALL_TREE = 64  # leaves in all trees involved up to which the search tries every candidate
WIDE_BREADTH = 3  # candidates tried per request on bigger machines
SEARCH_BUDGET = 20000  # complete allocations scored at most per search
EXACT_HINT_NUMA = 8  # up to this many NUMA nodes, hints are checked for every mask
MAX_HINT_MASKS = 512  # mask combinations tried past EXACT_HINT_NUMA

_INF = 1 << 62
_AVOID = 1 << 40


class GpuAllocationError(TopologyError):
    """The requests cannot be placed (on the free devices, within the NUMA mask)."""


@dataclass(frozen=True)
class GpuAllocation:
    """The devices of each request.

    ``gpus``: request name -> GPU device ids; ``attached``: request name -> its
    ``withResource`` device ids (only requests that have one); ``devices``: resource ->
    every device id allocated; ``numa_mask``: the NUMA nodes of those devices;
    ``score``: the scorer's (tightness, fragmentation), lower is better.
    """

    gpus: dict[str, list[str]]
    attached: dict[str, list[str]] = field(default_factory=dict)
    devices: dict[str, list[str]] = field(default_factory=dict)
    numa_mask: NumaMask = 0
    score: Score = (0, 0)

    def to_json(self) -> dict[str, object]:
        return {"gpus": self.gpus, "attached": self.attached, "devices": self.devices,
                "numaNodes": mask_ids(self.numa_mask)}


# ---------------------------------------------------------------------------------------
# Trees per machine (cached: machines are immutable)

_TREE_CACHE: dict[int, tuple[Machine, dict[str, GroupTree]]] = {}


def trees_of(machine: Machine) -> dict[str, GroupTree]:
    """The group tree of every device resource of ``machine`` (cached)."""
    hit = _TREE_CACHE.get(id(machine))
    if hit is not None and hit[0] is machine:
        return hit[1]
    trees = {res: build_tree(machine, res) for res in machine.device_resources}
    if len(_TREE_CACHE) > 64:
        _TREE_CACHE.clear()
    _TREE_CACHE[id(machine)] = (machine, trees)
    return trees


def free_bits(trees: Mapping[str, GroupTree], free: FreeDevices) -> dict[str, int]:
    out: dict[str, int] = {}
    for res, tree in trees.items():
        if free is None:
            out[res] = tree.all_mask
        elif isinstance(free, Mapping):
            ids = free.get(res)
            out[res] = tree.all_mask if ids is None else tree.bits_of(list(ids))
        else:
            out[res] = tree.bits_of(list(free))
    return out


# ---------------------------------------------------------------------------------------
# One request


@dataclass(frozen=True)
class _Cand:
    tight: int
    frag: int
    bits: int  # GPUs (leaf bitmask in the request's tree)
    extra: int  # withResource devices (leaf bitmask in their tree)


def _dp(tree: GroupTree, scorer: Scorer, eligible: int, free: int, k: int, avoid: int = 0
        ) -> tuple[list[list[int]], list[list[tuple[int, list[int]]]]]:
    """Per node: least cost of taking j <= k eligible devices below it, and the splits.

    A device in ``avoid`` costs ``_AVOID`` more than any fragmentation (used to leave
    devices to later requests that need them)."""
    n = len(tree.nodes)
    tabs: list[list[int]] = [[0]] * n
    steps: list[list[tuple[int, list[int]]]] = [[] for _ in range(n)]
    for node in reversed(tree.nodes):
        m = node.mask
        if not eligible & m:
            continue
        if not node.children:
            tabs[node.index] = [0, _AVOID if avoid >> node.lo & 1 else 0]
            continue
        acc = [0]
        my_steps = steps[node.index]
        for c in node.children:
            ct = tabs[c]
            if len(ct) == 1:
                continue
            size = min(len(acc) + len(ct) - 1, k + 1)
            new = [_INF] * size
            arg = [0] * size
            for a in range(len(acc) - 1, -1, -1):
                va = acc[a]
                for b in range(min(len(ct), size - a)):
                    v = va + ct[b]
                    if v < new[a + b]:
                        new[a + b] = v
                        arg[a + b] = b
            acc = new
            my_steps.append((c, arg))
        if free & m == m:
            w = scorer.group_weight(tree, node)
            acc = [acc[0], *(x + w for x in acc[1:])]
        tabs[node.index] = acc
    return tabs, steps


def _take(tree: GroupTree, steps: list[list[tuple[int, list[int]]]], node_i: int, k: int
          ) -> int:
    if k == 0:
        return 0
    node = tree.nodes[node_i]
    if not node.children:
        return 1 << node.lo
    bits = 0
    j = k
    for c, arg in reversed(steps[node_i]):
        b = arg[j]
        bits |= _take(tree, steps, c, b)
        j -= b
    return bits


def _best_in(tree: GroupTree, scorer: Scorer, eligible: int, free: int, k: int,
             avoid: int = 0) -> tuple[int, int] | None:
    """Least-fragmentation choice of k devices among ``eligible`` anywhere in the tree."""
    tabs, steps = _dp(tree, scorer, eligible, free, k, avoid)
    if len(tabs[0]) <= k:
        return None
    bits = _take(tree, steps, 0, k)
    return touched_cost(scorer, tree, free, bits), bits


class _Problem:
    """Requests resolved against one machine, with per-request static masks."""

    def __init__(self, machine: Machine, requests: Sequence[GpuRequest], scorer: Scorer):
        self.machine = machine
        self.trees = trees_of(machine)
        self.requests = resolve_requests(machine, list(requests))
        self.scorer = scorer
        self.mem: list[int] = []
        for r in self.requests:
            assert r.resource is not None
            if r.resource not in self.trees:
                raise TopologyError(f"{r.name}.resource", f"no {r.resource} device on "
                                    f"machine {machine.name}")
            wr = r.with_resource
            if wr is not None and wr.resource not in self.trees:
                raise TopologyError(f"{r.name}.withResource.resource",
                                    f"no {wr.resource} device on machine {machine.name}")
            self.mem.append(self.trees[r.resource].memory_mask(r.min_memory))
        # Per request: the pools of devices that may be taken together (one group of the
        # sameGroup level and one of the withResource level), with the withResource group.
        self.pools: list[list[tuple[str | None, int]]] = []
        for r in self.requests:
            tree = self.trees[r.resource or ""]
            wr = r.with_resource
            keyed: dict[tuple[str, str], int] = {}
            for li, d in enumerate(tree.devices):
                g1 = "" if r.same_group == ANY_LEVEL else group_of(d, r.same_group)
                g2 = "" if wr is None or wr.level is None else group_of(d, wr.level)
                if g1 is None or g2 is None:
                    continue
                keyed[(g1, g2)] = keyed.get((g1, g2), 0) | 1 << li
            self.pools.append([(g2 if wr is not None else None, bits)
                               for (_g1, g2), bits in keyed.items()])
        self.resources = sorted({res for r in self.requests for res in (
            r.resource or "", *((r.with_resource.resource,) if r.with_resource else ()))})

    def res(self, i: int) -> str:
        res = self.requests[i].resource
        assert res is not None
        return res

    def eligible(self, i: int, state: Mapping[str, int], numa: NumaMask | None) -> int:
        tree = self.trees[self.res(i)]
        return state[tree.resource] & self.mem[i] & tree.within_numa(numa)

    def candidates(self, i: int, state: Mapping[str, int], numa: NumaMask | None,
                   before: Mapping[str, int], avoid: Mapping[str, int] | None = None,
                   quick: bool = False) -> list[_Cand]:
        """The best set per anchor for request ``i`` in ``state``, best first.

        With ``avoid`` (resource -> devices later requests could use), each anchor also
        offers its best set that takes as few of those as possible. ``quick`` (feasibility
        only): one unscored set per pool, the lowest devices, avoiding ``avoid``."""
        r = self.requests[i]
        tree = self.trees[self.res(i)]
        free = state[tree.resource]
        eligible = self.eligible(i, state, numa)
        k = r.count
        if eligible.bit_count() < k:
            return []
        sc = self.scorer
        # Fragmentation is counted against the state before the whole allocation: a group
        # touched by an earlier request of this allocation costs nothing again.
        whole = before[tree.resource] & free
        wr = r.with_resource
        nic_tree = self.trees[wr.resource] if wr is not None else None
        out: dict[tuple[int, int], _Cand] = {}
        gav = avoid.get(tree.resource, 0) & eligible if avoid else 0
        nav = avoid.get(nic_tree.resource, 0) if avoid and nic_tree is not None else 0
        passes = (0, 1) if gav or nav else (0,)
        anc = [0] * len(tree.nodes)
        for node in tree.nodes[1:]:
            p = tree.nodes[node.parent or 0]
            pm = p.mask
            anc[node.index] = anc[p.index] + (sc.group_weight(tree, p) if whole & pm == pm
                                              else 0)
        if quick:
            for nic_gid, pool in self.pools[i]:
                el = eligible & pool
                if el.bit_count() < k:
                    continue
                extra = 0
                if wr is not None and nic_tree is not None:
                    assert wr.level is not None and nic_gid is not None
                    nel = (state[nic_tree.resource] & nic_tree.within_numa(numa)
                           & nic_tree.group_mask(wr.level, nic_gid))
                    if nel.bit_count() < wr.count:
                        continue
                    extra = _pick_low(nel, nav, wr.count)
                bits = _pick_low(el, gav, k)
                out.setdefault((bits, extra), _Cand(0, 0, bits, extra))
            return list(out.values())
        for nic_gid, pool in self.pools[i]:
            el = eligible & pool
            if el.bit_count() < k:
                continue
            for pas in passes:
                extra = 0
                extra_cost = 0
                if wr is not None and nic_tree is not None:
                    assert wr.level is not None and nic_gid is not None
                    nres = nic_tree.resource
                    nfree = state[nres]
                    nel = (nfree & nic_tree.within_numa(numa)
                           & nic_tree.group_mask(wr.level, nic_gid))
                    got = _best_in(nic_tree, sc, nel, before[nres] & nfree, wr.count,
                                   nav if pas else 0)
                    if got is None:
                        break
                    extra_cost, extra = got
                tabs, steps = _dp(tree, sc, el, whole, k, gav if pas else 0)
                for node in tree.nodes:
                    tab = tabs[node.index]
                    if len(tab) <= k:
                        continue
                    bits = _take(tree, steps, node.index, k)
                    if (bits, extra) in out:
                        continue
                    frag = (tab[k] + anc[node.index] if not (pas and gav)
                            else touched_cost(sc, tree, whole, bits))
                    tight = sc.anchor_cost(tree, tree.lca(bits))
                    out[(bits, extra)] = _Cand(tight, frag + extra_cost, bits, extra)
        return sorted(out.values(), key=lambda c: (c.tight, c.frag, mask_ids(c.bits)))

    def search(self, state: Mapping[str, int], numa: NumaMask | None, find_any: bool
               ) -> tuple[Score, list[_Cand]] | None:
        """The best (or, with ``find_any``, the first) joint allocation, or None."""
        n = len(self.requests)
        first = [self.candidates(i, state, numa, state, quick=find_any) for i in range(n)]
        if any(not c for c in first):
            return None
        if n == 1:
            c = first[0][0]
            return (c.tight, c.frag), [c]
        elig = [self.eligible(i, state, numa) for i in range(n)]
        slack = [elig[i].bit_count() - self.requests[i].count for i in range(n)]
        base = sorted(range(n), key=lambda i: (slack[i], -self.requests[i].count, i))
        orders = [base]
        if n <= 4:
            orders += [list(o) for o in itertools.permutations(base) if list(o) != base]
        min_tight = [first[i][0].tight for i in range(n)]
        leaves = sum(len(self.trees[r].devices) for r in self.resources)
        small = leaves <= SMALL_TREE
        breadth = _INF if small else WIDE_BREADTH
        best: list[tuple[Score, list[_Cand]]] = []
        budget = [SEARCH_BUDGET]
        picks: list[_Cand | None] = [None] * n

        def run(order: list[int]) -> None:
            rest_lb = [0] * (n + 1)
            later: list[dict[str, int]] = [{} for _ in range(n + 1)]
            for pos in range(n - 1, -1, -1):
                i = order[pos]
                rest_lb[pos] = rest_lb[pos + 1] + min_tight[i]
                later[pos] = dict(later[pos + 1])
                res = self.res(i)
                later[pos][res] = later[pos].get(res, 0) | elig[i]
                wr = self.requests[i].with_resource
                if wr is not None:
                    nt = self.trees[wr.resource]
                    later[pos][wr.resource] = (later[pos].get(wr.resource, 0)
                                               | state[wr.resource] & nt.within_numa(numa))

            def dfs(pos: int, cur: dict[str, int], tight: int, frag: int) -> bool:
                if pos == n:
                    budget[0] -= 1
                    score = (tight, frag)
                    done = [p for p in picks if p is not None]
                    if not best or score < best[0][0] or (score == best[0][0] and _lower(
                            done, best[0][1])):
                        best[:] = [(score, done)]
                    return find_any or budget[0] <= 0
                i = order[pos]
                cands = self.candidates(i, cur, numa, state, later[pos + 1], find_any)
                wr = self.requests[i].with_resource
                for tried, c in enumerate(cands):
                    if best and tight + c.tight + rest_lb[pos + 1] > best[0][0][0]:
                        break
                    if tried >= breadth:
                        break
                    nxt = dict(cur)
                    nxt[self.res(i)] &= ~c.bits
                    if wr is not None:
                        nxt[wr.resource] &= ~c.extra
                    picks[i] = c
                    if dfs(pos + 1, nxt, tight + c.tight, frag + c.frag):
                        return True
                picks[i] = None
                return False

            dfs(0, dict(state), 0, 0)

        for order in orders:
            run(order)
            if (best and (find_any or not small)) or budget[0] <= 0:
                break
        return best[0] if best else None


def _lower(a: list[_Cand], b: list[_Cand]) -> bool:
    """Tie-break between equal scores: the lowest devices for the first request, ..."""
    return [mask_ids(c.bits) for c in a] < [mask_ids(c.bits) for c in b]


def _pick_low(bits: int, avoid: int, k: int) -> int:
    """The k lowest bits of ``bits``, those outside ``avoid`` first."""
    out = 0
    for pool in (bits & ~avoid, bits & avoid):
        while pool and k:
            low = pool & -pool
            out |= low
            pool ^= low
            k -= 1
    return out


# ---------------------------------------------------------------------------------------
# Public entry points


def allocate(machine: Machine, free: FreeDevices, requests: Sequence[GpuRequest],
             mask: NumaMask | None = None, scorer: str | Scorer = "pack") -> GpuAllocation:
    """Place every request on free devices within ``mask`` (None: any NUMA node).

    Raises :class:`GpuAllocationError` when they cannot all be placed; nothing is
    half-allocated.
    """
    prob = _Problem(machine, requests, get_scorer(scorer))
    state = free_bits(prob.trees, free)
    found = prob.search(state, mask, find_any=False)
    if found is None:
        # The scored search keeps a few candidates per anchor; the feasibility search
        # (what hints use) tries differently, so take its answer rather than fail.
        found = prob.search(state, mask, find_any=True)
        if found is None:
            raise _failure(prob, state, mask)
        picks = found[1]
        score = score_allocation(prob.scorer, prob.trees, state,
                                 [(prob.res(i), c.bits) for i, c in enumerate(picks)],
                                 [(r.with_resource.resource, c.extra)
                                  for r, c in zip(prob.requests, picks, strict=True)
                                  if r.with_resource is not None])
    else:
        score, picks = found
    gpus: dict[str, list[str]] = {}
    attached: dict[str, list[str]] = {}
    devices: dict[str, list[str]] = {}
    numa = 0
    for r, c in zip(prob.requests, picks, strict=True):
        tree = prob.trees[r.resource or ""]
        gpus[r.name] = tree.ids(c.bits)
        devices.setdefault(tree.resource, []).extend(gpus[r.name])
        numa |= tree.numa_of(c.bits)
        if r.with_resource is not None:
            nt = prob.trees[r.with_resource.resource]
            attached[r.name] = nt.ids(c.extra)
            devices.setdefault(nt.resource, []).extend(attached[r.name])
            numa |= nt.numa_of(c.extra)
    return GpuAllocation(gpus=gpus, attached=attached, devices=devices, numa_mask=numa,
                         score=score)


def _describe(r: GpuRequest) -> str:
    s = f"{r.count} free {r.resource} device{'s' if r.count > 1 else ''}"
    if r.min_memory:
        s += f" with minMemory {r.min_memory_text}"
    if r.same_group != ANY_LEVEL:
        s += f" in one {r.same_group} group"
    wr = r.with_resource
    if wr is not None:
        s += f" with {wr.count} free {wr.resource} in the same {wr.level} group"
    return s


def _failure(prob: _Problem, state: Mapping[str, int], mask: NumaMask | None
             ) -> GpuAllocationError:
    where = "" if mask is None else f" within NUMA nodes {mask_ids(mask)}"
    for i, r in enumerate(prob.requests):
        if not prob.candidates(i, state, mask, state):
            return GpuAllocationError(f"{r.name}", f"no set of {_describe(r)}{where}")
    names = ", ".join(r.name for r in prob.requests)
    return GpuAllocationError("", f"requests {names} fit one at a time but not together "
                              f"on the free devices{where}")


def hints(machine: Machine, free: FreeDevices, requests: Sequence[GpuRequest]
          ) -> list[TopologyHint]:
    """NUMA hints of the requests, for the Topology Manager merge.

    Each hint's mask holds a feasible allocation of all requests on the free devices; a
    hint is preferred iff its width is the least width that could hold the requests on the
    whole machine with every device free. ``[]`` means "cannot satisfy"; when no device
    involved has a NUMA node the answer is one preferred hint with no mask.

    Up to 8 NUMA nodes every mask is checked, as the kubelet's device manager does; past
    that the masks are generated from the NUMA nodes of candidate device sets, and the
    whole machine's mask is included when it is feasible.
    """
    prob = _Problem(machine, requests, get_scorer("pack"))
    state = free_bits(prob.trees, free)
    full = {res: t.all_mask for res, t in prob.trees.items()}
    dev_numa = 0
    for res in prob.resources:
        dev_numa |= prob.trees[res].numa_of(prob.trees[res].all_mask)
    if dev_numa == 0:
        ok = prob.search(state, None, find_any=True) is not None
        return [TopologyHint(None, True)] if ok else []
    ids = machine.numa_ids
    memo: dict[tuple[int, bool], bool] = {}
    yes: dict[bool, list[int]] = {True: [], False: []}  # feasible projections
    no: dict[bool, list[int]] = {True: [], False: []}  # infeasible projections

    def feasible(m: NumaMask, capacity: bool) -> bool:
        """Feasibility is monotone in the mask: a superset of a feasible mask is
        feasible, a subset of an infeasible one is not; search only the frontier."""
        p = m & dev_numa
        key = (p, capacity)
        if key not in memo:
            if any(q & ~p == 0 for q in yes[capacity]):
                ok = True
            elif any(p & ~q == 0 for q in no[capacity]):
                ok = False
            else:
                st = full if capacity else state
                ok = prob.search(st, m, find_any=True) is not None
                (yes if ok else no)[capacity].append(p)
            memo[key] = ok
        return memo[key]

    if len(ids) <= EXACT_HINT_NUMA:
        masks = sorted((sum(1 << ids[j] for j in range(len(ids)) if sel >> j & 1)
                        for sel in range(1, 1 << len(ids))), key=lambda m: (m.bit_count(), m))
        cap_masks = masks
    else:
        masks = _generated_masks(prob, state, ids)
        cap_masks = _generated_masks(prob, full, ids)
    least = next((m.bit_count() for m in cap_masks if feasible(m, True)), 0)
    if not least:
        return []
    out = [TopologyHint(m, m.bit_count() == least) for m in masks if feasible(m, False)]
    out.sort(key=lambda h: ((h.mask or 0).bit_count(), mask_ids(h.mask or 0)))
    return out


def _generated_masks(prob: _Problem, state: Mapping[str, int], ids: list[int]) -> list[int]:
    """Candidate NUMA masks: the NUMA nodes of compact device sets of each anchor, their
    unions across requests, and the whole machine."""
    per_req: list[list[int]] = []
    for i, r in enumerate(prob.requests):
        tree = prob.trees[prob.res(i)]
        eligible = state[tree.resource] & prob.mem[i]
        wr = r.with_resource
        nic_tree = prob.trees[wr.resource] if wr is not None else None
        found: set[int] = set()
        for nic_gid, pool in prob.pools[i]:
            for node in tree.nodes:
                el = eligible & pool & node.mask
                if el.bit_count() < r.count:
                    continue
                nic_numa: list[int] = [0]
                if wr is not None and nic_tree is not None:
                    assert wr.level is not None and nic_gid is not None
                    nel = state[nic_tree.resource] & nic_tree.group_mask(wr.level, nic_gid)
                    if nel.bit_count() < wr.count:
                        continue
                    nic_numa = _compact(nic_tree, nel, wr.count)
                base = (el & tree.no_numa).bit_count()
                for gm in _compact(tree, el, r.count, base):
                    for nm in nic_numa:
                        found.add(gm | nm)
        per_req.append(sorted(found, key=lambda m: (m.bit_count(), m))[:64])
    out: set[int] = set()
    for combo in itertools.islice(itertools.product(*per_req), MAX_HINT_MASKS):
        u = 0
        for m in combo:
            u |= m
        if u:
            out.add(u)
    out.add(sum(1 << i for i in ids))
    return sorted(out, key=lambda m: (m.bit_count(), m))


def _compact(tree: GroupTree, el: int, k: int, base: int | None = None) -> list[int]:
    """Narrow NUMA masks holding k devices of ``el``: each node that holds them alone and
    the greedy cover by the fullest nodes (devices without NUMA node count everywhere)."""
    if base is None:
        base = (el & tree.no_numa).bit_count()
    if base >= k:
        return [0]
    counts = sorted(((-(el & m).bit_count(), n) for n, m in tree.numa_masks.items()
                     if el & m), key=lambda t: t)
    out = [1 << n for c, n in counts if base - c >= k]
    got = base
    cover = 0
    for c, n in counts:
        if got >= k:
            break
        got -= c
        cover |= 1 << n
    if got >= k:
        out.append(cover)
    return out
