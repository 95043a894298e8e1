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

import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from numalign.api.admission import INVALID_GPU_REASON, InvalidGpuRequest, admit_resolved
from numalign.api.draasks import ClaimAsk, Placement, PodChoices
from numalign.api.draclaims import uses_claims
from numalign.api.effective import EffectivePolicy, NodeKind, effective_policy
from numalign.api.names import (
    ANN_GPUS,
    IN_FLIGHT_REASON,
    REJECT_REASON,
    REJECTED_PREFIX,
    TOPOLOGY_MESSAGE,
)
from numalign.api.nodestatus import HeldPod
from numalign.api.reads import ObjectRead
from numalign.api.resolved import Resolved
from numalign.topology.admit import UNEXPECTED_REASON, ProviderKind
from numalign.topology.errors import TopologyError
from numalign.topology.hints import mask_count
from numalign.topology.ledger import Ledger
from numalign.topology.machine import Machine
from numalign.topology.managers.dra import DraDevices
from numalign.topology.pod import pod_from_dict
from numalign.topology.resourcefit import DEFAULT_MAX_PODS

from .dra import DraCatalog
from .dradecide import HARD, decide_claims, spread
from .feasible import FastVerdicts, fast_filter, node_free
from .score import MAX_SCORE, MIN_SCORE, NEUTRAL_SCORE, SCORE_WEIGHTS, pod_numa, score_admission
from .verdict import CANDIDATE_UID, OUT_OF_TIME, PodShape, Verdict
from .view import EntryReader, KeptByIdentity, NodeView, held_key

__all__ = [  # what the extender's server, explain and the benchmarks use
    "CANDIDATE_UID", "MAX_SCORE", "MIN_SCORE", "NEUTRAL_SCORE", "SCORE_WEIGHTS", "Decider",
    "NodeView", "PodShape", "Verdict", "decide", "held_key", "pod_shape",
    "room_left", "score_admission",
]

JSON = dict[str, Any]
log = logging.getLogger("numalign.extender")


UNREADABLE_POD_REASON = "InvalidPod"
# the ways pods in flight may land on a node, each checked (Decider._branches)
MAX_BRANCHES = 16
KEPT_ASKS = 16  # pods whose claims are kept read (Decider._claim_asks)



# ---------------------------------------------------------------- the pod


def pod_shape(pod: Mapping[str, Any]) -> PodShape:
    """The pod's shape (never raises: an unreadable pod gives ``model`` None); kept for
    the last pod objects asked (a pod in flight is decided again on many nodes)."""
    return _shapes(pod)


def _pod_shape(pod: Mapping[str, Any]) -> PodShape:
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    ann = meta.get("annotations")
    gpus = ann.get(ANN_GPUS) if isinstance(ann, Mapping) else None
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    spec = spec if isinstance(spec, Mapping) else {}

    def reduced(cs: Any) -> Any:
        if not isinstance(cs, list):
            return cs
        return [{k: c.get(k) for k in ("name", "resources", "restartPolicy") if k in c}
                if isinstance(c, Mapping) else c for c in cs]

    doc: JSON = {"metadata": {"name": "candidate", "uid": CANDIDATE_UID,
                              "annotations": {} if gpus is None else {ANN_GPUS: gpus}},
                 "spec": {"containers": reduced(spec.get("containers")),
                          "initContainers": reduced(spec.get("initContainers") or [])}}
    # a digest, not the text: verdicts are cached by it, and what a cached verdict keeps
    # must not grow with the pod
    key = hashlib.blake2b(json.dumps(doc, sort_keys=True, default=str).encode(),
                          digest_size=16).digest()
    try:
        return PodShape(key, pod_from_dict(doc))
    except TopologyError as e:
        return PodShape(key, None, str(e))


_shapes = KeptByIdentity[Mapping[str, Any], PodShape](_pod_shape, 1024)


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


# ---------------------------------------------------------------- room for more


