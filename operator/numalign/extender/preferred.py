"""What the Topology Manager's merge gives a simple pod on a node (:mod:`.feasible`), read
from the node's free amounts per NUMA node, without hint lists or a merge.

The kubelet's merged hint is preferred only when the hint each resource gives in the
combination is preferred and all their masks are equal (a resource without preference,
a nil hint, goes with any mask). A manager's hint is preferred when it is as wide as
the manager's minAffinitySize: the narrowest width whose *capacity* holds the request,
a property of the machine. So a preferred merged hint is a mask ``M`` as wide as every
constraining manager's minAffinitySize (one width ``w`` for all of them, else there is
none; under single-numa-node ``w`` must be 1, its only hints kept), inside each one's
NUMA nodes (the CPU manager's: those with CPUs; the device manager's: those with
devices of the resource), where each has enough free (CPUs, bytes of each memory kind,
devices on ``M``'s NUMA nodes) and the memory manager's grouping rule lets ``M`` hold
memory. Where one exists (:data:`ADMITS`), the merge's hint is preferred, every policy
admits it, and each manager allocates inside it (devices without a NUMA node anywhere:
they must be free enough). Where none exists (:data:`REFUSES`), restricted and
single-numa-node refuse with the kubelet's fixed message.

Two exceptions keep the full decision: the memory manager gives *no* hint when no mask
can hold the memory (it then goes with any mask and its allocation fails), and memory
over-committed on a NUMA node (the manager's sums differ). Where the CPU manager or
a device resource has too few free for any hint, restricted and single-numa-node refuse
at once. Under best-effort, which admits any merged hint, the managers' allocation
decides (read here for a pod of one container on a machine within the full hint walk):
the CPU manager fails when fewer CPUs are free than asked (:data:`SHORT`: its message
counts the CPUs free and those inside the merged hint, which is then the memory
manager's narrowest hint, the lowest NUMA node alone holding the memory); it succeeds
inside or outside the hint otherwise, as the device manager does, and the memory
manager finds room where no NUMA node holds memory assignments and the machine's free
memory holds the pod's, or where its hints are all one NUMA node wide and the merge's
hint lies inside one of them (:func:`_joins`). On a machine past the full hint walk
only hints one NUMA node wide are read (:attr:`Rules.blind` otherwise).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import partial
from itertools import combinations

from numalign.topology.demands import Demand
from numalign.topology.hintgen import FULL_LIMIT
from numalign.topology.ledger import MEMORY
from numalign.topology.machine import Machine
from numalign.topology.pod import HUGEPAGES_PREFIX
from numalign.topology.policyconfig import (
    POLICY_BEST_EFFORT,
    POLICY_RESTRICTED,
    POLICY_SINGLE_NUMA_NODE,
    PolicyOptions,
)

from .nodefree import NodeFree, PodAsk

__all__ = ["ADMITS", "ANYWHERE", "REFUSES", "SHORT", "Rules", "classifier", "outcome", "rules_for"]

ADMITS = "admits"  # a preferred merged hint, every manager allocates
REFUSES = "refuses"  # no preferred merged hint (restricted, single-numa-node)
SHORT = "cpus-short"  # best-effort: the CPU manager's allocation fails
# (ANYWHERE, answer): a refusal that is the same on every machine (:attr:`Rules.anywhere`)
ANYWHERE = "anywhere"


@dataclass(frozen=True)
class Rules:
    """What :func:`outcome` reads of a machine for one pod and policy, made once: the
    candidate preferred masks (mask, positions in ``machine.numa_ids``), the request per
    manager, the memory capacity per kind and NUMA node."""

    policy: str
    # no policy options given (they choose between merged hints, or refuse the machine)
    # and no more NUMA nodes than the default limit: a refusal names nothing of the
    # machine (:data:`ANYWHERE`)
    anywhere: bool
    single: bool  # one container: the managers allocate the decision's request at once
    ids: tuple[int, ...]
    anything: bool  # no manager constrains the hint: every NUMA node, preferred
    cands: tuple[tuple[int, tuple[int, ...]], ...]
    cpus: int
    kinds: tuple[str, ...]
    need: tuple[int, ...]  # bytes per kind
    caps: tuple[tuple[int, ...], ...]  # per kind, per NUMA node
    bound: tuple[tuple[str, int], ...]  # device resources with NUMA nodes: (resource, asked)
    loose: tuple[tuple[str, int], ...]  # device resources with none: no preference
    all_nodes: int  # the machine's NUMA nodes (mask)
    # the same as bits by position in ``ids`` (:class:`NodeFree`'s):
    singles: int | None  # the candidates, where they are one NUMA node wide
    cpu_span: int  # the CPU manager's NUMA nodes
    bound_spans: tuple[int, ...]  # the device manager's, per resource of ``bound``
    cap_alone: int  # NUMA nodes whose allocatable memory holds the pod's
    every: int
    # :func:`outcome` reads ``free`` by its masks (no sums over masks, but where no NUMA
    # node alone holds the memory)
    cheap: bool
    wide: bool  # more NUMA nodes than the kubelet's full hint walk (:data:`FULL_LIMIT`)
    # a machine past the kubelet's full hint walk (:data:`FULL_LIMIT` NUMA nodes) whose
    # managers' preferred hints are not all one NUMA node wide: no candidates read
    blind: bool


def _capacity(machine: Machine, kind: str) -> tuple[int, ...]:
    size = kind.removeprefix(HUGEPAGES_PREFIX)
    return tuple(n.memory if kind == MEMORY else n.hugepages.get(size, 0)
                 for n in machine.numa_nodes)


def rules_for(machine: Machine, ask: PodAsk, policy: str, plain: bool) -> Rules | None:
    """The rules of ``machine`` for ``ask`` under ``policy``; None where they do not
    apply (another policy, a memory kind the machine lacks, a machine wider than the
    kubelet's full hint walk)."""
    if policy not in (POLICY_RESTRICTED, POLICY_BEST_EFFORT, POLICY_SINGLE_NUMA_NODE):
        return None
    ids = tuple(machine.numa_ids)
    if [n.id for n in machine.numa_nodes] != list(ids) or list(ids) != sorted(ids):
        return None
    have = {MEMORY, *(HUGEPAGES_PREFIX + s for s in machine.hugepage_sizes)}
    if any(k not in have for k, q in ask.memory if q > 0):
        return None
    at = {n: i for i, n in enumerate(ids)}
    # each constraining manager: (its NUMA nodes as a mask, its minAffinitySize)
    limits: list[tuple[int, int]] = []

    def limit(name: str, domain: list[int], cap: list[tuple[int, ...]],
              request: tuple[int, ...]) -> None:
        d = Demand(name, (name,), request, tuple(domain), {},
                   {n: cap[at[n]] for n in domain})
        limits.append((sum(1 << n for n in domain), d.min_width()))

    if ask.cpus:
        per = [0] * len(ids)
        for c in machine.cpus.values():
            if c.numa in at:
                per[at[c.numa]] += 1
        limit("cpu", sorted({c.numa for c in machine.cpus.values()} & set(ids)),
              [(v,) for v in per], (ask.cpus,))
    kinds = tuple(k for k, q in ask.memory if q > 0)
    need = tuple(q for _, q in ask.memory if q > 0)
    caps = tuple(_capacity(machine, k) for k in kinds)
    if kinds:
        limit("memory", sorted(ids), list(zip(*caps, strict=True)), need)
    bound: list[tuple[str, int]] = []
    loose: list[tuple[str, int]] = []
    for res, q in ask.devices:
        devices = machine.devices_of(res)
        if res not in machine.device_resources or q <= 0:
            continue
        if not any(d.numa_node is not None for d in devices):
            loose.append((res, q))
            continue
        bound.append((res, q))
        per = [0] * len(ids)
        for d in devices:
            if d.numa_node in at:
                per[at[d.numa_node]] += 1
        limit(res, sorted({d.numa_node for d in devices if d.numa_node in at}),
              [(v,) for v in per], (q,))
    widths = {w for _, w in limits}
    cands: list[tuple[int, tuple[int, ...]]] = []
    # past the kubelet's full hint walk only the hints one NUMA node wide are read
    wide = len(ids) > FULL_LIMIT
    blind = wide and widths != {1}
    if blind:
        pass
    elif len(widths) == 1 and not (policy == POLICY_SINGLE_NUMA_NODE and widths != {1}):
        (w,) = widths
        for pos in combinations(range(len(ids)), w):
            mask = sum(1 << ids[i] for i in pos)
            if all(not mask & ~dom for dom, _ in limits) and all(
                    sum(cap[i] for i in pos) >= q for cap, q in zip(caps, need, strict=True)):
                cands.append((mask, pos))
    def place(mask: int) -> int:  # NUMA node ids -> positions
        return sum(1 << i for i, n in enumerate(ids) if mask >> n & 1)

    spans = [place(dom) for dom, _ in limits]
    cpu_span = spans.pop(0) if ask.cpus else 0
    if kinds:
        spans.pop(0)
    anywhere = plain and len(ids) <= PolicyOptions().max_allowable_numa_nodes
    singles = (sum(1 << pos[0] for _, pos in cands)
               if cands and len(cands[0][1]) == 1 else None)
    cap_alone = sum(1 << i for i in range(len(ids))
                    if all(cap[i] >= q for cap, q in zip(caps, need, strict=True)))
    return Rules(policy, anywhere, ask.single, ids, not limits, tuple(sorted(cands)),
                 ask.cpus, kinds, need, caps, tuple(bound), tuple(loose),
                 sum(1 << n for n in ids), singles, cpu_span, tuple(spans), cap_alone,
                 (1 << len(ids)) - 1, not limits or singles is not None or not cands, wide,
                 blind)


def _holds(r: Rules, free: NodeFree, pos: tuple[int, ...]) -> bool:
    """The NUMA nodes at ``pos`` together have enough free for every manager."""
    fc = free.cpus
    if r.cpus and sum(fc[i] for i in pos) < r.cpus:
        return False
    for k, q in zip(r.kinds, r.need, strict=True):
        per = free.memory[k]
        if sum(per[i] for i in pos) < q:
            return False
    for res, q in r.bound:
        per = free.devices[res][0]
        if sum(per[i] for i in pos) < q:
            return False
    return True


def _memory_holds(r: Rules, free: NodeFree, mask: int) -> bool:
    """The NUMA nodes of ``mask`` (ids) hold the pod's memory, free and allocatable."""
    pos = [i for i, n in enumerate(r.ids) if mask >> n & 1]
    return all(sum(free.memory[k][i] for i in pos) >= q and sum(cap[i] for i in pos) >= q
               for k, q, cap in zip(r.kinds, r.need, r.caps, strict=True))


def _alone(r: Rules, free: NodeFree) -> int:
    """The memory manager's hints one NUMA node wide (bits by position): NUMA nodes its
    grouping rule lets hold memory alone, where the request fits, by free and by
    allocatable amounts."""
    got = r.cap_alone & free.alone
    for k, q in zip(r.kinds, r.need, strict=True):
        got &= free.memory_at_least(k, q)
    return got


def _wide(r: Rules, free: NodeFree) -> bool:
    """The memory manager has hints wider than one NUMA node: sums only grow with the
    mask, so the widest masks its grouping rule lets hold memory decide: all NUMA
    nodes without memory assignments together, each multi-node group as it is."""
    rule = free.rule
    wide = [g for g in {g for _, g in rule.groups} if rule.valid(g)]
    spare = r.all_nodes & ~rule.assigned
    if spare.bit_count() >= 2:
        wide.append(spare)
    return any(_memory_holds(r, free, m) for m in wide)


def _preferred(r: Rules, free: NodeFree) -> bool:
    """Some candidate mask is a preferred hint of every constraining manager."""
    if r.anything:
        return True
    if r.singles is not None:
        found = r.singles
        if r.cpus:
            found &= free.cpus_at_least(r.cpus)
        for k, q in zip(r.kinds, r.need, strict=True):
            found &= free.memory_at_least(k, q)
        for res, q in r.bound:
            found &= free.devices_at_least(res, q)
        if r.kinds:
            found &= free.alone
        return found != 0
    rule = free.rule
    return any(_holds(r, free, pos) and (not r.kinds or rule.valid(mask))
               for mask, pos in r.cands)


def outcome(r: Rules, free: NodeFree) -> Hashable | None:
    """What decides the pod on a node with ``free``: :data:`ADMITS` (the Topology
    Manager admits and every manager allocates: the resource fit decides),
    :data:`REFUSES` (``TopologyAffinityError``), (:data:`SHORT`, CPUs free, CPUs free
    inside the merged hint) under best-effort, or None: decide in full. Depends on
    ``free``'s amounts only up to the pod's request (they may come capped)."""
    if free.overcommitted and any(k in free.overcommitted for k in r.kinds):
        return None  # the memory manager's sums differ
    if _preferred(r, free):
        if r.loose and any(free.device_totals[res] < q for res, q in r.loose):
            return None  # devices without a NUMA node, allocated anywhere: too few
        return ADMITS
    return _unpreferred(r, free)


def classifier(r: Rules) -> Callable[[NodeFree], Hashable | None]:
    """:func:`outcome` of ``r``, with what it reads of ``r`` bound once: a filter asks
    it of every node of one machine and policy. Where the candidates are one NUMA node
    wide the preferred mask is read inline from ``free``'s masks (most nodes admit)."""
    if r.anything or r.singles is None:
        return partial(outcome, r)
    singles, cpus, loose = r.singles, r.cpus, r.loose
    memory = tuple(zip(r.kinds, r.need, strict=True))
    bound = r.bound
    kinds = frozenset(r.kinds)

    def classify(free: NodeFree) -> Hashable | None:
        over = free.overcommitted
        if over and not kinds.isdisjoint(over):
            return None  # the memory manager's sums differ
        if not free.holding(singles, cpus, memory, bound):
            return _unpreferred(r, free)
        if loose:
            totals = free.device_totals
            if any(totals[res] < q for res, q in loose):
                return None  # devices without a NUMA node, allocated anywhere: too few
        return ADMITS

    return classify


def _unpreferred(r: Rules, free: NodeFree) -> Hashable | None:
    """:func:`outcome` where no candidate mask is a preferred hint of every manager."""
    totals = [(free.device_totals[res], q)
              for res, q in (*r.bound, *r.loose)] if r.bound or r.loose else []
    if r.policy != POLICY_BEST_EFFORT and (
            sum(free.cpus) < r.cpus or any(t < q for t, q in totals[:len(r.bound)])):
        return REFUSES  # that manager has no hint at all: none is preferred
    if r.blind:
        return None
    alone = _alone(r, free) if r.kinds else 0
    if r.kinds and not alone and not _wide(r, free):
        return None  # the memory manager goes with any mask, its allocation fails
    if r.policy != POLICY_BEST_EFFORT:
        return REFUSES
    # best-effort admits whichever hint the merge gives: the allocation decides (one
    # container's: under pod scope each container allocates inside the pod's hint in
    # turn, and the memory a container takes binds its NUMA nodes for the next one)
    if not r.single or r.wide or any(t < q for t, q in totals):
        return None  # (a device manager failing first counts devices in its message)
    total = sum(free.cpus)
    if total < r.cpus:
        if not r.anywhere or totals:
            return None
        inside = total  # no memory asked: the merged hint is every NUMA node
        if r.kinds:
            # the CPU manager has no hint: the merge takes the memory manager's
            # narrowest hint, the lowest mask of that width (NUMA ids ascending)
            if not alone:
                return None
            inside = free.cpus[(alone & -alone).bit_length() - 1]
        return (SHORT, total, min(inside, r.cpus))
    if not r.kinds:
        return ADMITS
    if not free.rule.assigned and _memory_holds(r, free, r.all_nodes):
        return ADMITS
    if _joins(r, free, alone) and not _wide(r, free):
        return ADMITS
    return None


def _joins(r: Rules, free: NodeFree, alone: int) -> bool:
    """Best-effort, no preferred merged hint, the memory manager's hints all one NUMA
    node wide (``alone``, bits by position): each merged hint lies inside one of the
    memory manager's, which is a NUMA node alone, where its free memory holds the
    pod's; so its allocation succeeds wherever some merged hint is not empty (else the
    merge gives every NUMA node). One is not empty where some node of ``alone`` is in
    every constraining manager's whole span of NUMA nodes, which is a hint of each
    (enough free there: the CPUs, and the devices on NUMA nodes, where that resource
    has a hint list at all)."""
    span = r.cpu_span if r.cpus else r.every
    for (res, q), dom in zip(r.bound, r.bound_spans, strict=True):
        if sum(free.devices[res][0]) >= q:
            span &= dom
    return bool(alone & span)
