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
An ``UnexpectedAdmissionError`` (counts in its message), a resource-fit refusal (the
node's used amounts in it) or anything else is decided node by node. A fast admission
carries no allocation and no score (:attr:`Verdict.complete` False): prioritize
completes it, bind decides in full.

Nodes holding pods not published yet (reservations, pods in flight there) and pods
outside the simple ones take the full decision: what a pod in flight takes depends on
which CPUs it was given, not only on how many.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from numalign.api.effective import EffectivePolicy
from numalign.api.names import REJECT_REASON
from numalign.api.nodestatus import HeldPod
from numalign.topology.admit import UNEXPECTED_REASON
from numalign.topology.ledger import MEMORY
from numalign.topology.machine import Machine
from numalign.topology.merge import REJECT_MESSAGE
from numalign.topology.pod import HUGEPAGES_PREFIX
from numalign.topology.policyconfig import (
    POLICY_BEST_EFFORT,
    POLICY_RESTRICTED,
    POLICY_SINGLE_NUMA_NODE,
    SCOPE_POD,
)
from numalign.topology.resourcefit import DEFAULT_MAX_PODS, PODS, allocatable

from .nodefree import NodeFree, PodAsk, node_free, pod_ask
from .preferred import ANYWHERE, REFUSES, Rules, outcome, rules_for
from .verdict import PodShape, Verdict
from .view import NodeView

__all__ = ["FastVerdicts", "NodeFree", "PodAsk", "group_key", "node_free", "pod_ask"]

Flying = Sequence[tuple[Mapping[str, Any], HeldPod]]


def _capped(values: tuple[int, ...], top: int) -> tuple[int, ...]:
    return tuple(v if v < top else top for v in values)


_ALLOCATABLE: dict[int, tuple[Machine, Mapping[str, int]]] = {}


def _allocatable(machine: Machine) -> Mapping[str, int]:
    hit = _ALLOCATABLE.get(id(machine))
    if hit is None or hit[0] is not machine:
        if len(_ALLOCATABLE) > 256:
            _ALLOCATABLE.clear()
        hit = _ALLOCATABLE[id(machine)] = (machine, allocatable(machine, DEFAULT_MAX_PODS))
    return hit[1]


def _enough(values: tuple[int, ...], top: int) -> tuple[bool, ...]:
    return tuple(v >= top for v in values)


@dataclass(frozen=True)
class _Plan:
    """What :func:`group_key` reads of a machine for one pod and policy, made once:
    the fit's allocatable per resource asked (-1: not on the machine), the coarse
    classes' ask (the device resources the machine has) and which of its device
    resources have devices on NUMA nodes."""

    pods: int
    fit: tuple[tuple[int, int], ...]  # (allocatable, asked)
    coarse: bool
    restricted: bool
    narrow: bool  # every manager's preferred hints are one NUMA node wide
    single_numa: bool
    kinds: tuple[tuple[str, int], ...]
    devices: tuple[tuple[str, int, bool], ...]  # (resource, asked, on NUMA nodes)
    rules: Rules | None  # the merge's outcome from the free amounts (.preferred)
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
    fit = tuple((-1 if (cap := alloc.get(res)) is None else cap, q) for res, q in ask.fit)
    have = set(machine.device_resources)
    # a memory kind the machine lacks: its manager fails as it allocates (decided by
    # the capped amounts); a device resource it lacks takes no part (no device
    # manager's hint for it, no fit check of it)
    kinds = {MEMORY, *(HUGEPAGES_PREFIX + s for s in machine.hugepage_sizes)}
    coarse = policy in (POLICY_RESTRICTED, POLICY_BEST_EFFORT) and all(
        k in kinds for k, _ in ask.memory)
    devices = tuple((r, q, any(d.numa_node is not None for d in machine.devices_of(r)))
                    for r, q in ask.devices if r in have)
    plan = _Plan(alloc[PODS], fit, coarse, policy == POLICY_RESTRICTED,
                 _narrow(machine, ask, devices), policy == POLICY_SINGLE_NUMA_NODE,
                 ask.memory, devices, rules_for(machine, ask, policy, plain))
    if len(_PLANS) > 1024:
        _PLANS.clear()
    _PLANS[key] = (machine, plan)
    return plan


def _narrow(machine: Machine, ask: PodAsk,
            devices: tuple[tuple[str, int, bool], ...]) -> bool:
    """One NUMA node's capacity holds each manager's request (the kubelet's
    minAffinitySize is 1 for each): their preferred hints are single NUMA nodes."""
    nodes = machine.numa_nodes
    if ask.cpus and max((len(n.cpus) for n in nodes), default=0) < ask.cpus:
        return False
    if ask.memory and not any(
            all((n.memory if k == MEMORY else n.hugepages.get(
                k.removeprefix(HUGEPAGES_PREFIX), 0)) >= q for k, q in ask.memory)
            for n in nodes):
        return False
    for r, q, bound in devices:
        if bound and not any(
                sum(1 for d in machine.devices_of(r) if d.numa_node == n.id) >= q
                for n in nodes):
            return False
    return True


def _one_numa(plan: _Plan, free: NodeFree, cpus: int) -> bool:
    """Some NUMA node alone holds all the pod asks (and the grouping rule lets its
    memory stay there): every manager then prefers that node's hint, so the merge's best
    hint is preferred and one NUMA node wide, and each manager allocates inside it."""
    checks = [(free.memory[k], q) for k, q in plan.kinds]
    for r, q, bound in plan.devices:
        per, loose = free.devices[r]
        if bound:
            checks.append((per, q))
        elif loose < q:  # no preference; allocated anywhere
            return False
    rule = free.rule if plan.kinds else None
    for i, c in enumerate(free.cpus):
        if c >= cpus and all(per[i] >= q for per, q in checks) and (
                rule is None or rule.valid(1 << free.numa_ids[i])):
            return True
    return False


def _short(plan: _Plan, free: NodeFree, cpus: int) -> bool:
    """The whole node has fewer CPUs or devices free than the pod asks: that manager
    has no hint at all (an empty list: the merge cannot prefer any). (The memory
    manager has no hint either where no mask holds the memory, but says so as no
    preference: its allocation then fails, the merge does not.)"""
    if sum(free.cpus) < cpus:
        return True
    for r, q, _ in plan.devices:
        per, loose = free.devices[r]
        if sum(per) + loose < q:
            return True
    return False


def _memory_hinted(plan: _Plan, free: NodeFree) -> bool:
    """The memory manager has a hint (one NUMA node alone holds the memory and the
    grouping rule lets it), or the pod asks for no NUMA-bound memory."""
    if not plan.kinds:
        return True
    rule = free.rule
    for i, n in enumerate(free.numa_ids):
        if all(free.memory[k][i] >= q for k, q in plan.kinds) and rule.valid(1 << n):
            return True
    return False


def group_key(machine: Machine, free: NodeFree, ask: PodAsk, policy: str = "",
              plain: bool = True) -> Hashable:
    """What of a node the simple pod ``ask`` depends on (with the machine, the policy
    and the pod's shape, which the caller adds): the free amounts capped at the pod's
    request, the grouping rule, the room the resource fit sees, capped likewise.

    Coarser where the ``policy`` decides alike on less: under single-numa-node only
    which NUMA nodes alone hold each request (and which the grouping rule lets the
    memory use alone): it admits only a hint of one NUMA node, preferred by every
    manager, inside which each then allocates. Under restricted and best-effort, a
    node where one NUMA node holds everything (:func:`_one_numa`) admits; under
    restricted, the others refuse where the CPU or device manager has no hint at all
    (:func:`_short`), or where every manager's preferred hints are one NUMA node wide
    (:func:`_narrow`) and the memory manager has one (:func:`_memory_hinted`)."""
    plan = _plan(machine, ask, policy, plain)
    used = free.used
    room = (min(plan.pods - free.pods, 1),
            *(-1 if cap < 0 else min(cap - used.get(res, 0), q)
              for (res, _), (cap, q) in zip(ask.fit, plan.fit, strict=True)))
    if plan.rules is not None:
        capped = (_capped(free.cpus, ask.cpus),
                  tuple(_capped(free.memory.get(k, ()), q) for k, q in plan.kinds),
                  tuple((_capped(free.devices[r][0], q), min(free.devices[r][1], q))
                        for r, q, _ in plan.devices),
                  free.rule if plan.kinds else None)
        got = plan.outcomes.get(capped, _MISSING)
        if got is _MISSING:
            if len(plan.outcomes) > 4096:
                plan.outcomes.clear()
            got = plan.outcomes[capped] = outcome(plan.rules, free)
        if isinstance(got, tuple):  # an allocation's failure, before the fit
            return (ANYWHERE, got)
        if got == REFUSES and plan.rules.anywhere:  # the merge's, before the fit
            return (ANYWHERE, got)
        if got is not None:
            return (got, room)
        if not plan.single_numa:
            return (*capped, room)
    elif plan.coarse:
        if _one_numa(plan, free, ask.cpus):
            return ("one", room)
        # restricted admits only a preferred hint: none where a manager has no hint
        # at all, nor where every manager's preferred hints are one NUMA node wide
        # (the memory manager's too: it has one) and no NUMA node holds all of it
        if plan.restricted and (_short(plan, free, ask.cpus) or (
                plan.narrow and _memory_hinted(plan, free))):
            return ("refused", room)
    cut: Callable[[tuple[int, ...], int], tuple[Any, ...]] = (
        _enough if plan.single_numa else _capped)
    memory = tuple(cut(free.memory.get(k, ()), q) for k, q in ask.memory)
    devices = []
    for res, q in ask.devices:
        per, loose = free.devices.get(res, ((), 0))
        devices.append((cut(per, q), min(loose, q)))
    rule: Any = None
    if memory:
        rule = (tuple(free.rule.valid(1 << n) for n in machine.numa_ids)
                if plan.single_numa else free.rule)
    return (cut(free.cpus, ask.cpus), memory, tuple(devices), rule, room)


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
        self._kept.clear()

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
    out: list[Verdict] = []
    for n in nodes:
        late = out_of_time(n)
        if late is not None:
            out.append(late)
            continue
        view = views.get(n)
        if (not ask.simple or view is None or view.machine is None
                or any(not view.lists(r) for r in held.get(n, ()))
                or any(not view.lists(h) for _, h in flying.get(n, ()))):
            out.append(full(n))
            continue
        eff = effective(view)
        if eff.scope != SCOPE_POD and not ask.single:
            out.append(full(n))
            continue
        free = node_free(view.ledger())
        group = group_key(view.machine, free, ask, eff.policy.name, not eff.options.given)
        anywhere = isinstance(group, tuple) and group[0] == ANYWHERE
        key: Hashable = (None if anywhere else view.machine_key, eff.key, view.policy.kind,
                         shape.key, group)
        got = cache.get(key)
        counted = got is _TOTALS
        if counted:
            key = (key, totals_key(free))
            got = cache.get(key)
        if got is None:
            v = full(n)
            cache.decided += 1
            answer = shared_answer(v)
            if answer is _TOTALS:
                if anywhere:
                    pass  # the group's key counts what the message does
                elif not counted:
                    cache.put(key, _TOTALS)
                    key = (key, totals_key(free))
                answer = v
            elif counted:  # not as the group's first node failed: decide each
                answer = _EACH
            cache.put(key, answer)
            out.append(v)
        elif got is _FIT:
            cache.shared += 1
            out.append(Verdict(n, True, policy=eff, complete=False))
        elif got is _EACH:
            cache.decided += 1
            out.append(full(n))
        else:
            cache.shared += 1
            out.append(replace(got, node=n, policy=eff))
    return out
