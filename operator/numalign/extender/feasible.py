"""The filter's fast verdict: pass or refuse, exact, without deciding every node's
allocation.

The scheduler's filter needs only whether each node admits the pod (and, when not, the
node's reason and message); the allocation and the score are for prioritize and bind.
A node's answer for a *simple* pod (no init containers, no GPU group request, one
Topology Manager decision: pod scope, or a pod of one container) depends on what the
node has free, counted per NUMA node, only up to what the pod asks:

- the hint lists (:meth:`numalign.topology.demands.Demand.key`: a NUMA node's free
  amount counts up to the request), hence the merge and its hint;
- the managers' allocation inside that hint, which fails only when fewer CPUs, bytes
  of a memory kind or devices of a resource are free than the pod asks (they take
  inside the hint first, then anywhere);
- the memory manager's grouping rule (which NUMA nodes hold single-node or multi-node
  memory assignments), and the resource fit (pods held, requests summed, against
  allocatable).

So nodes of one machine under one policy whose free amounts, capped at the pod's
request, and grouping rule are equal (:func:`group_key`) decide the pod alike: the
first of them is decided in full (:meth:`Decider.decide`), and the others of its group
share its answer, when that answer names nothing of the node: an admission, or a
``TopologyAffinityError`` (the merge refused; its message is the kubelet's fixed one).
Under restricted, best-effort and single-numa-node the groups are coarser
(:mod:`.preferred`, which reads the merge's outcome from the free amounts): nodes where
some mask is a preferred hint of every manager (the fit decides), nodes where none is
(restricted and single-numa-node refuse: one group over every machine), and under
best-effort nodes with fewer CPUs free than asked (the CPU manager's failure, whose
counts the key holds: one group per count over every machine). Any other
``UnexpectedAdmissionError`` (counts in its message), a resource-fit refusal (the
node's used amounts in it) or anything else is decided node by node. Where the policy
is built as is (no options, no more NUMA nodes than the default limit), some groups'
answers need no full decision (:meth:`_Site.implied`): the merge's refusal, best-effort's
CPU shortage (worded from its counts), and an admission with room in the fit once one
node of the filter was admitted in full. A fast admission
carries no allocation and no score (:attr:`Verdict.complete` False): prioritize
completes it, bind decides in full.

Nodes holding pods not published yet (reservations, pods in flight there) and pods
outside the simple ones take the full decision: what a pod in flight takes depends on
which CPUs it was given, not only on how many.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from numalign.api.effective import EffectivePolicy
from numalign.api.names import REJECT_REASON
from numalign.api.nodestatus import HeldPod
from numalign.topology.admit import UNEXPECTED_REASON, allocation_failure
from numalign.topology.machine import Machine
from numalign.topology.managers.cpu import cpus_short
from numalign.topology.merge import REJECT_MESSAGE
from numalign.topology.pod import is_extended
from numalign.topology.policyconfig import (
    POLICY_SINGLE_NUMA_NODE,
    SCOPE_POD,
)
from numalign.topology.resourcefit import DEFAULT_MAX_PODS, PODS, allocatable

from .nodefree import NodeFree, PodAsk, node_free, pod_ask
from .preferred import (
    ADMITS,
    ANYWHERE,
    REFUSES,
    SHORT,
    Rules,
    classifier,
    outcome,
    rules_for,
)
from .score import MIN_SCORE
from .verdict import PodShape, Verdict
from .view import NodeView

__all__ = ["FastVerdicts", "NodeFree", "PodAsk", "group_key", "node_free", "pod_ask"]

Flying = Sequence[tuple[Mapping[str, Any], HeldPod]]


def _capped(values: tuple[int, ...], top: int) -> tuple[int, ...]:
    return tuple([v if v < top else top for v in values])


def _enough(values: tuple[int, ...], top: int) -> tuple[bool, ...]:
    return tuple([v >= top for v in values])


_ALLOCATABLE: dict[int, tuple[Machine, Mapping[str, int]]] = {}


def _allocatable(machine: Machine) -> Mapping[str, int]:
    hit = _ALLOCATABLE.get(id(machine))
    if hit is None or hit[0] is not machine:
        if len(_ALLOCATABLE) > 256:
            _ALLOCATABLE.clear()
        hit = _ALLOCATABLE[id(machine)] = (machine, allocatable(machine, DEFAULT_MAX_PODS))
    return hit[1]


@dataclass(frozen=True)
class _Plan:
    """What :func:`group_key` reads of a machine for one pod and policy, made once:
    the fit's allocatable per resource asked (-1: not on the machine), the pod's ask
    (the device resources the machine has), the rules of :mod:`.preferred` and the
    outcomes they gave."""

    pods: int
    fit: tuple[tuple[str, int, int], ...]  # (resource, allocatable, asked)
    single_numa: bool
    cpus: int
    kinds: tuple[tuple[str, int], ...]
    devices: tuple[tuple[str, int], ...]
    rules: Rules | None
    # the capped free amounts -> their outcome (None: decide in full)
    outcomes: dict[Hashable, Hashable | None] = field(default_factory=dict)


_PLANS: dict[tuple[int, PodAsk, str, bool], tuple[Machine, _Plan]] = {}
_MISSING = object()


def _plan(machine: Machine, ask: PodAsk, policy: str, plain: bool) -> _Plan:
    key = (id(machine), ask, policy, plain)
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is machine:
        return hit[1]
    alloc = _allocatable(machine)
    fit = tuple((res, -1 if (cap := alloc.get(res)) is None else cap, q) for res, q in ask.fit)
    # a memory kind the machine lacks: its manager fails as it allocates (decided by
    # the capped amounts); a device resource it lacks takes no part (no device
    # manager's hint for it, no fit check of it)
    have = set(machine.device_resources)
    plan = _Plan(alloc[PODS], fit, policy == POLICY_SINGLE_NUMA_NODE, ask.cpus, ask.memory,
                 tuple((r, q) for r, q in ask.devices if r in have),
                 rules_for(machine, ask, policy, plain))
    if len(_PLANS) > 256:
        _PLANS.clear()
    _PLANS[key] = (machine, plan)
    return plan


def group_key(machine: Machine, free: NodeFree, ask: PodAsk, policy: str = "",
              plain: bool = True) -> Hashable:
    """What of a node the simple pod ``ask`` depends on under ``policy`` (``plain``:
    without policy options), with the machine, the policy and the pod's shape, which
    the caller adds (:func:`_group`)."""
    return _group(_plan(machine, ask, policy, plain), free)


def _capped_free(plan: _Plan, free: NodeFree) -> tuple[Any, ...]:
    return (_capped(free.cpus, plan.cpus),
            tuple([_capped(free.memory.get(k, ()), q) for k, q in plan.kinds]),
            tuple([(_capped(free.devices[r][0], q), min(free.devices[r][1], q))
                   for r, q in plan.devices]),
            free.rule if plan.kinds else None)


def _group(plan: _Plan, free: NodeFree, got: Any = _MISSING) -> tuple[Any, ...]:
    """The free amounts capped at the pod's request, the grouping rule, the room the
    resource fit sees, capped likewise.

    Coarser where the policy decides alike on less (:mod:`.preferred`): nodes where
    the merge's hint is preferred and every manager allocates (the fit decides),
    under restricted and single-numa-node those where no merged hint is preferred (a
    refusal, on any machine), under best-effort those where fewer CPUs are free than
    asked (a failure counting them, on any machine: the key holds the counts).
    Otherwise under single-numa-node only which NUMA nodes alone hold each request
    (and which the grouping rule lets the memory use alone) count: it admits only a
    hint of one NUMA node, preferred by every manager, inside which each allocates.
    ``got``: the outcome of the plan's rules on ``free``, where the caller read it."""
    rules = plan.rules
    if rules is not None:
        capped: tuple[Any, ...] | None = None
        if got is not _MISSING:
            pass
        elif rules.cheap:
            got = outcome(rules, free)
        else:  # sums over masks: kept by the capped amounts they depend on
            capped = _capped_free(plan, free)
            got = plan.outcomes.get(capped, _MISSING)
            if got is _MISSING:
                if len(plan.outcomes) > 1024:
                    plan.outcomes.clear()
                got = plan.outcomes[capped] = outcome(rules, free)
        if isinstance(got, tuple):  # an allocation's failure, before the fit
            return (ANYWHERE, got)
        if got == REFUSES and rules.anywhere:  # the merge's, before the fit
            return (ANYWHERE, got)
        if got is not None:
            return (got, _room(plan, free))
        if not plan.single_numa:
            return (*(capped or _capped_free(plan, free)), _room(plan, free))
    cut: Callable[[tuple[int, ...], int], tuple[Any, ...]] = (
        _enough if plan.single_numa else _capped)
    memory = tuple(cut(free.memory.get(k, ()), q) for k, q in plan.kinds)
    devices = tuple((cut(free.devices[r][0], q), min(free.devices[r][1], q))
                    for r, q in plan.devices)
    rule: Any = None
    if memory:
        rule = (tuple(free.rule.valid(1 << n) for n in free.numa_ids)
                if plan.single_numa else free.rule)
    return (cut(free.cpus, plan.cpus), memory, devices, rule, _room(plan, free))


