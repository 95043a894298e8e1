"""Pods in flight: approved by a filter, not bound yet.

A pod the extender approved may land on any node it was approved for, or on none of
them; one whose claims are not allocated yet lands with the devices the allocator picks,
and the node puts its CPUs and memory next to *those*. A pod filtered after it is
approved on a node only if that node admits it however they land (:class:`InFlightChecks`,
mixed into :class:`~.decide.Decider`):

- where the pods in flight surely leave room (:func:`room_left`, with the NUMA nodes
  each can reach: a pod with claims under a hard policy only those of its choices'
  devices, one without claims only those the node admits it on now where that holds
  whichever others land first), the verdict without them stands, and nothing more is
  decided;
- else each way they may land is decided (:meth:`InFlightChecks._branches`: every device
  choice of a pod with claims, and its landing elsewhere; at most :data:`MAX_BRANCHES`,
  beyond which a hard policy's pod waits with ``PodsInFlightUnchecked``).

In a burst the second is the costly part of a filter, and so is the second look of the
first (where each pod in flight lands: a decision each, against what all the others
ask for, :class:`Asked`). So :meth:`~.decide.Decider.filter` (``defer``) decides a node
where the first, cheaper look (the pods in flight reaching every NUMA node) leaves no
room last, with both, and only until :data:`ENOUGH_PASSING` nodes admit the pod,
:data:`MAX_DEFERRED_NODES` of them refused it or the engine ran
:data:`MAX_DEFERRED_RUNS` times for them (while no node admits it, until
:data:`MAX_LONE_RUNS` runs); the others wait (``PodsInFlightUnchecked``, saying why)
until the pods in flight are bound.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from numalign.api.draasks import ClaimAsk, Placement, PodChoices
from numalign.api.draclaims import uses_claims
from numalign.api.effective import EffectivePolicy
from numalign.api.names import ANN_GPUS, IN_FLIGHT_REASON
from numalign.api.nodestatus import HeldPod
from numalign.api.resolved import Resolved
from numalign.topology.hints import mask_count
from numalign.topology.ledger import Ledger
from numalign.topology.resourcefit import DEFAULT_MAX_PODS

from .dradecide import HARD, spread
from .podshape import pod_shape, policy_of
from .score import MIN_SCORE
from .verdict import PodShape, Verdict
from .view import KeptByIdentity, NodeView, held_key

__all__ = ["DEFERRED", "ENOUGH_PASSING", "MAX_BRANCHES", "MAX_DEFERRED_NODES",
           "MAX_DEFERRED_RUNS", "MAX_LONE_RUNS", "Asked", "InFlightChecks", "room_left"]

# the ways pods in flight may land on a node, each checked (Decider._branches)
MAX_BRANCHES = 16
# a filter leaves a node whose pods in flight must be decided way by way for last, and
# refuses it (for now) when at least this many other nodes pass
ENOUGH_PASSING = 10
# else such nodes are decided one by one, until this many refused the pod or the engine
# ran this many times for them
MAX_DEFERRED_NODES = 4
MAX_DEFERRED_RUNS = 16
# while no node admits the pod, until the engine ran this many times: a pod no node
# admits goes back to the scheduler's queue for seconds (its backoff), far longer than
# these runs take
MAX_LONE_RUNS = 128
DEFERRED = "deferred: pods in flight"
DEFERRED_MESSAGE = ("numalign: pods in flight to this node leave it too tight to admit this "
                    "pod without deciding each way they may land; it waits until they are "
                    "bound")


@dataclass(frozen=True)
class Asked:
    """What pods in flight ask for, summed (:func:`room_left`): a node's sums are found
    once and each pod's share taken out of them (:meth:`less`), not summed again for
    each pod."""

    pods: int = 0
    unknown: int = 0  # holds without containers (approved by a fast verdict)
    wide: int = 0  # containers whose memory spans NUMA nodes
    cpus: int = 0
    memory: Mapping[str, int] = field(default_factory=dict)  # kind -> bytes
    devices: Mapping[str, int] = field(default_factory=dict)  # resource -> count

    @classmethod
    def of(cls, holds: Sequence[HeldPod]) -> Asked:
        unknown = wide = cpus = 0
        memory: dict[str, int] = {}
        devices: dict[str, int] = {}
        for h in holds:
            unknown += not h.containers
            for _, a in h.containers:
                if a.memory_mask is not None and mask_count(a.memory_mask) > 1:
                    wide += 1
                cpus += len(a.cpus)
                if a.memory:
                    for kind, per in a.memory.items():
                        memory[kind] = memory.get(kind, 0) + sum(per.values())
                if a.devices:
                    for res, ids in a.devices.items():
                        devices[res] = devices.get(res, 0) + len(ids)
        return cls(len(holds), unknown, wide, cpus, memory, devices)

    def less(self, other: Asked) -> Asked:
        return Asked(self.pods - other.pods, self.unknown - other.unknown,
                     self.wide - other.wide, self.cpus - other.cpus,
                     {k: v - other.memory.get(k, 0) for k, v in self.memory.items()},
                     {k: v - other.devices.get(k, 0) for k, v in self.devices.items()})


# what one pod in flight asks for (asked again on every filter while it is in flight)
_asked_by = KeptByIdentity[HeldPod, Asked](lambda h: Asked.of((h,)), 8192)


def room_left(view: NodeView, reserved: Sequence[HeldPod], flying: Sequence[HeldPod] | Asked,
              verdict: Verdict, shape: PodShape, resolved: Resolved,
              reach: Sequence[frozenset[int] | None] = ()) -> bool:
    """Whether the pod ``verdict`` admitted on ``view`` (holding ``reserved``) is surely
    admitted the same with the pods ``flying`` held too, wherever they land: on the NUMA
    nodes of its verdict, what the node and ``reserved`` take, less all that ``flying``
    asks for, leave as many CPUs, as much memory of each kind and as many devices of each
    resource as the pod took. Then its NUMA nodes stay a valid hint of the same width (the
    kubelet prefers by width over all CPUs, not free ones) and the best one, the managers
    allocate inside them and the pod count fits. A sufficient condition only: False
    (decide again) near capacity, and for policy options, GPU group requests, containers
    aligned one by one, memory spanning NUMA nodes. ``flying``: the pods' holds, or what
    they ask for summed (:class:`Asked`, every pod reaching every NUMA node). ``reach``:
    per pod of ``flying``, the NUMA nodes it can take anything on, where known (None, or
    missing: any); a pod that cannot reach the verdict's NUMA nodes takes nothing
    there."""
    machine, model = view.machine, shape.model
    if not verdict.room_by_counts:  # GPU groups, a kind placed by more than counts
        return False
    if machine is None or model is None or resolved.options.given or ANN_GPUS in model.annotations:
        return False
    mine = [a for _, a in verdict.containers]
    if resolved.scope != "pod" and sum(1 for a in mine if a.cpus or a.memory or a.devices) > 1:
        return False
    numa = set(verdict.numa_nodes) or set(machine.numa_ids)
    if isinstance(flying, Asked):
        pods, asked = flying.pods, flying
    else:
        if any(not h.containers for h in flying):  # approved by a fast verdict: not known
            return False
        pods = len(flying)
        asked = Asked.of([h for i, h in enumerate(flying) if i >= len(reach) or reach[i] is None
                          or not numa.isdisjoint(reach[i] or ())])
    if asked.unknown or asked.wide or any(
            a.memory_mask is not None and mask_count(a.memory_mask) > 1 for a in mine):
        return False
    ledger = view.ledger()
    held = [a for h in reserved if not view.lists(h) and h.uid not in ledger.pods
            for _, a in h.containers]
    if len(ledger.pods) + len(reserved) + pods + 1 > DEFAULT_MAX_PODS:
        return False
    free_set, by_numa = ledger.derived("extender-free-cpus-by-numa", lambda: _free_by_numa(
        ledger))
    taken = {c for a in held for c in a.cpus}
    free = sum(by_numa.get(n, 0) for n in numa) - sum(
        1 for c in taken if c in free_set and machine.cpus[c].numa in numa)
    if free - asked.cpus < len({c for a in mine for c in a.cpus}):
        return False
    for kind in {k for a in mine for k in a.memory}:
        want = sum(b for a in mine for b in a.memory.get(kind, {}).values())
        want += asked.memory.get(kind, 0)
        used = sum(b for a in held for n, b in a.memory.get(kind, {}).items() if n in numa)
        if sum(ledger.free_memory(n, kind) for n in numa) - used < want:
            return False
    for res in {r for a in mine for r in a.devices}:
        want = len({i for a in mine for i in a.devices.get(res, ())})
        want += asked.devices.get(res, 0)
        gone = {i for a in held for i in a.devices.get(res, ())}
        near = {d.id for d in machine.devices_of(res)
                if d.numa_node is None or d.numa_node in numa}
        if len((set(ledger.free_devices(res)) & near) - gone) < want:
            return False
    return True


def _free_by_numa(ledger: Ledger) -> tuple[frozenset[int], dict[int, int]]:
    free = frozenset(ledger.free_cpus())
    by_numa: dict[int, int] = {}
    for c in free:
        n = ledger.machine.cpus[c].numa
        by_numa[n] = by_numa.get(n, 0) + 1
    return free, by_numa


class InFlightChecks:
    """The decider's reasoning about pods in flight (a mixin of
    :class:`~.decide.Decider`, which gives the decisions it reads)."""

    views: dict[str, NodeView]
    # pods in flight that surely leave room are not decided way by way (:func:`room_left`);
    # False: every way is (the benchmarks' baseline, the tests' reference)
    room_check = True

    # ------------------------------------------------------------ given by the decider

    def _decide(self, pod: Mapping[str, Any], node: str, reservations: Sequence[HeldPod],
                shape: PodShape | None) -> Verdict:
        raise NotImplementedError

    def _claims(self, pod: Mapping[str, Any], node: str, view: NodeView | None
                ) -> tuple[list[ClaimAsk], PodChoices] | None:
        raise NotImplementedError

    def _key(self, view: NodeView, reservations: Sequence[HeldPod], shape: PodShape,
             eff: EffectivePolicy) -> tuple[Any, ...]:
        raise NotImplementedError

    def _choice(self, pod: Mapping[str, Any], view: NodeView, reservations: Sequence[HeldPod],
                shape: PodShape, eff: EffectivePolicy, head: tuple[Any, ...],
                asks: list[ClaimAsk], choices: PodChoices,
                choice: Mapping[tuple[str, str], Placement]) -> Verdict:
        raise NotImplementedError

    # ------------------------------------------------------------ pods in flight

    def _in_flight(self, pod: Mapping[str, Any], view: NodeView,
                   reservations: Sequence[HeldPod], shape: PodShape | None,
                   in_flight: Sequence[tuple[Mapping[str, Any], HeldPod]],
                   defer: bool,
                   verdict: Verdict) -> Verdict:
        """``verdict`` (an admission on ``view``'s node holding ``reservations``) with
        the pods ``in_flight`` there counted (see the module docstring)."""
        node = view.name
        extra = [(p, h) for p, h in in_flight if not view.lists(h)]
        if not extra:
            return verdict
        shape = shape if shape is not None else pod_shape(pod)
        eff = policy_of(pod, view)
        holds = [h for _, h in extra]
        ways = self._each_choice(pod, view, reservations, shape, eff, verdict)
        # the second look (where the pods in flight land, a decision each) only where the
        # node is decided now: a deferred node gets it when Decider.filter decides it
        for settle in ((False,) if defer else (False, True)) if self.room_check else ():
            reach = self._reach(view, reservations, extra, settle)
            if reach is not None and all(
                    room_left(view, reservations, holds, v, shape, eff.resolved, reach)
                    for v in ways):
                return verdict
        if defer:  # Decider.filter decides it only if too few other nodes pass
            return Verdict(node, False, IN_FLIGHT_REASON, DEFERRED_MESSAGE, MIN_SCORE,
                           policy=eff, note=DEFERRED)
        branches, every = self._branches(node, reservations, [p for p, _ in extra])
        if not every and eff.name in HARD:
            return Verdict(node, False, IN_FLIGHT_REASON, (
                f"numalign: pods in flight to this node with claims not allocated yet may "
                f"land in more than {MAX_BRANCHES} ways; policy {eff.name} is checked "
                f"against every one, so this node waits until they are bound"), MIN_SCORE,
                policy=eff)
        first: Verdict | None = None
        for held in branches:
            v = self._decide(pod, node, held, shape)
            if not v.fits:
                return v
            first = first or v
        assert first is not None  # there is always one branch
        return first

    def _reach(self, view: NodeView, reservations: Sequence[HeldPod],
               extra: Sequence[tuple[Mapping[str, Any], HeldPod]], settle: bool = False
               ) -> list[frozenset[int] | None] | None:
        """Per pod of ``extra`` (in flight to ``view``'s node), the NUMA nodes it can take
        anything on there (None: any), for :func:`room_left`; None when some pod may
        take more than its hold says (then the ways they may land are decided).

        A pod with claims lands with the devices the allocator picks, not those its
        hold was decided with. Under ``single-numa-node`` and ``restricted`` the merged
        hint lies inside the NUMA nodes of its devices (the devices' preferred hints are
        the narrowest masks holding them; a choice whose devices are wider than that is
        refused), so it reaches only the NUMA nodes of its choices' devices (any, where
        a device's NUMA node is unknown). Under ``best-effort`` and ``none`` another
        choice may put its memory across NUMA nodes (the memory manager then groups
        them, and a later pod's one-node memory hint there fails). So each of its
        choices is decided on the node as it is, and must stand with all the other
        pods in flight landing first, its memory on one NUMA node.

        Without ``settle`` (the first, cheaper look) a pod under a hard policy reaches
        any NUMA node. With it, one with claims reaches those of its choices' devices,
        and one without claims only the NUMA nodes the node admits it on now, where that
        stands with the others landing first (:func:`room_left`); else any, and under
        ``best-effort`` or ``none`` (which may then spread its memory across NUMA nodes)
        the ways are decided."""
        total: Asked | None = None  # each pod's others: the total less its own
        out: list[frozenset[int] | None] = []
        for p, h in extra:
            claims = uses_claims(p)
            if not settle and (not claims or policy_of(p, view).name in HARD):
                out.append(None)  # its memory stays on as many NUMA nodes as its hold's
                continue
            if total is None:
                total = Asked.of([h for _, h in extra])
            others = total.less(_asked_by(h))
            if not claims:
                out.append(self._settled(p, view, reservations, others))
                if out[-1] is None and policy_of(p, view).name not in HARD:
                    return None
                continue
            eff = policy_of(p, view)
            ctx = self._claims(p, view.name, view)
            shape = pod_shape(p)
            if ctx is None or shape.model is None:
                return None
            asks, choices = ctx
            head = self._key(view, reservations, shape, eff)
            reach: set[int] | None = set()
            for c in choices.choices:
                v = self._choice(p, view, reservations, shape, eff, head, asks, choices, c)
                if not v.fits or any(a.memory_mask is not None and mask_count(a.memory_mask) > 1
                                     for _, a in v.containers):
                    return None
                if not room_left(view, reservations, others, v, shape, eff.resolved):
                    return None
                if reach is not None and eff.name in HARD and all(
                        not unknown and numa for numa, unknown, _ in c.values()):
                    reach |= {n for numa, _, _ in c.values() for g in numa for n in g}
                else:
                    reach = None
            out.append(None if reach is None else frozenset(reach))
        return out

    def _settled(self, pod: Mapping[str, Any], view: NodeView, reservations: Sequence[HeldPod],
                 others: Asked) -> frozenset[int] | None:
        """The NUMA nodes ``pod`` (in flight, without claims) takes anything on when
        admitted on ``view``'s node whichever of ``others`` land first (None: not known)."""
        shape = pod_shape(pod)
        if shape.model is None:
            return None
        v = self._decide(pod, view.name, reservations, shape)
        if not v.fits or not v.covered or not v.numa_nodes:
            return None
        eff = policy_of(pod, view)
        if not room_left(view, reservations, others, v, shape, eff.resolved):
            return None
        return frozenset(v.numa_nodes)

    def _each_choice(self, pod: Mapping[str, Any], view: NodeView,
                     reservations: Sequence[HeldPod], shape: PodShape, eff: EffectivePolicy,
                     verdict: Verdict) -> list[Verdict]:
        """The verdicts that must stay admitted for ``verdict`` (an admission) to stand:
        itself; for a pod with claims under ``single-numa-node`` or ``restricted``, that
        of every device choice (the allocator may pick any: :mod:`.dradecide`), each as
        the decision cached it."""
        ctx = self._claims(pod, view.name, view) if eff.name in HARD else None
        if ctx is None or len(ctx[1].choices) < 2:
            return [verdict]
        asks, choices = ctx
        head = self._key(view, reservations, shape, eff)
        return [self._choice(pod, view, reservations, shape, eff, head, asks, choices, c)
                for c in choices.choices]

    def _branches(self, node: str, reservations: Sequence[HeldPod],
                  flying: Sequence[Mapping[str, Any]]) -> tuple[list[list[HeldPod]], bool]:
        """What ``node`` may hold once the pods ``flying`` are admitted there first, in
        order, after ``reservations``: one list per way they may land. A pod with
        claims not allocated yet lands as the devices the allocator picks for it, which
        the extender cannot know: each of its device choices is a way (the kubelet then
        puts its CPUs and memory next to *those* devices), and so is its landing on
        another node (whether it is here changes where the others put their CPUs and
        memory: a best-effort one spreading its memory over two NUMA nodes here groups
        them, and a later pod's one-node memory hint there fails). At most
        :data:`MAX_BRANCHES` ways are kept (the first ones, the narrowest choices);
        the flag says whether that is every one."""
        branches: list[list[HeldPod]] = [list(reservations)]
        every = True
        for p in flying:
            grown: dict[Hashable, list[HeldPod]] = {}
            for held in branches:
                for h in (*self._holds(p, node, held), *((None,) if uses_claims(p) else ())):
                    way = [*held, h] if h is not None else held
                    grown.setdefault(held_key(way), way)
            every = every and len(grown) <= MAX_BRANCHES
            branches = list(grown.values())[:MAX_BRANCHES]
        return branches, every

    def _holds(self, pod: Mapping[str, Any], node: str,
               reservations: Sequence[HeldPod]) -> list[HeldPod | None]:
        """What ``pod`` may hold on ``node`` once admitted after ``reservations``: one
        hold (None: nothing, or refused), or, for a pod with claims the allocator has
        not allocated yet, one per device choice it has there (each as the node admits
        the pod with those devices)."""
        view = self.views.get(node)
        ctx = self._claims(pod, node, view)
        if view is None or view.machine is None or ctx is None or len(ctx[1].choices) < 2:
            return [self._decide(pod, node, reservations, None).held_by(pod)]
        shape = pod_shape(pod)
        eff = policy_of(pod, view)
        head = self._key(view, reservations, shape, eff)
        return [self._choice(pod, view, reservations, shape, eff, head, *ctx, c).held_by(pod)
                for c in sorted(ctx[1].choices, key=spread)]
