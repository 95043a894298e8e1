"""One emulated node's allocation state (pure: no I/O).

The state is what the kubelet's resource managers hold: the engine's ledger, and for
each admitted pod what it got. It decides pods (admit / reject), releases them, and
rebuilds itself after a restart from what the agent published (NodeTopology status) and
wrote on the pods (``numalign.io/allocation``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from numalign.api.wire import (
    ANN_ALLOCATION,
    NONE,
    REJECT_REASON,
    Allocation,
    Resolved,
    WireError,
    node_default,
    parse_admitted,
    parse_allocation,
)
from numalign.topology.machine import Machine

from . import engine

log = logging.getLogger(__name__)

JSON = dict[str, Any]


@dataclass
class AdmittedPod:
    namespace: str
    name: str
    uid: str
    resolved: Resolved
    allocation: Allocation


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
    conflicts: list[str] = field(default_factory=list)  # allocations that could not be restored


def pod_uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def pod_key(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class NodeState:
    """Allocation state of one node."""

    def __init__(self, name: str, machine: Machine, index: int = 0, admits: bool = True) -> None:
        self.name = name
        self.admits = admits
        self.machine = machine
        self.index = index
        self.ledger = engine.new_ledger(machine)
        self.admitted: dict[str, AdmittedPod] = {}
        self.decided: dict[str, bool] = {}  # uid -> admitted?
        self.rejected_total = 0
        self.default: Resolved = NONE
        self.spec_generation: int | None = None
        self.observed_generation: int | None = None
        self.version = 0  # bumped on every change worth publishing
        self.pod_seq = 0
        # Real nodes (agent/realnode.py): the kubelet's allocatable per zone (else the
        # machine's capacity), its configuration, and whether the agent can read it.
        self.zone_allocatable: dict[int, dict[str, int]] | None = None
        self.kubelet: dict[str, Any] | None = None
        self.ready = True
        self.ready_message = ""
        # A numalign-managed real node (agent/nri/managed.py): the condition NRIPlacement,
        # (placing?, reason, message); None elsewhere.
        self.placement: tuple[bool, str, str] | None = None

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

    def decide(self, pod: Mapping[str, Any], resolved: Resolved) -> Decision:
        """Admit or reject ``pod`` (once: a decided pod gets its first answer again)."""
        uid = pod_uid(pod)
        if uid in self.decided:
            held = self.admitted.get(uid)
            return Decision(admit=self.decided[uid],
                            allocation=held.allocation if held else None,
                            resolved=held.resolved if held else resolved)
        result = engine.admit(self.machine, self.ledger, pod, resolved, uid)
        self.decided[uid] = result.admit
        self.version += 1
        if result.admit:
            alloc = result.allocation or Allocation()
            ns, name = pod_key(pod)
            self.admitted[uid] = AdmittedPod(ns, name, uid, resolved, alloc)
            return Decision(True, allocation=alloc, resolved=resolved)
        reason = result.reason or REJECT_REASON
        if reason == REJECT_REASON:  # status.rejected counts TopologyAffinityErrors
            self.rejected_total += 1
        return Decision(False, reason=reason, message=result.message, resolved=resolved)

    def release(self, uid: str) -> bool:
        """Forget a pod (deleted or finished); True if it held resources."""
        was_decided = self.decided.pop(uid, None) is not None
        held = self.admitted.pop(uid, None)
        if held is not None:
            engine.release(self.ledger, uid)
        if held is not None or was_decided:
            self.version += 1
        return held is not None

    # -- restart -----------------------------------------------------------------------

    def restore(self, published: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]
                ) -> RestoreReport:
        """Rebuild the ledger after a restart.

        ``published`` is the NodeTopology object (or None); ``pods`` are the pods bound to
        this node now. A pod that is Running with an allocation (the published entry with
        its uid, else its annotation) gets that allocation back; a pod already rejected
        stays rejected; a pod still Pending is returned to be decided; published pods that
        are gone are dropped.
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
                if phase == "Failed" and st.get("reason") == REJECT_REASON:
                    report.rejected.append(uid)
                continue
            if meta.get("deletionTimestamp") and phase != "Running":
                continue
            if phase == "Running" or ann is not None:
                to_restore.append((pod, ann))
                continue
            pending.append(pod)
        # What the agent itself published first, in the order it published them (the
        # order it admitted them: the memory manager's NUMA groups depend on it): a pod's
        # annotation can be edited by its tenant, so it is used only for pods the
        # published status lacks, after every published allocation is back (a claim on
        # another pod's CPUs then conflicts).
        published_order = {uid: i for i, uid in enumerate(by_uid)}
        to_restore.sort(key=lambda pa: published_order.get(pod_uid(pa[0]),
                                                            len(published_order)))
        for pod, ann in to_restore:
            uid = pod_uid(pod)
            ns, name = pod_key(pod)
            try:
                alloc, resolved = self._allocation_of(pod, ann, by_uid.get(uid))
            except Exception as e:  # a poisoned pod must not stop the restore
                log.warning("%s: cannot read the allocation of %s/%s: %s", self.name, ns,
                            name, e)
                alloc, resolved = None, NONE
            if alloc is None:
                # Running without anything to restore from (not ours): hold nothing.
                self.decided[uid] = True
                continue
            try:
                engine.commit(self.machine, self.ledger, uid, pod, alloc)
            except engine.RestoreConflict as e:
                log.warning("%s: cannot restore %s/%s: %s", self.name, ns, name, e)
                report.conflicts.append(uid)
                self.decided[uid] = True
                continue
            self.decided[uid] = True
            self.admitted[uid] = AdmittedPod(ns, name, uid, resolved, alloc)
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

    def _allocation_of(self, pod: Mapping[str, Any], ann: Any,
                       entry: Mapping[str, Any] | None) -> tuple[Allocation | None, Resolved]:
        """From the published entry (what this agent wrote), else the pod's allocation
        annotation (which its tenant can edit); the policy from the published entry."""
        resolved = NONE
        published: Allocation | None = None
        if entry is not None:
            try:
                got = parse_admitted(entry, f"NodeTopology {self.name} status.admitted entry")
                resolved, published = got.resolved, got.allocation
                for problem in resolved.problems:
                    log.warning("%s: %s", self.name, problem)
            except WireError as e:
                log.warning("%s: NodeTopology entry of %s: %s", self.name, entry.get("pod"), e)
        if published is not None:
            return published, resolved
        if ann is not None:
            try:
                return parse_allocation(str(ann)), resolved
            except WireError as e:
                log.warning("%s: %s", self.name, e)
        return None, resolved


def _bind_order(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    sched = ""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled":
            sched = str(c.get("lastTransitionTime") or "")
    return sched or str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")
