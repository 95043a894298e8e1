"""Hierarchical GPU group allocation and its NUMA hints: the public entry points.

Each request's candidates are the best device set per anchor group of its resource's
tree (:mod:`.candidates`); several requests are placed together by a branch and bound over
those candidates (:mod:`.search`); every complete allocation is scored with
:func:`~.scorers.score_allocation`'s order, which does not depend on the order the
requests were placed in.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ..errors import TopologyError
from ..hints import NumaMask, TopologyHint, mask_ids
from ..machine import Machine
from .candidates import FreeDevices as FreeDevices
from .candidates import Problem, free_bits
from .candidates import trees_of as trees_of
from .groups import ANY_LEVEL, GroupTree
from .requests import GpuRequest
from .scorers import Score, Scorer, get_scorer, score_allocation
from .search import SearchStats, joint_search

EXACT_HINT_NUMA = 8  # up to this many NUMA nodes, hints are checked for every mask
MAX_HINT_MASKS = 512  # mask combinations tried past EXACT_HINT_NUMA


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
# Public entry points


def allocate(machine: Machine, free: FreeDevices, requests: Sequence[GpuRequest],
             mask: NumaMask | None = None, scorer: str | Scorer = "pack",
             stats: SearchStats | None = None) -> GpuAllocation:
    """Place every request on free devices within ``mask`` (None: any NUMA node).

    Raises :class:`GpuAllocationError` when they cannot all be placed; nothing is
    half-allocated. ``stats`` adds up the searches' work.
    """
    prob = Problem(machine, requests, get_scorer(scorer))
    state = free_bits(prob.trees, free)
    found = joint_search(prob, state, mask, find_any=False, stats=stats)
    if found is None:
        # The scored search keeps a few candidates per anchor; the feasibility search
        # (what hints use) tries differently, so take its answer rather than fail.
        found = joint_search(prob, state, mask, find_any=True, stats=stats)
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


def _failure(prob: Problem, state: Mapping[str, int], mask: NumaMask | None
             ) -> GpuAllocationError:
    where = "" if mask is None else f" within NUMA nodes {mask_ids(mask)}"
    for i, r in enumerate(prob.requests):
        if not prob.candidates(i, state, mask, state):
            return GpuAllocationError(f"{r.name}", f"no set of {_describe(r)}{where}")
    names = ", ".join(r.name for r in prob.requests)
    return GpuAllocationError("", f"requests {names} fit one at a time but not together "
                              f"on the free devices{where}")


def hints(machine: Machine, free: FreeDevices, requests: Sequence[GpuRequest],
          stats: SearchStats | None = None) -> list[TopologyHint]:
    """NUMA hints of the requests, for the Topology Manager merge.

    Each hint's mask holds a feasible allocation of all requests on the free devices; a
    hint is preferred iff its width is the least width that could hold the requests on the
    whole machine with every device free. ``[]`` means "cannot satisfy"; when no device
    involved has a NUMA node the answer is one preferred hint with no mask.

    Up to 8 NUMA nodes every mask is checked, as the kubelet's device manager does; past
    that the masks are generated from the NUMA nodes of candidate device sets, and the
    whole machine's mask is included when it is feasible. ``stats`` adds up the searches'
    work.
    """
    prob = Problem(machine, requests, get_scorer("pack"))
    state = free_bits(prob.trees, free)
    full = {res: t.all_mask for res, t in prob.trees.items()}
    dev_numa = 0
    for res in prob.resources:
        dev_numa |= prob.trees[res].numa_of(prob.trees[res].all_mask)
    if dev_numa == 0:
        ok = joint_search(prob, state, None, find_any=True, stats=stats) is not None
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
                ok = joint_search(prob, st, m, find_any=True, stats=stats) is not None
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


def _generated_masks(prob: Problem, state: Mapping[str, int], ids: list[int]) -> list[int]:
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