def _room(plan: _Plan, free: NodeFree) -> tuple[int, ...]:
    """The room the resource fit sees: pods, and each resource asked, capped at the
    pod's ask."""
    used = free.used
    return (min(plan.pods - free.pods, 1),
            *[-1 if cap < 0 else min(cap - used.get(res, 0), q) for res, cap, q in plan.fit])


def totals_key(free: NodeFree) -> Hashable:
    """What the managers' allocation failures count beside the hint (the CPUs and the
    devices of each resource free on the whole node)."""
    return (sum(free.cpus), tuple((r, sum(per) + loose)
                                  for r, (per, loose) in sorted(free.devices.items())))


_FIT = "fits"  # a group's nodes admit the pod
_EACH = "each"  # a group's nodes are decided one by one
_TOTALS = "totals"  # a manager failed: nodes of the group with equal totals alike
# the managers' allocation failures (.topology.managers): their messages count the CPUs
# and devices free (totals_key), or are fixed
_COUNTED = ("Allocate failed due to not enough cpus available to satisfy request: ",
            "Allocate failed due to requested number of devices unavailable for ",
            "Allocate failed due to [memorymanager] ")


class FastVerdicts:
    """Group answers, least recently used out first: (machine, policy, node kind, pod
    shape, :func:`group_key`) -> an admission, a refusal that names nothing of the node,
    or "decide each node"."""

    def __init__(self, size: int = 20_000) -> None:
        self.size = size
        self._kept: OrderedDict[Hashable, Any] = OrderedDict()
        self.shared = 0  # verdicts given from a group's answer
        self.decided = 0  # verdicts decided in full

    def clear(self) -> None:
        """Forget every group answer, and the plans' outcomes (shared by every
        decider) with them."""
        self._kept.clear()
        _PLANS.clear()

    def get(self, key: Hashable) -> Any:
        got = self._kept.get(key)
        if got is not None:
            self._kept.move_to_end(key)
        return got

    def put(self, key: Hashable, value: Any) -> None:
        self._kept[key] = value
        if len(self._kept) > self.size:
            self._kept.popitem(last=False)


