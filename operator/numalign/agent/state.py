"""One emulated node's allocation state (pure: no I/O).

The state is what the kubelet's resource managers hold: the engine's ledger, and for
each admitted pod what it got. It decides pods (admit / reject), releases them, and
rebuilds itself after a restart from what the agent published (NodeTopology status) and,
for pods the status lacks, what is written on the pods (``numalign.io/allocation``, a
claim believed only when it matches the pod: :mod:`.records`). Both agent modes keep
their node here: the emulating agent and the NRI placer of a numalign-managed node
(:mod:`.nri.placer`), which holds the kubelet's reserved CPUs out of the ledger too. A real
node has one state, the agent's (``admits=False``): on a numalign-managed node the NRI placer
decides in it, so that its status, NodeResourceTopology and metrics show those decisions;
there the agent's pod watch, not the decisions, says which pods left Pending.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from numalign.api.allocation import Allocation, parse_admitted, parse_allocation
from numalign.api.dra import NodeDraDevices
from numalign.api.effective import EffectivePolicy
from numalign.api.errors import WireError
from numalign.api.names import ANN_ALLOCATION, REJECT_REASON
from numalign.api.nodestatus import reserved_holder
from numalign.api.nodetopology import UnalignedDraDevice
from numalign.api.resolved import NONE, Resolved, node_default
from numalign.topology.admit import ProviderKind
from numalign.topology.ledger import Ledger
from numalign.topology.machine import Machine

from . import engine
from .managerstats import ManagerCounts, Managers, record_admission
from .podfingerprint import PodEntry, pod_entry
from .records import claim_problem, cpus_only, known_part

log = logging.getLogger(__name__)

JSON = dict[str, Any]


@dataclass
class PlacedPod:
    namespace: str
    name: str
    uid: str
    resolved: Resolved
    allocation: Allocation
    # the Pod it was admitted as (its requests: the ledger is rebuilt from them)
    pod: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # kubelet-managed nodes: its DRA devices the kubelet left off its CPUs' NUMA nodes
    dra_unaligned: tuple[UnalignedDraDevice, ...] = ()


@dataclass
class Decision:
    admit: bool
    reason: str | None = None
    message: str | None = None
    allocation: Allocation | None = None
    resolved: Resolved = NONE


@dataclass
class RestoreReport:
    restored: list[str] = field(default_factory=list)  # uids put back in the ledger
    rejected: list[str] = field(default_factory=list)  # uids already rejected
    pending: list[JSON] = field(default_factory=list)  # pods still to decide, in order
    dropped: list[str] = field(default_factory=list)  # published pods that are gone
    conflicts: list[str] = field(default_factory=list)  # allocations taking what is held
    # uid -> why its record was not put back (conflicts included); the pod holds nothing
    refused: dict[str, str] = field(default_factory=dict)


def pod_uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def pod_key(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class NodeState:
    """Allocation state of one node. ``admits``: an emulated node, whose decisions are its
    pods' phases (the set of pods out of Pending follows them); on a real node (False) the
    kubelet writes the phases and the agent's pod watch keeps that set (:meth:`track`)."""

    def __init__(self, name: str, machine: Machine, index: int = 0, admits: bool = True,
                 reserved: Iterable[int] = ()) -> None:
        self.name = name
        self.admits = admits
        self.machine = machine
        self.index = index
        self.reserved = set(reserved)  # CPUs no pod gets (the kubelet's reservedSystemCPUs)
        self.ledger = self._fresh_ledger()
        self.admitted: dict[str, PlacedPod] = {}
        self.decided: dict[str, bool] = {}  # uid -> admitted?
        # The pods this node took out of Pending (uid -> entry): the set the
        # NodeResourceTopology's pod fingerprint covers (agent/podfingerprint.py).
        self.pods: dict[str, PodEntry] = {}
        self.rejections: dict[str, tuple[str, str]] = {}  # uid -> (reason, message)
        self.rejected_total = 0
        self.default: Resolved = NONE
        self.spec_generation: int | None = None
        self.observed_generation: int | None = None
        self.version = 0  # bumped on every change worth publishing
        self.pod_seq = 0
        # Real nodes (agent/kubelet_view.py): the kubelet's allocatable per zone (else the
        # machine's capacity), its configuration, and whether the agent can read it.
        self.zone_allocatable: dict[int, dict[str, int]] | None = None
        self.kubelet: dict[str, Any] | None = None
        self.ready = True
        self.ready_message = ""
        # A numalign-managed real node (agent/nri/managed.py): the condition NRIPlacement,
        # (placing?, reason, message); None elsewhere.
        self.placement: tuple[bool, str, str] | None = None
        # The kubelet's manager counters for the pods this state decides, per Topology
        # Manager policy (exported by agent/metrics.py), and which managers it stands for.
        self.counts: dict[str, ManagerCounts] = {}
        self.managers = Managers()
        # The node's DRA devices (agent/dra.py); None: not read (status.draDevices unset).
        self.dra: NodeDraDevices | None = None

    def _fresh_ledger(self) -> Ledger:
        ledger = engine.new_ledger(self.machine)
        if self.reserved:
            r = reserved_holder(self.reserved)
            ledger.allocate_many(r.uid, list(r.containers), pod_name=r.name,
                                 namespace=r.namespace)
        return ledger

    def reset(self) -> None:
        """Forget every decision (a fresh ledger, with the reserved CPUs): before a
        :meth:`restore` from what the runtime runs now."""
        self.ledger = self._fresh_ledger()
        self.admitted.clear()
        self.decided.clear()
        self.rejections.clear()
        self.version += 1

    def set_machine(self, machine: Machine) -> None:
        """The node's machine changed (the devices the kubelet reports): the ledger is
        rebuilt on it with every admitted pod's allocation. A pod whose devices the new
        machine lacks (their plugin not registered again yet) keeps the rest -- its CPUs
        above all, never given to another pod while it runs on them."""
        if machine == self.machine:
            return
        self.machine = machine
        self._rebuild()

    def show(self, pods: Mapping[str, PlacedPod]) -> None:
        """Hold ``pods`` as admitted as they were recorded, deciding nothing (what a
        numalign-managed node published, until its runtime's state is read): a fresh ledger
        with their allocations, as far as the machine takes them."""
        self.reset()
        self.admitted.update(pods)
        self._rebuild()

    def _rebuild(self) -> None:
        """A fresh ledger with every admitted pod's allocation."""
        machine = self.machine
        self.ledger = self._fresh_ledger()
        for uid, held in self.admitted.items():
            problem = None
            for alloc in (held.allocation, known_part(machine, held.allocation),
                          cpus_only(held.allocation)):
                problem, _ = self._commit(uid, held.pod, alloc)
                if problem is None:
                    break
            if problem is not None or alloc is not held.allocation:
                log.warning("%s: pod %s/%s keeps %s of its allocation on this machine: %s",
                            self.name, held.namespace, held.name,
                            "nothing" if problem else "part", problem or "devices it lacks")
        self.version += 1

    # -- policy pushed by the operator ------------------------------------------------

    def set_spec(self, spec: Mapping[str, Any] | None) -> bool:
        """Take the node default from ``NodeTopology.spec``; True when anything changed."""
        spec = spec or {}
        default = node_default(spec)
        gen = spec.get("policyGeneration")
        gen_i = gen if isinstance(gen, int) and not isinstance(gen, bool) else None
        changed = default != self.default or gen_i != self.observed_generation
        self.default = default
        self.spec_generation = gen_i
        self.observed_generation = gen_i
        if changed:
            self.version += 1
        return changed

    # -- decisions ---------------------------------------------------------------------

    def track(self, pod: Mapping[str, Any], phase: str | None = None) -> bool:
        """Note that ``pod`` is on this node in ``phase`` (default: its own); a Pending
        pod is not counted. True when the set of pods (or a phase) changed."""
        uid = pod_uid(pod)
        entry = pod_entry(pod, phase)
        if entry.phase == "Pending" or not uid:
            return self.untrack(uid)
        old = self.pods.get(uid)
        if old == entry:
            return False
        self.pods[uid] = entry
        self.version += 1
        return True

    def untrack(self, uid: str) -> bool:
        if self.pods.pop(uid, None) is None:
            return False
        self.version += 1
        return True

    def _follow(self, pod: Mapping[str, Any], phase: str | None = None) -> None:
        """A decision's phase, on an emulated node (on a real node the kubelet's counts)."""
        if self.admits:
            self.track(pod, phase)

    def decide(self, pod: Mapping[str, Any], policy: EffectivePolicy,
               devices: Sequence[ProviderKind] = ()) -> Decision:
        """Admit or reject ``pod`` under ``policy`` (the one
        :func:`~numalign.api.effective.effective_policy` gives it here; once: a decided pod
        gets its first answer again). ``devices``: what someone else already assigned (a
        real node's device manager)."""
        resolved = policy.resolved
        uid = pod_uid(pod)
        if uid in self.decided:
            held = self.admitted.get(uid)
            reason, message = self.rejections.get(uid, (None, None))
            return Decision(admit=self.decided[uid], reason=reason, message=message,
                            allocation=held.allocation if held else None,
                            resolved=held.resolved if held else resolved)
        counts = self.counts.setdefault(policy.name, ManagerCounts())
        start = time.perf_counter()
        try:
            result = engine.admit(self.machine, self.ledger, pod, resolved, uid, devices)
        except Exception:  # an unreadable pod: the caller refuses it
            record_admission(counts, None, None, time.perf_counter() - start)
            raise
        record_admission(counts, result.pod, result.outcome, time.perf_counter() - start,
                         self.managers)
        if not result.admit:
            return self.refuse(pod, result.reason or REJECT_REASON, result.message or "",
                               resolved)
        self.decided[uid] = True
        self._follow(pod, "Running")
        self.version += 1
        alloc = result.allocation or Allocation()
        ns, name = pod_key(pod)
        self.admitted[uid] = PlacedPod(ns, name, uid, resolved, alloc, pod)
        return Decision(True, allocation=alloc, resolved=resolved)

    def refuse(self, pod: Mapping[str, Any], reason: str, message: str,
               resolved: Resolved = NONE) -> Decision:
        """Reject ``pod`` without asking the engine (what it needs cannot be read)."""
        uid = pod_uid(pod)
        self.decided[uid] = False
        self.rejections[uid] = (reason, message)
        self._follow(pod, "Failed")
        self.version += 1
        if reason == REJECT_REASON:  # status.rejected counts TopologyAffinityErrors
            self.rejected_total += 1
        return Decision(False, reason=reason, message=message, resolved=resolved)

    def release(self, uid: str) -> bool:
        """Forget a pod (deleted, finished, or its sandbox gone); True if it held
        resources."""
        self.rejections.pop(uid, None)
        was_decided = self.decided.pop(uid, None) is not None
        if self.admits:
            self.untrack(uid)
        held = self.admitted.pop(uid, None)
        if held is not None:
            engine.release(self.ledger, uid)
        if held is not None or was_decided:
            self.version += 1
        return held is not None

    # -- restart -----------------------------------------------------------------------

    def restore(self, published: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]],
                own: Mapping[str, PlacedPod] | None = None) -> RestoreReport:
        """Rebuild the ledger after a restart.

        ``published`` is the NodeTopology object (or None); ``pods`` are the pods bound to
        this node now; ``own``: what this process decided before (a reconnecting NRI
        plugin), believed first. A pod that is Running, or has an allocation, gets its
        allocation back: the one this agent decided (``own``, else its published entry),
        else, for a pod the status lacks, its annotation when that matches the pod
        (:func:`~numalign.agent.records.claim_problem`). Anything else -- a record that
        cannot be read, names what the machine lacks, or would take what another pod holds
        -- is refused (``report.refused``, with why, and a log line): the pod holds nothing.
        A pod already finished or rejected stays so; a pod still Pending is returned to be
        decided; published pods that are gone are dropped.
        """
        report = RestoreReport()
        status = (published or {}).get("status") or {}
        spec = (published or {}).get("spec")
        if spec:
            self.set_spec(spec)
        by_uid: dict[str, Mapping[str, Any]] = {}
        for entry in status.get("admitted") or []:
            if isinstance(entry, Mapping) and entry.get("uid"):
                by_uid[str(entry["uid"])] = entry
        own = own or {}
        present: set[str] = set()
        pending: list[Mapping[str, Any]] = []
        to_restore: list[tuple[Mapping[str, Any], Any]] = []
        for pod in pods:
            uid = pod_uid(pod)
            if not uid or uid in self.decided:
                continue
            present.add(uid)
            meta = pod.get("metadata") or {}
            st = pod.get("status") or {}
            phase = st.get("phase")
            ann = (meta.get("annotations") or {}).get(ANN_ALLOCATION)
            if phase == "Failed" or phase == "Succeeded":
                self.decided[uid] = False
                self._follow(pod)
                if phase == "Failed" and st.get("reason") == REJECT_REASON:
                    report.rejected.append(uid)
                continue
            if meta.get("deletionTimestamp") and phase != "Running":
                continue
            if phase == "Running" or ann is not None or uid in by_uid or uid in own:
                to_restore.append((pod, ann))
                self._follow(pod, "Running")
                continue
            pending.append(pod)
        # What the agent itself published first, in the order it published them (the
        # order it admitted them: the memory manager's NUMA groups depend on it), then what
        # it decided itself: a pod's annotation can be edited by its tenant, so it is used
        # only for pods the agent's records lack, after every one of those is back (a
        # claim on another pod's CPUs then conflicts).
        published_order = {uid: i for i, uid in enumerate(by_uid)}
        to_restore.sort(key=lambda pa: published_order.get(
            pod_uid(pa[0]), len(published_order) + (pod_uid(pa[0]) not in own)))
        for pod, ann in to_restore:
            uid = pod_uid(pod)
            ns, name = pod_key(pod)
            self.decided[uid] = True  # restored or not: decided (not admitted again)
            alloc, resolved, problem = self._allocation_of(pod, ann, by_uid.get(uid),
                                                           own.get(uid))
            conflict = False
            if alloc is not None and problem is None:
                problem, conflict = self._commit(uid, pod, alloc)
            if problem is not None:
                log.warning("%s: not restoring the allocation of %s/%s (it holds nothing "
                            "exclusive): %s", self.name, ns, name, problem)
                report.refused[uid] = problem
                if conflict:
                    report.conflicts.append(uid)
                continue
            if alloc is None:  # running without any record (not ours): holds nothing
                continue
            self.admitted[uid] = PlacedPod(ns, name, uid, resolved, alloc, pod)
            report.restored.append(uid)
        report.dropped = [u for u in by_uid if u not in present]
        prev = status.get("rejected")
        if isinstance(prev, int) and not isinstance(prev, bool):
            self.rejected_total = max(prev, len(report.rejected))
        else:
            self.rejected_total = len(report.rejected)
        pending.sort(key=_bind_order)
        report.pending = [dict(p) for p in pending]
        self.version += 1
        return report

    def _commit(self, uid: str, pod: Mapping[str, Any], alloc: Allocation
                ) -> tuple[str | None, bool]:
        """Put ``alloc`` back in the ledger: (None, False), or why not and whether it
        conflicts with what is held. Never raises: a poisoned record must not stop a
        restore."""
        try:
            engine.commit(self.machine, self.ledger, uid, pod, alloc)
        except engine.RestoreConflict as e:
            return str(e), True
        except Exception as e:  # a record the decoder let through but the engine refuses
            self.ledger.release(uid)
            return f"{type(e).__name__}: {e}", False
        return None, False

    def _allocation_of(self, pod: Mapping[str, Any], ann: Any,
                       entry: Mapping[str, Any] | None, own: PlacedPod | None
                       ) -> tuple[Allocation | None, Resolved, str | None]:
        """(allocation, policy, problem): what this agent decided (``own``, else the
        published entry) as it is; else the pod's annotation (which its tenant can edit)
        when it matches the pod."""
        if own is not None:
            return own.allocation, own.resolved, None
        if entry is not None:
            where = f"NodeTopology {self.name} status.admitted entry"
            try:
                got = parse_admitted(entry, where)
            except WireError as e:
                return None, NONE, str(e)
            for note in got.resolved.problems:
                log.warning("%s: %s", self.name, note)
            return got.allocation, got.resolved, None
        if ann is None:
            return None, NONE, None
        try:
            alloc = parse_allocation(str(ann))
        except WireError as e:
            return None, NONE, str(e)
        problem = claim_problem(self.machine, pod, alloc)
        if problem is not None:
            return None, NONE, f"annotation {ANN_ALLOCATION}: {problem}"
        return alloc, NONE, None


def published_pods(name: str, published: Mapping[str, Any] | None) -> dict[str, PlacedPod]:
    """The pods a node's NodeTopology ``status.admitted`` shows (entries that cannot be
    read are left out, with a log line)."""
    out: dict[str, PlacedPod] = {}
    for entry in ((published or {}).get("status") or {}).get("admitted") or []:
        try:
            got = parse_admitted(entry, f"NodeTopology {name} status.admitted entry")
        except WireError as e:
            log.warning("%s: %s", name, e)
            continue
        out[got.uid] = PlacedPod(got.namespace, got.pod, got.uid, got.resolved,
                                   got.allocation)
    return out


def _bind_order(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    sched = ""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            sched = str(c.get("lastTransitionTime") or "")
    return sched or str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")
