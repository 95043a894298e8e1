"""GPU requests resolved against one machine, and the candidate device sets of each.

For one request a bottom-up pass over the resource's group tree gives, at every node, the
least fragmentation cost of taking ``j`` eligible devices from that subtree (a min-plus
merge of the children's tables, plus the node's own weight when it is whole). Every node
that can hold the request (and satisfies ``sameGroup`` and ``withResource``) is an anchor;
its table entry plus the cost of its whole ancestors is the cost of the best set inside
it. The best set per anchor is a candidate (:meth:`Problem.candidates`).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass

from ..errors import TopologyError
from ..hints import NumaMask, mask_ids
from ..machine import Machine
from .groups import ANY_LEVEL, GroupTree, build_tree, group_of
from .requests import GpuRequest, resolve_requests
from .scorers import Scorer

# Free devices: None (all free), resource -> free ids (resources not listed are all free),
# or a flat collection of ids (matched in every resource).
FreeDevices = Mapping[str, Collection[str]] | Collection[str] | None

_INF = 1 << 62
_AVOID = 1 << 40


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
class Candidate:
    """A device set for one request, with its scorer costs in the state it was made for."""

    tight: int
    frag: int
    bits: int  # GPUs (leaf bitmask in the request's tree)
    extra: int  # withResource devices (leaf bitmask in their tree)


@dataclass(frozen=True)
class _Costs:
    """A tree's node masks and the scorer's costs per node (weights of inner nodes)."""

    masks: list[int]
    weights: list[int]
    anchors: list[int]

    @classmethod
    def of(cls, tree: GroupTree, scorer: Scorer) -> _Costs:
        return cls([n.mask for n in tree.nodes],
                   [scorer.group_weight(tree, n) if n.children else 0 for n in tree.nodes],
                   [scorer.anchor_cost(tree, n) for n in tree.nodes])

    def touched(self, free_before: int, used: int) -> int:
        """:func:`~.scorers.touched_cost` with these weights."""
        return sum(w for m, w in zip(self.masks, self.weights, strict=True)
                   if w and used & m and free_before & m == m)


def _dp(tree: GroupTree, costs: _Costs, eligible: int, free: int, k: int, avoid: int = 0
        ) -> tuple[list[list[int]], list[list[tuple[int, list[int]]]]]:
    """Per node: least cost of taking j <= k eligible devices below it, and the splits.

    A device in ``avoid`` costs ``_AVOID`` more than any fragmentation (used to leave
    devices to later requests that need them)."""
    n = len(tree.nodes)
    tabs: list[list[int]] = [[0]] * n
    steps: list[list[tuple[int, list[int]]]] = [[] for _ in range(n)]
    masks = costs.masks
    for node in reversed(tree.nodes):
        m = masks[node.index]
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
            w = costs.weights[node.index]
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


def _best_in(tree: GroupTree, costs: _Costs, eligible: int, free: int, k: int,
             avoid: int = 0) -> tuple[int, int] | None:
    """Least-fragmentation choice of k devices among ``eligible`` anywhere in the tree."""
    tabs, steps = _dp(tree, costs, eligible, free, k, avoid)
    if len(tabs[0]) <= k:
        return None
    bits = _take(tree, steps, 0, k)
    return costs.touched(free, bits), bits


class Problem:
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
        # Per pool: the withResource devices of its group (0 without withResource).
        self.nic_masks = [[self.trees[wr.resource].group_mask(wr.level, gid)
                           if wr is not None and wr.level is not None and gid is not None
                           else 0 for gid, _bits in pools]
                          for r, pools in zip(self.requests, self.pools, strict=True)
                          for wr in (r.with_resource,)]
        self.pooled = [sum(bits for _gid, bits in pools) for pools in self.pools]
        # One device, nothing attached: every eligible pooled device is a candidate.
        self.singles = [r.count == 1 and r.with_resource is None for r in self.requests]
        self.resources = sorted({res for r in self.requests for res in (
            r.resource or "", *((r.with_resource.resource,) if r.with_resource else ()))})
        self.costs = {res: _Costs.of(self.trees[res], scorer) for res in self.resources}
        self._best: dict[tuple[str, int, int, int, int], tuple[int, int] | None] = {}
        # Requests with the same candidates in every state are one class (the search
        # places the requests of a class as interchangeable): per search kind (find_any
        # or not), since a single device's scored candidates only see the union of the
        # pools of each withResource group.
        self.classes: dict[bool, list[int]] = {True: [], False: []}
        ids: dict[Hashable, int] = {}
        for i, r in enumerate(self.requests):
            wr = r.with_resource
            base = (r.resource, r.count, self.mem[i],
                    None if wr is None else (wr.resource, wr.count))
            quick = (*base, None if wr is None else wr.level, tuple(self.pools[i]))
            self.classes[True].append(ids.setdefault(quick, i))
            merged: dict[int, int] = {}
            for (_gid, bits), nmask in zip(self.pools[i], self.nic_masks[i], strict=True):
                merged[nmask] = merged.get(nmask, 0) | bits
            scored = (*base, tuple(sorted(merged.items())) if r.count == 1 else quick)
            self.classes[False].append(ids.setdefault(scored, i))
        # The least fragmentation any placement can add (0 unless weights are negative).
        self.frag_floor = sum(min(0, w) for c in self.costs.values() for w in c.weights)

    def res(self, i: int) -> str:
        res = self.requests[i].resource
        assert res is not None
        return res

    def eligible(self, i: int, state: Mapping[str, int], numa: NumaMask | None) -> int:
        tree = self.trees[self.res(i)]
        return state[tree.resource] & self.mem[i] & tree.within_numa(numa)

    def candidates(self, i: int, state: Mapping[str, int], numa: NumaMask | None,
                   before: Mapping[str, int], avoid: Mapping[str, int] | None = None,
                   quick: bool = False) -> list[Candidate]:
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
        # Fragmentation is counted against the state before the whole allocation: a group
        # touched by an earlier request of this allocation costs nothing again.
        whole = before[tree.resource] & free
        wr = r.with_resource
        nic_tree = self.trees[wr.resource] if wr is not None else None
        out: dict[tuple[int, int], Candidate] = {}
        gav = avoid.get(tree.resource, 0) & eligible if avoid else 0
        nav = avoid.get(nic_tree.resource, 0) if avoid and nic_tree is not None else 0
        passes = (0, 1) if gav or nav else (0,)
        if quick:
            for (_gid, pool), nmask in zip(self.pools[i], self.nic_masks[i], strict=True):
                el = eligible & pool
                if el.bit_count() < k:
                    continue
                extra = 0
                if wr is not None and nic_tree is not None:
                    nel = state[nic_tree.resource] & nic_tree.within_numa(numa) & nmask
                    if nel.bit_count() < wr.count:
                        continue
                    extra = _pick_low(nel, nav, wr.count)
                bits = _pick_low(el, gav, k)
                out.setdefault((bits, extra), Candidate(0, 0, bits, extra))
            return list(out.values())
        costs = self.costs[tree.resource]
        anc = [0] * len(tree.nodes)
        for node in tree.nodes[1:]:
            p = node.parent or 0
            pm = costs.masks[p]
            anc[node.index] = anc[p] + (costs.weights[p] if whole & pm == pm else 0)
        if k == 1 and wr is None:
            passes = (0,)
        for (_gid, pool), nmask in zip(self.pools[i], self.nic_masks[i], strict=True):
            el = eligible & pool
            if el.bit_count() < k:
                continue
            for pas in passes:
                extra = 0
                extra_cost = 0
                if wr is not None and nic_tree is not None:
                    nres = nic_tree.resource
                    nfree = state[nres]
                    nel = nfree & nic_tree.within_numa(numa) & nmask
                    got = self._best_in(nres, nel, before[nres] & nfree, wr.count,
                                        nav if pas else 0)
                    if got is None:
                        break
                    extra_cost, extra = got
                if k == 1:
                    # Every eligible device is its own anchor's best set, and costs what
                    # its whole ancestors weigh (what the tables below would find).
                    for li in mask_ids(el):
                        if (1 << li, extra) not in out:
                            leaf = tree.leaf_node[li]
                            out[(1 << li, extra)] = Candidate(costs.anchors[leaf],
                                                          anc[leaf] + extra_cost, 1 << li,
                                                          extra)
                    continue
                tabs, steps = _dp(tree, costs, el, whole, k, gav if pas else 0)
                for node in tree.nodes:
                    tab = tabs[node.index]
                    if len(tab) <= k:
                        continue
                    bits = _take(tree, steps, node.index, k)
                    if (bits, extra) in out:
                        continue
                    frag = (tab[k] + anc[node.index] if not (pas and gav)
                            else costs.touched(whole, bits))
                    tight = costs.anchors[tree.lca(bits).index]
                    out[(bits, extra)] = Candidate(tight, frag + extra_cost, bits, extra)
        return sorted(out.values(), key=lambda c: (c.tight, c.frag, mask_ids(c.bits)))

    def _best_in(self, res: str, eligible: int, free: int, k: int, avoid: int
                 ) -> tuple[int, int] | None:
        key = (res, eligible, free, k, avoid)
        if key not in self._best:
            self._best[key] = _best_in(self.trees[res], self.costs[res], eligible, free, k,
                                       avoid)
        return self._best[key]


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