def room_left(view: NodeView, reserved: Sequence[HeldPod], flying: Sequence[HeldPod],
              verdict: Verdict, shape: PodShape, resolved: Resolved) -> bool:
    """Whether the pod ``verdict`` admitted on ``view`` (holding ``reserved``) is surely
    admitted the same with the pods ``flying`` held too, wherever they land: on the NUMA
    nodes of its verdict, what the node and ``reserved`` take, less all that ``flying``
    asks for, leave as many CPUs, as much memory of each kind and as many devices of each
    resource as the pod took. Then its NUMA nodes stay a valid hint of the same width (the
    kubelet prefers by width over all CPUs, not free ones) and the best one, the managers
    allocate inside them and the pod count fits. A sufficient condition only: False
    (decide again) near capacity, and for policy options, GPU group requests, containers
    aligned one by one, memory spanning NUMA nodes."""
    machine, model = view.machine, shape.model
    if not verdict.room_by_counts:  # GPU groups, a kind placed by more than counts
        return False
    if machine is None or model is None or resolved.options.given or ANN_GPUS in model.annotations:
        return False
    if any(not h.containers for h in flying):  # approved by a fast verdict: not known
        return False
    mine = [a for _, a in verdict.containers]
    if resolved.scope != "pod" and sum(1 for a in mine if a.cpus or a.memory or a.devices) > 1:
        return False
    ledger = view.ledger()
    held = [a for h in reserved if not view.lists(h) and h.uid not in ledger.pods
            for _, a in h.containers]
    asked = [a for h in flying for _, a in h.containers]
    if any(a.memory_mask is not None and mask_count(a.memory_mask) > 1 for a in mine + asked):
        return False
    if len(ledger.pods) + len(reserved) + len(flying) + 1 > DEFAULT_MAX_PODS:
        return False
    numa = set(verdict.numa_nodes) or set(machine.numa_ids)
    free_set, by_numa = ledger.derived("extender-free-cpus-by-numa", lambda: _free_by_numa(
        ledger))
    taken = {c for a in held for c in a.cpus}
    free = sum(by_numa.get(n, 0) for n in numa) - sum(
        1 for c in taken if c in free_set and machine.cpus[c].numa in numa)
    if free - sum(len(a.cpus) for a in asked) < len({c for a in mine for c in a.cpus}):
        return False
    for kind in {k for a in mine for k in a.memory}:
        want = sum(b for a in mine + asked for b in a.memory.get(kind, {}).values())
        used = sum(b for a in held for n, b in a.memory.get(kind, {}).items() if n in numa)
        if sum(ledger.free_memory(n, kind) for n in numa) - used < want:
            return False
    for res in {r for a in mine for r in a.devices}:
        want = len({i for a in mine for i in a.devices.get(res, ())})
        want += sum(len(a.devices.get(res, ())) for a in asked)
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



