"""The scheduler extender's decision: would this node admit this pod, and how well.

Pure: NodeTopology objects and pods in (plain mappings), verdicts out; no HTTP, no API
server. A node is decided exactly as that node will decide: the policy is
:func:`numalign.api.effective.effective_policy` (the pod's own resolved policy on
emulated and numalign-managed nodes, the kubelet's on a kubelet-managed one), the
machine and what it holds come from the NodeTopology status (as ``numalign explain``
reads them: :mod:`numalign.api.nodestatus`, the kubelet's reserved CPUs held), plus the
extender's in-flight reservations, and the engine's admission
(:func:`numalign.api.admission.admit_resolved`, as the agent runs it) decides.

- :class:`~.view.NodeView` (:mod:`.view`): one node as its NodeTopology describes it
  (built once per ``resourceVersion``).
- :func:`decide`: a pod on one view (plus reservations) -> :class:`Verdict`.
- :class:`Decider`: the views of a fleet, kept per ``resourceVersion``, with a cache of
  verdicts: nodes in the same state (same machine, same allocations held, same
  reservations) decide a pod of the same shape under the same policy the same way, so a
  filter over many alike nodes costs one engine run per distinct state.

A node without a usable NodeTopology (none, or not published yet) passes: fail open
(:attr:`Verdict.covered` False). The score (0-10, :func:`score_admission`) ranks fewest
NUMA nodes first, then their distance, then GPU island fit, then the room left whole.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from numalign.api.admission import INVALID_GPU_REASON, InvalidGpuRequest, admit_resolved
from numalign.api.draasks import ClaimAsk, Placement, PodChoices
from numalign.api.draclaims import uses_claims
from numalign.api.effective import EffectivePolicy, NodeKind, effective_policy
from numalign.api.names import (
    REJECT_REASON,
    REJECTED_PREFIX,
    TOPOLOGY_MESSAGE,
)
from numalign.api.nodestatus import HeldPod
from numalign.api.reads import ObjectRead
from numalign.topology.admit import UNEXPECTED_REASON, ProviderKind
from numalign.topology.errors import TopologyError
from numalign.topology.machine import Machine
from numalign.topology.managers.dra import DraDevices

from .dra import DraCatalog
from .dradecide import decide_claims
from .feasible import FastVerdicts, fast_filter, node_free
from .inflight import (
    DEFERRED,
    ENOUGH_PASSING,
    MAX_BRANCHES,
    MAX_DEFERRED_NODES,
    MAX_DEFERRED_RUNS,
    MAX_LONE_RUNS,
    InFlightChecks,
    room_left,
)
from .podshape import pod_shape, policy_of
from .score import MAX_SCORE, MIN_SCORE, NEUTRAL_SCORE, SCORE_WEIGHTS, pod_numa, score_admission
from .verdict import CANDIDATE_UID, OUT_OF_TIME, PodShape, Verdict
from .view import EntryReader, NodeView, held_key

__all__ = [  # what the extender's server, explain and the benchmarks use
    "CANDIDATE_UID", "ENOUGH_PASSING", "MAX_BRANCHES", "MAX_DEFERRED_NODES",
    "MAX_DEFERRED_RUNS", "MAX_LONE_RUNS", "MAX_SCORE", "MIN_SCORE", "NEUTRAL_SCORE",
    "SCORE_WEIGHTS", "Decider", "NodeView", "PodShape", "Verdict", "decide", "held_key",
    "pod_shape", "room_left", "score_admission",
]

JSON = dict[str, Any]
log = logging.getLogger("numalign.extender")


UNREADABLE_POD_REASON = "InvalidPod"
KEPT_ASKS = 16  # pods whose claims are kept read (Decider._claim_asks)
KEPT_CHOICES = 20_000  # (pod, node) device choices kept (Decider._claims)




# ---------------------------------------------------------------- the decision


def decide(pod: Mapping[str, Any], view: NodeView | None,
           reservations: Sequence[HeldPod] = (), *, shape: PodShape | None = None,
           name: str = "", eff: EffectivePolicy | None = None,
           devices: Sequence[ProviderKind] = ()) -> Verdict:
    """Would ``view``'s node admit ``pod``, holding ``reservations`` besides what it
    publishes? ``view`` None (no NodeTopology) or unusable: the node passes (fail
    open). ``eff``: the pod's effective policy there, when the caller has it;
    ``devices``: kinds of devices the pod gets from elsewhere (its claims' devices,
    :mod:`.dradecide`). Never raises."""
    node = view.name if view is not None else name
    if view is None or view.machine is None:
        why = "no NodeTopology" if view is None else view.problem
        return Verdict(node, True, covered=False, note=f"not decided by numalign: {why}")
    eff = eff if eff is not None else effective_policy(pod, view.policy)
    shape = shape if shape is not None else pod_shape(pod)
    if shape.model is None:
        # The API server took it, the engine cannot read it: leave it to the node.
        return Verdict(node, True, policy=eff, covered=False,
                       note=f"not decided by numalign: the pod cannot be read: {shape.problem}")
    ledger = view.ledger_with(reservations)
    try:
        result = admit_resolved(view.machine, ledger, shape.model, eff, devices=devices,
                                commit=False)
    except InvalidGpuRequest as e:
        return Verdict(node, False, INVALID_GPU_REASON, f"{REJECTED_PREFIX}{e}", MIN_SCORE,
                       policy=eff, resolvable=False)
    except TopologyError as e:
        refusal = node_refusal(eff.node_kind, e)
        if refusal is None:  # input the node itself would not decide: leave it to the node
            return Verdict(node, True, policy=eff, covered=False,
                           note=f"not decided by numalign: {e}")
        return Verdict(node, False, *refusal, MIN_SCORE, policy=eff, resolvable=False)
    if not result.admit:
        return Verdict(node, False, result.reason or REJECT_REASON,
                       result.message or TOPOLOGY_MESSAGE, MIN_SCORE, policy=eff)
    # what the pod holds as the node keeps it (an app container reusing its init
    # container's CPUs holds them, the init container no longer)
    rec = result.work.pods.get(CANDIDATE_UID) if result.work is not None else None
    return Verdict(node, True, score=score_admission(view.machine, ledger, result),
                   numa_nodes=tuple(pod_numa(result)), policy=eff,
                   containers=() if rec is None else tuple(rec.containers.items()),
                   room_by_counts=result.room_by_counts)


def node_refusal(kind: NodeKind, error: TopologyError) -> tuple[str, str] | None:
    """How a node of ``kind`` refuses a pod whose admission raised ``error`` (a policy the
    engine will not build there, e.g. ``maxAllowableNumaNodes`` below the machine's NUMA
    node count): (reason, message), as the emulating agent (``UnexpectedAdmissionError``)
    and the NRI placer (``TopologyAffinityError``) write it. None on a kubelet-managed
    node: its kubelet decides by its own policy, which numalign does not build."""
    if kind is NodeKind.EMULATED:
        return UNEXPECTED_REASON, str(error)
    if kind is NodeKind.NUMALIGN_MANAGED:
        return REJECT_REASON, str(error)
    return None


# ---------------------------------------------------------------- the fleet

_OWN = "\x00own"  # a cached verdict's node: decided per node (names_holder)


def names_holder(verdict: Verdict, view: NodeView, reservations: Sequence[HeldPod]) -> bool:
    """Whether ``verdict``'s refusal names a pod the node holds (a manager's message
    naming the holder of a CPU or device): nodes in the same state hold other pods, so
    such a verdict is kept for its node alone."""
    text = verdict.message
    if verdict.fits or not text:
        return False
    return any(h.uid in text or f"{h.namespace}/{h.name}" in text
               for h in (*view.held, *reservations))



class Decider(InFlightChecks):
    """The views of a fleet and a cache of verdicts.

    ``update(nt)`` takes a NodeTopology object (a new ``resourceVersion`` rebuilds that
    node's view; the same one is a no-op), ``remove(name)`` forgets a node,
    ``release(node, uid)`` drops a pod that left before the node says so,
    ``decide(pod, node, reservations)`` / ``filter(pod, nodes, reservations)`` give
    verdicts. Verdicts are cached by (machine, what the node holds, reservations, pod
    shape, effective policy), at most ``max_cached`` of them (least recently used go);
    what a node holds counts as one multiset, published and reserved alike."""

    def __init__(self, max_cached: int = 50_000, dra: DraCatalog | None = None) -> None:
        self.views: dict[str, NodeView] = {}
        # the cluster's DRA objects: pods with claims are decided with every device
        # choice the allocator has on the node (:mod:`.dradecide`); None: as without
        self.dra = dra
        # the claims of the last pods asked (a filter reads them once for all its nodes;
        # the pods in flight there are read again on each): id -> (pod, changes, asks)
        self._asks: OrderedDict[int, tuple[Mapping[str, Any], int,
                                           tuple[list[ClaimAsk], list[str]]]] = OrderedDict()
        # a pod's device choices on a node, while the DRA objects stand (Decider._claims)
        self._choices: dict[tuple[int, str, str], tuple[Mapping[str, Any], PodChoices]] = {}
        self._choices_at = -1
        self.published: dict[str, NodeView] = {}  # as the NodeTopology says, before release()
        self.released: dict[str, set[str]] = {}  # node -> uids gone but still published
        # machines by the digest of what describes them, shared by the nodes of one
        # machine while any of them is published (the last one gone takes its machine,
        # and the verdicts cached for it, along)
        self.machines: dict[str, Machine] = {}
        self._machine_users: dict[str, int] = {}  # machine key -> nodes publishing it
        self._cached_for: dict[str, set[tuple[Any, ...]]] = {}  # machine key -> verdicts
        self.entries = EntryReader()
        self.max_cached = max_cached
        # (machine key, what the node holds, pod shape, policy, origin, node kind)
        self._cache: OrderedDict[tuple[Any, ...], Verdict] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.runs = 0  # decisions made by the engine (not found cached)
        self.fast = FastVerdicts()  # the filter's group answers (.feasible)

    def _uses(self, old: NodeView | None, new: NodeView | None) -> None:
        """A node's published view ``old`` is now ``new`` (None: none): the last node of a
        machine gone takes the machine and the verdicts cached for it along."""
        if new is not None and new.machine_key:
            self._machine_users[new.machine_key] = self._machine_users.get(
                new.machine_key, 0) + 1
        key = old.machine_key if old is not None else ""
        if not key:
            return
        left = self._machine_users[key] - 1
        if left:
            self._machine_users[key] = left
            return
        del self._machine_users[key]
        self.machines.pop(key, None)
        for k in self._cached_for.pop(key, ()):
            self._cache.pop(k, None)

    def update(self, nt: Mapping[str, Any]) -> NodeView:
        meta = ObjectRead.of(nt).metadata  # the rest is read only when it changed
        name, rv = meta.name or "", meta.resource_version or ""
        old = self.published.get(name)
        if old is not None and rv and old.resource_version == rv:
            return self.views[name]
        view = NodeView.from_nodetopology(nt, self.machines, old, self.entries)
        self.published[name] = view
        self._uses(old, view)
        gone = self.released.get(name)
        if gone:
            gone &= view.admitted  # the node published their release: nothing to do
        view = self.views[name] = view.without(gone) if gone else view
        if view.usable:
            # built now, on the watch, rather than in the next filter call (the first
            # filter over many nodes would build all their ledgers), with what the
            # filter's fast verdicts read of it
            node_free(view.ledger())
        return view

    def release(self, node: str, uid: str) -> bool:
        """``uid`` left ``node`` (deleted or finished): decide as if the node had released
        it already, until its NodeTopology stops listing it. True if that frees room."""
        view = self.published.get(node)
        if view is None or uid not in view.admitted:
            return False
        gone = self.released.setdefault(node, set())
        if uid in gone:
            return False
        gone.add(uid)
        self.views[node] = view.without(gone)
        return True

    def remove(self, name: str) -> None:
        self.views.pop(name, None)
        self.released.pop(name, None)
        self._uses(self.published.pop(name, None), None)

    def view(self, name: str) -> NodeView | None:
        return self.views.get(name)

    def decide(self, pod: Mapping[str, Any], node: str,
               reservations: Sequence[HeldPod] = (), *,
               shape: PodShape | None = None,
               in_flight: Sequence[tuple[Mapping[str, Any], HeldPod]] = ()) -> Verdict:
        """The verdict for ``pod`` on ``node`` holding ``reservations``. ``in_flight``:
        pods that may come to this node first (approved, not bound yet), each with what
        it was approved to hold there: the verdict without them where they surely leave
        room (:func:`room_left`), else decided with them admitted first, in order."""
        return self._verdict(pod, node, reservations, shape, in_flight)

    def _verdict(self, pod: Mapping[str, Any], node: str, reservations: Sequence[HeldPod],
                 shape: PodShape | None, in_flight: Sequence[tuple[Mapping[str, Any], HeldPod]],
                 defer: bool = False) -> Verdict:
        verdict = self._decide(pod, node, reservations, shape)
        view = self.views.get(node)
        if view is None or not verdict.fits or not verdict.covered:
            return verdict
        return self._in_flight(pod, view, reservations, shape, in_flight, defer,
                               verdict)

    def _claims(self, pod: Mapping[str, Any], node: str, view: NodeView | None
                ) -> tuple[list[ClaimAsk], PodChoices] | None:
        """The pod's claims and the device choices they have on ``node`` (None: the pod
        has no claims, or they are not decided here)."""
        if (self.dra is None or not self.dra.ready or not uses_claims(pod) or view is None
                or view.machine is None):
            return None
        asks = self._claim_asks(pod)
        # kept while the DRA objects stand: a pod in flight is asked again on every filter
        if self._choices_at != self.dra.changes or len(self._choices) > KEPT_CHOICES:
            self._choices.clear()
            self._choices_at = self.dra.changes
        key = (id(pod), node, view.machine_key)
        kept = self._choices.get(key)
        if kept is None or kept[0] is not pod:
            kept = self._choices[key] = (pod, self.dra.choices(pod, node, view.machine.numa_ids,
                                                               asks))
        return asks[0], kept[1]

    def _key(self, view: NodeView, reservations: Sequence[HeldPod], shape: PodShape,
             eff: EffectivePolicy) -> tuple[Any, ...]:
        """A verdict's cache key: (machine, what the node holds, pod shape, policy, node
        kind). What the node holds, published or reserved, is one key: a node publishing
        a pod the extender had reserved as the node allocated it stays in the same
        state (its verdicts stay cached)."""
        return (view.machine_key, view.state_with(reservations), shape.key, eff.key,
                view.policy.kind)

    def _choice(self, pod: Mapping[str, Any], view: NodeView, reservations: Sequence[HeldPod],
                shape: PodShape, eff: EffectivePolicy, head: tuple[Any, ...],
                asks: list[ClaimAsk], choices: PodChoices,
                choice: Mapping[tuple[str, str], Placement]) -> Verdict:
        """The verdict with one device choice (cached as any: nodes alike share it)."""
        return self._cached((*head, "dra-choice", choices.choice_key(choice)), view.machine_key,
                            lambda: decide(pod, view, reservations, shape=shape, eff=eff,
                                           devices=[DraDevices(choices.devices(
                                               pod, asks, choice).requests())]))

    def _decide(self, pod: Mapping[str, Any], node: str, reservations: Sequence[HeldPod],
                shape: PodShape | None) -> Verdict:
        view = self.views.get(node)
        if view is None or view.machine is None:
            return decide(pod, view, reservations, name=node)
        shape = shape if shape is not None else pod_shape(pod)
        eff = policy_of(pod, view)
        head = key = self._key(view, reservations, shape, eff)
        claims = None
        if self.dra is not None and uses_claims(pod):
            if not self.dra.ready:
                return Verdict(node, True, policy=eff, covered=False,
                               note="not decided by numalign: DRA objects not listed yet")
            claims = self._claims(pod, node, view)
            assert claims is not None
            key = (*key, claims[1].key())  # the claims' state and the node's devices
        hit = self._cache.get(key)
        own = hit is not None and hit.node == _OWN
        if own:  # a message naming the node's pods
            key = (*key, node)
            hit = self._cache.get(key)
        if hit is not None:
            self.hits += 1
            self._cache.move_to_end(key)
            return hit if hit.node == node else hit.moved(node, hit.policy)
        self.misses += 1
        if claims is not None:
            asks, choices = claims
            verdict = decide_claims(view, eff, choices, lambda c: self._choice(
                pod, view, reservations, shape, eff, head, asks, choices, c))
        else:
            self.runs += 1
            verdict = decide(pod, view, reservations, shape=shape, eff=eff)
        if not own and names_holder(verdict, view, reservations):
            self._store(key, view.machine_key, Verdict(_OWN, False))
            key = (*key, node)
        self._store(key, view.machine_key, verdict)
        return verdict

    def _store(self, key: tuple[Any, ...], machine_key: str, verdict: Verdict) -> None:
        self._cache[key] = verdict
        self._cached_for.setdefault(machine_key, set()).add(key)
        if len(self._cache) > self.max_cached:
            gone = self._cache.popitem(last=False)[0]
            self._cached_for.get(gone[0], set()).discard(gone)

    def _cached(self, key: tuple[Any, ...], machine_key: str,
                make: Callable[[], Verdict]) -> Verdict:
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        self.runs += 1
        verdict = make()
        self._store(key, machine_key, verdict)
        return verdict

    def _claim_asks(self, pod: Mapping[str, Any]) -> tuple[list[ClaimAsk], list[str]]:
        """The pod's claims as the DRA objects read now (kept for the last few pods
        asked, until those objects change)."""
        assert self.dra is not None
        kept = self._asks.get(id(pod))
        if kept is not None and kept[0] is pod and kept[1] == self.dra.changes:
            self._asks.move_to_end(id(pod))
            return kept[2]
        asks = self.dra.asks(pod)
        self._asks[id(pod)] = (pod, self.dra.changes, asks)
        if len(self._asks) > KEPT_ASKS:
            self._asks.popitem(last=False)
        return asks

    def filter(self, pod: Mapping[str, Any], nodes: Iterable[str],
               reservations: Mapping[str, Sequence[HeldPod]] | None = None,
               in_flight: Mapping[str, Sequence[tuple[Mapping[str, Any], HeldPod]]] | None
               = None, *, budget: float | None = None,
               clock: Callable[[], float] = time.monotonic,
               complete: bool = True, defer: bool = False) -> list[Verdict]:
        """A verdict for each of ``nodes``, in order (reservations and in-flight pods
        by node, as :meth:`decide` takes them). ``budget``: seconds to spend; the nodes
        not decided by then pass undecided (``covered`` False: fail open, as the
        scheduler does with an extender that does not answer in time). ``complete``
        False: pass or refuse only, exact, nodes alike sharing one decision
        (:mod:`.feasible`; an admission may come without allocation or score).
        ``defer``: a node where the pods in flight must be decided way by way (the
        costly part of a burst) is decided last, and refused for now
        (:data:`IN_FLIGHT_REASON`) once :data:`ENOUGH_PASSING` other nodes pass (as
        kube-scheduler itself stops looking once it has found enough feasible nodes), or
        once :data:`MAX_DEFERRED_NODES` such nodes refused the pod or the engine has run
        :data:`MAX_DEFERRED_RUNS` times for them; while no node admits the pod, until
        the engine has run :data:`MAX_LONE_RUNS` times (a pod no node admits waits in the
        scheduler's queue for seconds). A burst's filter
        stays within a bound, and such a pod is placed once those pods are bound (the
        scheduler tries it again then), never where a way could refuse it."""
        start = clock()
        out = self._filter(pod, nodes, reservations, in_flight, budget, clock, complete, defer)
        later = [i for i, v in enumerate(out) if v.note == DEFERRED]
        passing = sum(1 for v in out if v.fits)
        if not later:
            return out
        # decided one by one until enough nodes pass, or the budget is spent: so many
        # nodes refusing the pod, or so many engine runs
        runs, refused = self.runs, 0
        for i in later:
            spent = self.runs - runs
            if passing >= ENOUGH_PASSING or spent >= MAX_LONE_RUNS or (passing and (
                    refused >= MAX_DEFERRED_NODES or spent >= MAX_DEFERRED_RUNS)):
                break
            left = None if budget is None else max(0.0, budget - (clock() - start))
            v = out[i] = self._filter(pod, [out[i].node], reservations, in_flight, left,
                                      clock, complete, False)[0]
            passing += v.fits
            refused += not v.fits
        spent_on = (f"{MAX_DEFERRED_NODES} nodes refusing the pod, {MAX_DEFERRED_RUNS} "
                    f"decisions" if passing else
                    f"{MAX_LONE_RUNS} decisions while no node admitted it")
        why = (f"{passing} other nodes admit it" if passing >= ENOUGH_PASSING else
               f"numalign decided the ways of the pods in flight to other nodes up to its "
               f"budget for one filter ({spent_on})")
        return [replace(v, message=f"{v.message} ({why})", note=None)
                if v.note == DEFERRED else v for v in out]

    def _filter(self, pod: Mapping[str, Any], nodes: Iterable[str],
                reservations: Mapping[str, Sequence[HeldPod]] | None,
                in_flight: Mapping[str, Sequence[tuple[Mapping[str, Any], HeldPod]]] | None,
                budget: float | None, clock: Callable[[], float], complete: bool,
                defer: bool) -> list[Verdict]:
        shape = pod_shape(pod)
        held = reservations or {}
        flying = in_flight or {}
        end = None if budget is None else clock() + budget
        # a pod with DRA claims is decided per device choice: never by group
        if not complete and not (self.dra is not None and uses_claims(pod)):
            return fast_filter(
                self.views, self.fast, list(nodes), shape, held, flying,
                lambda view: policy_of(pod, view),
                lambda n: self._verdict(pod, n, held.get(n, ()), shape, flying.get(n, ()),
                                        defer),
                lambda n: None if end is None or clock() <= end else Verdict(
                    n, True, covered=False, note=OUT_OF_TIME))
        out: list[Verdict] = []
        for n in nodes:
            if end is not None and clock() > end:
                out.append(Verdict(n, True, covered=False, note=OUT_OF_TIME))
                continue
            out.append(self._verdict(pod, n, held.get(n, ()), shape, flying.get(n, ()),
                                     defer))
        return out

    def hold(self, pod: Mapping[str, Any], node: str,
             reservations: Sequence[HeldPod] = ()) -> HeldPod | None:
        """What ``pod`` would hold on ``node`` (to reserve it once the pod is bound
        there), or None when the node is not covered or would refuse it."""
        return self.decide(pod, node, reservations).held_by(pod)