def shared_answer(verdict: Verdict) -> Any:
    """What of ``verdict`` the nodes of its group share (see the module's docstring)."""
    if not verdict.covered:
        return _EACH
    if verdict.fits:
        return _FIT
    if verdict.reason == REJECT_REASON and verdict.message == REJECT_MESSAGE:
        return verdict
    if verdict.reason == UNEXPECTED_REASON and (verdict.message or "").startswith(_COUNTED):
        return _TOTALS
    return _EACH


# a site's most common groups, as tokens (no tuple to build and hash per node)
_ADMITTED = "admitted"  # the rules admit, the fit has room for all the pod asks
_REFUSED = "refused"  # no preferred merged hint, the same refusal on every machine


class _Site:
    """One filter call's reading of one (machine, node policy): the pod's effective
    policy, the plan (None: decide each node in full), the cache key's head (on this
    machine, on any), the fast admission, and the answers found for its groups."""

    __slots__ = ("anyhead", "classify", "eff", "fits", "full_room", "head", "known", "plan",
                 "refusal", "sure")

    def __init__(self, eff: EffectivePolicy, plan: _Plan | None, head: tuple[Any, ...],
                 anyhead: tuple[Any, ...]) -> None:
        self.eff, self.plan, self.head, self.anyhead = eff, plan, head, anyhead
        self.fits = Verdict("", True, policy=eff, complete=False)
        rules = plan.rules if plan is not None else None
        self.classify = classifier(rules) if rules is not None and rules.cheap else None
        # the fit's room where it holds all the pod asks (:func:`_room`)
        self.full_room = () if plan is None else (
            1, *[-1 if cap < 0 else q for _, cap, q in plan.fit])
        self.known: dict[Hashable, Any] = {}  # group -> its answer (not _TOTALS)
        # the answers of its two groups, known without a full decision (see
        # :meth:`implied`): the merge's refusal, and whether an admission is sure
        self.refusal = Verdict("", False, REJECT_REASON, REJECT_MESSAGE, MIN_SCORE,
                               policy=eff)
        self.sure = (rules is not None and rules.anywhere and plan is not None and all(
            cap >= 0 or is_extended(res) for res, cap, _ in plan.fit))

    def group(self, free: NodeFree) -> Hashable:
        """:func:`_group` of ``free``, or the token of the group it names."""
        plan = self.plan
        assert plan is not None
        classify = self.classify
        if classify is None:
            return _group(plan, free)
        got = classify(free)
        if got is ADMITS:
            if plan.pods - free.pods >= 1:
                used = free.used
                for res, cap, q in plan.fit:
                    if cap >= 0 and cap - used.get(res, 0) < q:
                        break
                else:
                    return _ADMITTED
            return (ADMITS, _room(plan, free))
        if got == REFUSES and plan.rules is not None and plan.rules.anywhere:
            return _REFUSED
        return _group(plan, free, got)

    def implied(self, group: Hashable, admitted: bool) -> Any:
        """The answer of ``group`` where the rules imply it (None: decide its first node
        in full). The engine admits a pod (:func:`numalign.topology.admit.admit_pod`)
        unless its policy cannot be built (options given, or more NUMA nodes than the
        default limit: :attr:`Rules.anywhere` False), the Topology Manager's merge
        refuses (``TopologyAffinityError`` with the kubelet's fixed message), a
        manager's allocation fails, or the resource fit does. So where the policy is
        built: :data:`_REFUSED` (no preferred merged hint under restricted or
        single-numa-node) is that refusal, and :data:`_ADMITTED` (a preferred hint
        every manager allocates inside, room for every resource the fit counts, none
        the fit finds missing on the machine) admits, once one node of the filter
        (``admitted``) was admitted in full: the first keeps its allocation and score
        (a filter of one node answers as prioritize would, and the pod's hold there,
        in flight, is known). Under best-effort, :data:`SHORT` is the CPU manager's
        failure, which its counts word."""
        if group is _REFUSED:
            return self.refusal
        if group is _ADMITTED:
            return _FIT if self.sure and admitted else None
        assert isinstance(group, tuple)
        if group[0] == ANYWHERE and isinstance(group[1], tuple) and group[1][0] == SHORT:
            # best-effort, the CPU manager's failure: it takes the CPUs free inside the
            # merged hint, then counts the ones it still needs and those free besides
            _, total, inside = group[1]
            asked = self.plan.cpus if self.plan is not None else 0
            return Verdict("", False, UNEXPECTED_REASON, allocation_failure(
                cpus_short(asked - inside, total - inside)), MIN_SCORE, policy=self.eff)
        return None

    def key(self, group: Hashable) -> tuple[tuple[Any, ...], bool]:
        """The cache key of ``group``, and whether its answer is the same on every
        machine."""
        if group is _ADMITTED:
            return (self.head, (ADMITS, self.full_room)), False
        if group is _REFUSED:
            return (self.anyhead, (ANYWHERE, REFUSES)), True
        assert isinstance(group, tuple)
        anywhere = group[0] == ANYWHERE
        return (self.anyhead if anywhere else self.head, group), anywhere