class Decider:
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
        return self._verdict(pod, node, reservations, shape, in_flight, None)

    def _verdict(self, pod: Mapping[str, Any], node: str, reservations: Sequence[HeldPod],
                 shape: PodShape | None, in_flight: Sequence[tuple[Mapping[str, Any], HeldPod]],
                 memo: dict[str, EffectivePolicy] | None) -> Verdict:
        verdict = self._decide(pod, node, reservations, shape, memo)
        view = self.views.get(node)
        if view is None or not verdict.fits or not verdict.covered:
            return verdict
        extra = [(p, h) for p, h in in_flight if not view.lists(h)]
        if not extra:
            return verdict
        shape = shape if shape is not None else pod_shape(pod)
        eff = self._effective(pod, view, memo)
        if room_left(view, reservations, [h for _, h in extra], verdict, shape, eff.resolved):
            return verdict
        branches, every = self._branches(node, reservations, [p for p, _ in extra])
        if not every and eff.name in HARD:
            return Verdict(node, False, IN_FLIGHT_REASON, (
                f"numalign: pods in flight to this node with claims not allocated yet may "
                f"land in more than {MAX_BRANCHES} ways; policy {eff.name} is checked "
                f"against every one, so this node waits until they are bound"), MIN_SCORE,
                policy=eff)
        first: Verdict | None = None
        for held in branches:
            v = self._decide(pod, node, held, shape, memo)
            if not v.fits:
                return v
            first = first or v
        assert first is not None  # there is always one branch
        return first

    def _branches(self, node: str, reservations: Sequence[HeldPod],
                  flying: Sequence[Mapping[str, Any]]) -> tuple[list[list[HeldPod]], bool]:
        """What ``node`` may hold once the pods ``flying`` are admitted there first, in
        order, after ``reservations``: one list per way they may land. A pod with
        claims not allocated yet lands as the devices the allocator picks for it, which
        the extender cannot know: each of its device choices is a way (the kubelet then
        puts its CPUs and memory next to *those* devices). At most
        :data:`MAX_BRANCHES` ways are kept (the first ones, the narrowest choices);
        the flag says whether that is every one."""
        branches: list[list[HeldPod]] = [list(reservations)]
        every = True
        for p in flying:
            grown: dict[Hashable, list[HeldPod]] = {}
            for held in branches:
                for h in self._holds(p, node, held):
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
            return [self._decide(pod, node, reservations, None, None).held_by(pod)]
        shape = pod_shape(pod)
        eff = effective_policy(pod, view.policy)
        head = self._key(view, reservations, shape, eff)
        return [self._choice(pod, view, reservations, shape, eff, head, *ctx, c).held_by(pod)
                for c in sorted(ctx[1].choices, key=spread)]

    def _claims(self, pod: Mapping[str, Any], node: str, view: NodeView | None
                ) -> tuple[list[ClaimAsk], PodChoices] | None:
        """The pod's claims and the device choices they have on ``node`` (None: the pod
        has no claims, or they are not decided here)."""
        if (self.dra is None or not self.dra.ready or not uses_claims(pod) or view is None
                or view.machine is None):
            return None
        asks = self._claim_asks(pod)
        return asks[0], self.dra.choices(pod, node, view.machine.numa_ids, asks)

    @staticmethod
    def _key(view: NodeView, reservations: Sequence[HeldPod], shape: PodShape,
             eff: EffectivePolicy) -> tuple[Any, ...]:
        """A verdict's cache key: (machine, what the node holds, pod shape, policy, node
        kind). What the node holds, published or reserved, is one key: a node publishing
        a pod the extender had reserved as the node allocated it stays in the same
        state (its verdicts stay cached)."""
        extra = [r for r in reservations if not view.lists(r)]
        state = view.held_key if not extra else tuple(sorted(
            (*view.held_key, *held_key(extra))))
        return (view.machine_key, state, shape.key, eff.key, view.policy.kind)

    def _choice(self, pod: Mapping[str, Any], view: NodeView, reservations: Sequence[HeldPod],
                shape: PodShape, eff: EffectivePolicy, head: tuple[Any, ...],
                asks: list[ClaimAsk], choices: PodChoices,
                choice: Mapping[tuple[str, str], Placement]) -> Verdict:
        """The verdict with one device choice (cached as any: nodes alike share it)."""
        kind = DraDevices(choices.devices(pod, asks, choice).requests())
        return self._cached((*head, "dra-choice", choices.choice_key(choice)), view.machine_key,
                            lambda: decide(pod, view, reservations, shape=shape, eff=eff,
                                           devices=[kind]))

    @staticmethod
    def _effective(pod: Mapping[str, Any], view: NodeView,
                   memo: dict[str, EffectivePolicy] | None) -> EffectivePolicy:
        """effective_policy, once per node policy for one pod (``memo``)."""
        if memo is None:
            return effective_policy(pod, view.policy)
        eff = memo.get(view.policy_id)
        if eff is None:
            eff = memo[view.policy_id] = effective_policy(pod, view.policy)
        return eff

    def _decide(self, pod: Mapping[str, Any], node: str, reservations: Sequence[HeldPod],
                shape: PodShape | None, memo: dict[str, EffectivePolicy] | None) -> Verdict:
        view = self.views.get(node)
        if view is None or view.machine is None:
            return decide(pod, view, reservations, name=node)
        shape = shape if shape is not None else pod_shape(pod)
        eff = self._effective(pod, view, memo)
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
            return hit if hit.node == node else replace(hit, node=node)
        self.misses += 1
        if claims is not None:
            asks, choices = claims
            verdict = decide_claims(view, eff, choices, lambda c: self._choice(
                pod, view, reservations, shape, eff, head, asks, choices, c))
        else:
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
               complete: bool = True) -> list[Verdict]:
        """A verdict for each of ``nodes``, in order (reservations and in-flight pods
        by node, as :meth:`decide` takes them). ``budget``: seconds to spend; the nodes
        not decided by then pass undecided (``covered`` False: fail open, as the
        scheduler does with an extender that does not answer in time). ``complete``
        False: pass or refuse only, exact, nodes alike sharing one decision
        (:mod:`.feasible`; an admission may come without allocation or score)."""
        shape = pod_shape(pod)
        held = reservations or {}
        flying = in_flight or {}
        memo: dict[str, EffectivePolicy] = {}
        end = None if budget is None else clock() + budget
        # a pod with DRA claims is decided per device choice: never by group
        if not complete and not (self.dra is not None and uses_claims(pod)):
            return fast_filter(
                self.views, self.fast, list(nodes), shape, held, flying,
                lambda view: self._effective(pod, view, memo),
                lambda n: self._verdict(pod, n, held.get(n, ()), shape, flying.get(n, ()),
                                        memo),
                lambda n: None if end is None or clock() <= end else Verdict(
                    n, True, covered=False, note=OUT_OF_TIME))
        out: list[Verdict] = []
        for n in nodes:
            if end is not None and clock() > end:
                out.append(Verdict(n, True, covered=False, note=OUT_OF_TIME))
                continue
            out.append(self._verdict(pod, n, held.get(n, ()), shape, flying.get(n, ()), memo))
        return out

    def hold(self, pod: Mapping[str, Any], node: str,
             reservations: Sequence[HeldPod] = ()) -> HeldPod | None:
        """What ``pod`` would hold on ``node`` (to reserve it once the pod is bound
        there), or None when the node is not covered or would refuse it."""
        return self.decide(pod, node, reservations).held_by(pod)