def fast_filter(views: Mapping[str, NodeView], cache: FastVerdicts, nodes: Sequence[str],
                shape: PodShape, held: Mapping[str, Sequence[HeldPod]],
                flying: Mapping[str, Flying], effective: Callable[[NodeView], EffectivePolicy],
                full: Callable[[str], Verdict], out_of_time: Callable[[str], Verdict | None]
                ) -> list[Verdict]:
    """A verdict for each of ``nodes`` (the decider's ``views`` and group answers
    ``cache``; ``effective(view)``: the pod's effective policy there): a group's answer
    where it is shared, else ``full(node)`` (the decider's full verdict);
    ``out_of_time(node)``: the verdict of a node left undecided when the filter's time ran
    out, or None."""
    ask = pod_ask(shape.model)
    simple = ask.simple
    out: list[Verdict] = []
    append = out.append
    sites: dict[tuple[str, str], _Site] = {}  # per (machine, node policy)
    views_get, sites_get = views.get, sites.get
    answers: dict[Hashable, Any] = {}  # this call's group answers, read first
    shared = decided = 0
    admitted = False  # a node decided in full admitted the pod
    for n in nodes:
        late = out_of_time(n)
        if late is not None:
            append(late)
            continue
        view = views_get(n)
        if not simple or view is None or view.machine is None:
            append(full(n))
            continue
        if held or flying:
            mine, fly = held.get(n), flying.get(n)
            if ((mine and any(not view.lists(r) for r in mine))
                    or (fly and any(not view.lists(h) for _, h in fly))):
                append(full(n))
                continue
        site = sites_get((view.machine_key, view.policy_id))
        if site is None:
            eff = effective(view)
            plan = (None if eff.scope != SCOPE_POD and not ask.single else
                    _plan(view.machine, ask, eff.policy.name, not eff.options.given))
            site = sites[(view.machine_key, view.policy_id)] = _Site(
                eff, plan, (view.machine_key, eff.key, view.policy.kind, shape.key),
                (None, eff.key, view.policy.kind, shape.key))
        if site.plan is None:
            append(full(n))
            continue
        free = view.free_amounts
        if free is None:
            free = view.free()
        group = site.group(free)
        got = site.known.get(group)
        if got is _FIT:
            shared += 1
            append(site.fits.moved(n, site.eff))
            continue
        if got is _EACH:
            decided += 1
            append(full(n))
            continue
        if got is not None:
            shared += 1
            append(got.moved(n, site.eff))
            continue
        key, anywhere = site.key(group)
        got = answers.get(key)
        if got is None:
            got = cache.get(key)
            if got is not None:
                answers[key] = got
        counted = got is _TOTALS
        if counted:
            key = (key, totals_key(free))
            got = cache.get(key)
        elif got is not None:
            site.known[group] = got
        if got is None and not counted:
            got = site.implied(group, admitted)
            if got is not None:
                cache.put(key, got)
                answers[key] = site.known[group] = got
        if got is None:
            v = full(n)
            decided += 1
            admitted = admitted or v.fits
            answer = shared_answer(v)
            plain = not counted  # the group's own key
            if answer is _TOTALS:
                if anywhere:
                    pass  # the group's key counts what the message does
                elif not counted:
                    cache.put(key, _TOTALS)
                    answers[key] = _TOTALS
                    key = (key, totals_key(free))
                    plain = False
                answer = v
            elif counted:  # not as the group's first node failed: decide each
                answer = _EACH
            cache.put(key, answer)
            answers[key] = answer
            if plain:
                site.known[group] = answer
            append(v)
        elif got is _FIT:
            shared += 1
            append(site.fits.moved(n, site.eff))
        elif got is _EACH:
            decided += 1
            append(full(n))
        else:
            shared += 1
            append(got.moved(n, site.eff))
    cache.shared += shared
    cache.decided += decided
    return out
