"""Redeploy of pods rejected with ``TopologyAffinityError``.

A pod with ``status.phase: Failed`` and ``status.reason: TopologyAffinityError`` (from a
numalign agent or a real kubelet) is redeployed:

- controller-owned (ReplicaSet, StatefulSet, Job, ...): deleted, so that its controller
  creates a replacement; the mutating pod webhook adds a required node affinity
  (``NotIn`` the nodes that rejected the workload recently and the nodes whose
  NodeTopology shows they cannot fit it) to that replacement;
- bare: recreated from its spec under a deterministic fresh name (``<base>-r<attempt>``),
  without ``nodeName`` and with that node affinity, then the failed pod is deleted.

**Durable state.** One ConfigMap ``numalign-redeploy`` per namespace holds a JSON record
per workload (key ``owner-<controller uid>`` or ``pod-<base name>``): the attempt count,
the nodes that rejected it and when, and per rejected pod uid what was decided. The
decision for a rejected pod is written there (optimistic concurrency on the
ConfigMap's resourceVersion) *before* anything is deleted or created, and the
replacement name is part of it, so a crash and restart replays the same decision: the
create hits AlreadyExists, the delete hits NotFound — never two replacements for one
rejection, and the failed pod is deleted only after its replacement exists.

**Limits.** A workload's attempts are counted in rounds of one per replica: an attempt
in round ``k`` (from 0; attempts so far // replicas) waits ``backoffSeconds * 2**k`` after
the operator first saw the rejection, so 50 replicas rejected at once are each retried
after ``backoffSeconds``, not after up to ``2**49`` times it. A workload's budget is
``maxAttempts`` per replica: ``maxAttempts x spec.replicas`` of its controller
(ReplicaSet, StatefulSet, ReplicationController; 1 for bare pods, Jobs and owners it
cannot read). Once the budget is spent, a further rejection
is left Failed with a ``RedeployGaveUp`` Warning event, counted in the governing
TopologyPolicy's ``RedeployExhausted`` condition, and the workload is *exhausted*.

**No runaway.** A ReplicaSet replaces a Failed pod at once, so leaving Failed pods
alone would pile them up (kubernetes#84869), and the replacement would be scheduled
before any backoff. So the mutating webhook adds the scheduling gate :data:`GATE` to a
controller-owned pod created while (a) a rejected pod of its workload waits for its
decision (the backoff): a ``RedeployBackoff`` event, the gate removed once the rejected
pod was redeployed; or (b) the workload is exhausted: a ``RedeployExhausted`` Warning
saying why and how to release it, the gate removed from every held pod when the record
is released -- the controller's annotation :data:`ANN_RESET` changes (any new value), or
:data:`RESET_AFTER_S` passed since the last rejection. Removing the gate from one pod by
hand lets that pod try once more.

**Avoidance.** Replacements avoid the nodes that rejected the workload (for
:data:`AVOID_FOR_S`) and the nodes whose NodeTopology shows they cannot fit it, but never
every node the pod may select (:mod:`.fit`): else it would stay Pending for good and the
budget could never be spent.

A workload's count resets after :data:`RESET_AFTER_S` without a rejection; nodes are
avoided for :data:`AVOID_FOR_S` after they rejected it.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from numalign.api.resolution import (
    ANN_RESOLVED,
    NODE_UNKNOWN,
    PodMeta,
    RedeploySettings,
    policy_refs,
    redeploy_settings,
    resolve,
)

from . import cache, kube, metrics
from .fit import with_unfit

REASON = "TopologyAffinityError"
STATE_CONFIGMAP = "numalign-redeploy"
STATE_LABEL = "numalign.io/state"
ANN_REDEPLOY_OF = "numalign.io/redeploy-of"
ANN_REDEPLOY_OF_UID = "numalign.io/redeploy-of-uid"
ANN_BASE = "numalign.io/redeploy-base"
ANN_WORKLOAD = "numalign.io/workload"
ANN_RESET = "numalign.io/redeploy-reset"
GATE = "numalign.io/redeploy"
REPLICATED_KINDS = ("ReplicaSet", "StatefulSet", "ReplicationController")
RESET_AFTER_S = 3600.0
AVOID_FOR_S = 1800.0
MAX_HANDLED = 64
MAX_NAME = 253

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# Pure helpers (unit-tested)


def is_topology_rejected(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return bool(status.get("phase") == "Failed" and status.get("reason") == REASON)


def backoff_delay(backoff_seconds: float, attempt: int, replicas: int = 1) -> float:
    """Delay before redeploy attempt ``attempt`` (0-based) of a workload of ``replicas``:
    backoff * 2**round, a round being one attempt per replica; capped at one hour."""
    rnd = max(0, attempt) // max(1, replicas)
    return float(min(3600.0, backoff_seconds * (2 ** min(rnd, 30))))


def controller_ref(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller"):
            return ref
    return None


def base_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    ann = meta.get("annotations") or {}
    return str(ann.get(ANN_BASE) or meta.get("name") or "pod")


def workload_key(pod: Mapping[str, Any]) -> str:
    """The ConfigMap key of the pod's workload: controller uid, else the bare pod's
    base name (the name of the first pod of its lineage). Valid ConfigMap key."""
    ref = controller_ref(pod)
    raw = f"owner-{ref.get('uid')}" if ref is not None else f"pod-{base_name(pod)}"
    key = re.sub(r"[^-._a-zA-Z0-9]", "_", raw)
    if len(key) > 200:
        key = key[:180] + "-" + hashlib.sha256(raw.encode()).hexdigest()[:12]
    return key


def replacement_name(base: str, attempt: int) -> str:
    """Deterministic name of the bare-pod replacement for redeploy ``attempt`` (1-based)."""
    suffix = f"-r{attempt}"
    return base[: MAX_NAME - len(suffix)].rstrip("-.") + suffix


def _opt_str(v: Any) -> str | None:
    return str(v) if isinstance(v, str) and v else None


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ts(text: Any) -> float:
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return 0.0


@dataclass
class WorkloadState:
    """The durable record of one workload's rejections and redeploys."""

    attempts: int = 0
    rejections: dict[str, str] | None = None  # node -> last rejection (ISO time)
    handled: dict[str, dict[str, Any]] | None = None  # pod uid -> decision
    gave_up: dict[str, str] | None = None  # pod uid -> when
    policy: str | None = None
    exhausted: str | None = None  # when the budget was spent (new pods are gated)
    owner: dict[str, str] | None = None  # the controller: kind, name
    reset: str | None = None  # the controller's ANN_RESET value when it was exhausted
    released: dict[str, str] | None = None  # gave_up entries from before a release
    last: str | None = None  # the last rejection (ISO time)
    budget: int | None = None  # attempts allowed at the last decision

    @classmethod
    def parse(cls, text: str | None) -> WorkloadState:
        try:
            doc = json.loads(text) if text else {}
        except ValueError:
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        att = doc.get("attempts")
        return cls(
            attempts=att if isinstance(att, int) and att >= 0 else 0,
            rejections={str(k): str(v) for k, v in (doc.get("rejections") or {}).items()},
            handled={str(k): dict(v) for k, v in (doc.get("handled") or {}).items()
                     if isinstance(v, dict)},
            gave_up={str(k): str(v) for k, v in (doc.get("gaveUp") or {}).items()},
            policy=doc.get("policy") if isinstance(doc.get("policy"), str) else None,
            exhausted=_opt_str(doc.get("exhausted")),
            owner={str(k): str(v) for k, v in doc["owner"].items()}
            if isinstance(doc.get("owner"), dict) else None,
            reset=_opt_str(doc.get("reset")),
            released={str(k): str(v) for k, v in (doc.get("released") or {}).items()},
            last=_opt_str(doc.get("last")),
            budget=doc.get("budget") if isinstance(doc.get("budget"), int) else None,
        )

    def dump(self) -> str:
        handled = self.handled or {}
        if len(handled) > MAX_HANDLED:  # keep the newest decisions
            keep = sorted(handled.items(), key=lambda kv: str(kv[1].get("at", "")))[-MAX_HANDLED:]
            handled = dict(keep)
        gave_up = dict(sorted((self.gave_up or {}).items(), key=lambda kv: kv[1])[-MAX_HANDLED:])
        released = dict(sorted((self.released or {}).items(),
                               key=lambda kv: kv[1])[-MAX_HANDLED:])
        doc: dict[str, Any] = {"attempts": self.attempts, "rejections": self.rejections or {},
                               "handled": handled, "gaveUp": gave_up, "policy": self.policy}
        for k, v in (("exhausted", self.exhausted), ("owner", self.owner),
                     ("reset", self.reset), ("released", released), ("last", self.last),
                     ("budget", self.budget)):
            if v:
                doc[k] = v
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    def last_rejection(self) -> float:
        times = [_ts(v) for v in (self.rejections or {}).values()]
        if self.last:
            times.append(_ts(self.last))
        return max(times, default=0.0)

    def release(self, now: float) -> None:
        """Start afresh: a new budget, no gate for new pods (the Failed pods it gave up
        on stay given up)."""
        self.attempts = 0
        self.exhausted = None
        self.reset = None
        self.rejections = {}
        self.released = {**(self.released or {}), **(self.gave_up or {})}
        self.gave_up = {}

    def expire(self, now: float) -> None:
        """Reset the count after a quiet period; forget old rejecting nodes."""
        if (self.attempts or self.exhausted) and now - self.last_rejection() > RESET_AFTER_S:
            self.release(now)
        self.rejections = {n: t for n, t in (self.rejections or {}).items()
                           if now - _ts(t) <= AVOID_FOR_S}

    def avoid_nodes(self, now: float) -> list[str]:
        """Nodes that rejected the workload in the last :data:`AVOID_FOR_S`, newest
        first."""
        recent = [(_ts(t), n) for n, t in (self.rejections or {}).items()
                  if now - _ts(t) <= AVOID_FOR_S]
        return [n for _, n in sorted(recent, key=lambda tn: (-tn[0], tn[1]))]


def with_node_avoidance(spec: Mapping[str, Any], avoid: list[str]) -> dict[str, Any]:
    """A copy of a pod spec whose required node affinity excludes ``avoid`` nodes (by
    ``metadata.name`` field, one requirement per node; added to every nodeSelectorTerm,
    since terms are ORed)."""
    out = copy.deepcopy(dict(spec))
    if not avoid:
        return out
    # The API server allows one value per metadata.name field requirement: one each.
    reqs = [{"key": "metadata.name", "operator": "NotIn", "values": [n]}
            for n in sorted(set(avoid))]
    affinity = out.setdefault("affinity", {}) or {}
    out["affinity"] = affinity
    node_aff = affinity.setdefault("nodeAffinity", {}) or {}
    affinity["nodeAffinity"] = node_aff
    required = node_aff.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {}) or {}
    node_aff["requiredDuringSchedulingIgnoredDuringExecution"] = required
    terms = required.get("nodeSelectorTerms") or [{}]
    new_terms = []
    for term in terms:
        term = dict(term)
        fields = [f for f in term.get("matchFields") or []
                  if not (f.get("key") == "metadata.name" and f.get("operator") == "NotIn")]
        fields += reqs
        term["matchFields"] = fields
        new_terms.append(term)
    required["nodeSelectorTerms"] = new_terms
    return out


_DROP_ANNOTATIONS = (ANN_RESOLVED, "numalign.io/allocation",
                     "kubectl.kubernetes.io/last-applied-configuration")


def build_replacement(pod: Mapping[str, Any], name: str, avoid: list[str]) -> dict[str, Any]:
    """The bare-pod replacement: same labels, annotations (minus what the operator and
    the agent wrote) and spec, without nodeName, with node avoidance."""
    meta = pod.get("metadata") or {}
    ann = {k: v for k, v in (meta.get("annotations") or {}).items()
           if k not in _DROP_ANNOTATIONS and not k.startswith("kopf.zalando.org/")}
    ann[ANN_REDEPLOY_OF] = str(meta.get("name", ""))
    ann[ANN_REDEPLOY_OF_UID] = str(meta.get("uid", ""))
    ann[ANN_BASE] = base_name(pod)
    spec = dict(pod.get("spec") or {})
    spec.pop("nodeName", None)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": meta.get("namespace"),
                     "labels": dict(meta.get("labels") or {}), "annotations": ann},
        "spec": with_node_avoidance(spec, avoid),
    }


def _fault(point: str) -> None:
    """Crash injection for the restart tests: NUMALIGN_FAULT=<point> exits the process
    abruptly there (as a kill would)."""
    if os.environ.get("NUMALIGN_FAULT") == point:
        log.error(f"NUMALIGN_FAULT={point}: exiting")
        os._exit(17)


# ---------------------------------------------------------------------------
# Durable state in a ConfigMap


def load_state(namespace: str) -> tuple[dict[str, str], str | None]:
    """The ConfigMap's data and resourceVersion (None when it does not exist yet), from
    the watch-fed cache (:func:`save_state` refreshes it on a conflict)."""
    return cache.state(namespace)


def save_state(namespace: str, data: dict[str, str], resource_version: str | None) -> None:
    """Write the ConfigMap; raises ApiException 409 when someone else wrote it first
    (the cached copy was stale: it is read again for the retry)."""
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": STATE_CONFIGMAP, "namespace": namespace,
                         "labels": {STATE_LABEL: "redeploy"}},
            "data": data}
    try:
        if resource_version is None:
            out = kube.core().create_namespaced_config_map(namespace, body)
        else:
            body["metadata"]["resourceVersion"] = resource_version
            out = kube.core().replace_namespaced_config_map(STATE_CONFIGMAP, namespace, body)
    except ApiException as e:
        if e.status == 409:
            cache.refresh_state(namespace)
        raise
    cache.STATES.put(cache.slim_state(kube.to_dict(out)))


def workload_state(namespace: str, key: str) -> WorkloadState:
    data, _ = load_state(namespace)
    return WorkloadState.parse(data.get(key))


def update_record(namespace: str, key: str, change: Any, tries: int = 5) -> WorkloadState | None:
    """Read-modify-write one record with optimistic concurrency: ``change(state)``
    returns False to write nothing. The state written, or None."""
    for _ in range(tries):
        data, rv = load_state(namespace)
        if key not in data:
            return None
        st = WorkloadState.parse(data.get(key))
        if change(st) is False:
            return None
        data[key] = st.dump()
        try:
            save_state(namespace, data, rv)
            return st
        except ApiException as e:
            if e.status != 409:
                raise
    return None


# ---------------------------------------------------------------------------
# The redeploy step


def _governing(pod: Mapping[str, Any]) -> tuple[str | None, RedeploySettings]:
    meta = PodMeta.from_object(pod)
    policies = policy_refs(cache.policies())
    res = resolve(meta, cache.namespace_labels(meta.namespace), policies, NODE_UNKNOWN)
    spec = next((p.spec for p in policies if p.name == res.governing), None)
    return res.governing, redeploy_settings(spec)


_OWNERS: dict[str, tuple[float, dict[str, Any] | None]] = {}
_OWNERS_LOCK = threading.Lock()
OWNER_TTL_S = 10.0


def read_owner(kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    """The controller object (as JSON), None when gone or of a kind not read here."""
    try:
        if kind == "ReplicaSet":
            obj = kube.apps().read_namespaced_replica_set(name, namespace)
        elif kind == "StatefulSet":
            obj = kube.apps().read_namespaced_stateful_set(name, namespace)
        elif kind == "ReplicationController":
            obj = kube.core().read_namespaced_replication_controller(name, namespace)
        elif kind == "Job":
            obj = kube.batch().read_namespaced_job(name, namespace)
        else:
            return None
    except ApiException as e:
        if e.status in (403, 404):
            return None
        raise
    return kube.to_dict(obj)


def owner_replicas(pod: Mapping[str, Any]) -> tuple[int, dict[str, Any] | None]:
    """Desired replicas of the pod's controller (1 for bare pods, Jobs and what cannot
    be read) and the controller object (cached for :data:`OWNER_TTL_S`)."""
    ref = controller_ref(pod)
    if ref is None:
        return 1, None
    uid = str(ref.get("uid"))
    now = time.monotonic()
    with _OWNERS_LOCK:
        hit = _OWNERS.get(uid)
    if hit is not None and now - hit[0] < OWNER_TTL_S:
        owner = hit[1]
    else:
        ns = str((pod.get("metadata") or {}).get("namespace") or "")
        try:
            owner = read_owner(str(ref.get("kind")), str(ref.get("name")), ns)
        except ApiException:
            owner = None
        with _OWNERS_LOCK:
            if len(_OWNERS) > 4096:
                _OWNERS.clear()
            _OWNERS[uid] = (now, owner)
    replicas = 1
    if owner is not None and ref.get("kind") in REPLICATED_KINDS:
        value = (owner.get("spec") or {}).get("replicas")
        replicas = value if isinstance(value, int) and value > 0 else 1
    return replicas, owner


def _delete_pod(namespace: str, name: str, uid: str) -> None:
    try:
        kube.core().delete_namespaced_pod(
            name, namespace, body={"preconditions": {"uid": uid}, "gracePeriodSeconds": 0})
    except ApiException as e:
        if e.status not in (404, 409):  # gone, or a different pod now has that name
            raise


# Recreating bare pods needs `create` on pods, a separate role (config/recreate-bare-pods):
# off unless the operator runs with --recreate-bare-pods.
RECREATE_BARE_PODS = False
NAME_TAKEN = "name-taken"


def is_replacement_of(existing: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether ``existing`` (found under the replacement's name) is the replacement this
    operator created for ``pod``: it names the original and its uid."""
    ann = (existing.get("metadata") or {}).get("annotations") or {}
    meta = pod.get("metadata") or {}
    return (ann.get(ANN_REDEPLOY_OF) == meta.get("name")
            and ann.get(ANN_REDEPLOY_OF_UID) == meta.get("uid"))


def _finish(pod: Mapping[str, Any], decision: Mapping[str, Any]) -> str:
    """Carry out a recorded decision; idempotent. Returns the action done, or
    NAME_TAKEN when the replacement's name belongs to an unrelated pod (the original is
    then kept: deleting it would lose the workload)."""
    meta = pod.get("metadata") or {}
    ns, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
    if decision.get("action") == "recreate":
        new = build_replacement(pod, str(decision["replacement"]),
                                list(decision.get("avoid") or []))
        try:
            kube.core().create_namespaced_pod(ns, new)
        except ApiException as e:
            if e.status != 409:
                raise
            # AlreadyExists: created before a crash/retry, or someone else's pod.
            try:
                existing = kube.to_dict(kube.core().read_namespaced_pod(
                    str(decision["replacement"]), ns))
            except ApiException as e2:
                if e2.status != 404:
                    raise
                raise e from None  # gone again: retried by the caller
            if not is_replacement_of(existing, pod):
                return NAME_TAKEN
        _fault("after-create")
    _delete_pod(ns, name, uid)
    return str(decision.get("action"))


def _give_up_name_taken(pod: Mapping[str, Any], decision: Mapping[str, Any],
                        now: float) -> None:
    meta = pod.get("metadata") or {}
    ns, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
    key = workload_key(pod)
    data, rv = load_state(ns)
    st = WorkloadState.parse(data.get(key))
    st.handled = {k: v for k, v in (st.handled or {}).items() if k != uid}
    st.gave_up = {**(st.gave_up or {}), uid: _iso(now)}
    data[key] = st.dump()
    save_state(ns, data, rv)
    metrics.REDEPLOYS.labels(outcome="gave_up").inc()
    kube.event(pod, "Warning", reason="RedeployGaveUp",
               message=f"not redeploying {name}: its replacement's name "
                       f"{decision.get('replacement')} is taken by a pod that is not its "
                       f"replacement; {name} is kept")


def step(pod: Mapping[str, Any], first_seen: float, now: float | None = None) -> float | None:
    """One pass over a rejected pod: None when done, else seconds to wait."""
    now = time.time() if now is None else now
    meta = pod.get("metadata") or {}
    ns, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    key = workload_key(pod)
    data, rv = load_state(ns)
    st = WorkloadState.parse(data.get(key))
    decision = (st.handled or {}).get(uid)
    if decision is not None:
        if _finish(pod, decision) == NAME_TAKEN:
            _give_up_name_taken(pod, decision, now)
        return None
    if uid in (st.gave_up or {}):
        return None
    if uid in (st.released or {}):
        return None
    governing, settings = _governing(pod)
    st.policy = governing
    st.expire(now)
    if not settings.enabled:
        return None
    if controller_ref(pod) is None and not RECREATE_BARE_PODS:
        st.gave_up = {**(st.gave_up or {}), uid: _iso(now)}
        data[key] = st.dump()
        save_state(ns, data, rv)
        metrics.REDEPLOYS.labels(outcome="gave_up").inc()
        kube.event(pod, "Warning", reason="RedeployGaveUp",
                   message=f"not redeploying {name}: it has no controller, and recreating "
                           "bare pods is off (operator flag --recreate-bare-pods)")
        return None
    replicas, owner = owner_replicas(pod)
    budget = settings.max_attempts * replicas
    st.budget = budget
    if st.attempts >= budget:
        st.gave_up = {**(st.gave_up or {}), uid: _iso(now)}
        st.last = _iso(now)
        ref = controller_ref(pod)
        gate = ref is not None and owner is not None
        if gate and not st.exhausted:
            assert ref is not None and owner is not None
            st.exhausted = _iso(now)
            st.owner = {"kind": str(ref.get("kind")), "name": str(ref.get("name"))}
            st.reset = str(((owner.get("metadata") or {}).get("annotations") or {}).get(
                ANN_RESET, ""))
        data[key] = st.dump()
        save_state(ns, data, rv)
        metrics.REDEPLOYS.labels(outcome="gave_up").inc()
        per = f"maxAttempts={settings.max_attempts}" + (
            f" x {replicas} replicas" if replicas != 1 else "")
        msg = (f"not redeploying {name}: {st.attempts} redeploy attempt(s) of this "
               f"workload reached its budget ({per}"
               + (f" of TopologyPolicy/{governing}" if governing else "") + ")")
        if gate:
            assert ref is not None
            msg += (f"; new pods of {ref.get('kind')}/{ref.get('name')} are held by the "
                    f"scheduling gate {GATE} until it is released: fix the policy or free "
                    f"capacity, then annotate the {ref.get('kind')} with {ANN_RESET}=<a new "
                    f"value>")
        kube.event(pod, "Warning", reason="RedeployGaveUp", message=msg)
        return None
    wait = first_seen + backoff_delay(settings.backoff_seconds, st.attempts, replicas) - now
    if wait > 0:
        return wait
    attempt = st.attempts + 1
    st.last = _iso(now)
    if node:
        st.rejections = {**(st.rejections or {}), node: _iso(now)}
    avoid = st.avoid_nodes(now) if settings.avoid_rejecting_nodes else []
    avoid = with_unfit(pod, avoid)
    bare = controller_ref(pod) is None
    decision = {"action": "recreate" if bare else "delete", "attempt": attempt, "node": node,
                "at": _iso(now), "pod": name, "avoid": avoid if bare else [],
                "replacement": replacement_name(base_name(pod), attempt) if bare else None}
    st.handled = {**(st.handled or {}), uid: decision}
    st.attempts = attempt
    data[key] = st.dump()
    save_state(ns, data, rv)  # durable before acting (409 -> retried by the caller)
    _fault("after-record")
    action = _finish(pod, decision)
    if action == NAME_TAKEN:
        _give_up_name_taken(pod, decision, now)
        return None
    metrics.REDEPLOYS.labels(outcome="recreated" if action == "recreate" else "deleted").inc()
    kube.event(pod, "Normal", reason="Redeploy",
              message=f"attempt {attempt}/{budget}: "
                      + (f"recreated as {decision['replacement']}" if bare
                         else "deleted so that its controller recreates it")
                      + (f", avoiding {', '.join(avoid)}" if avoid else ""))
    return None


@dataclass
class Workload:
    """What the mutating webhook and the release pass know of a controller's workload:
    its record, and its pods that are Failed with TopologyAffinityError right now."""

    state: WorkloadState
    failed: dict[str, str]  # pod uid -> node
    pod: Mapping[str, Any]
    _settings: RedeploySettings | None = None

    @property
    def settings(self) -> RedeploySettings:
        if self._settings is None:
            self._settings = _governing(self.pod)[1]
        return self._settings

    def waiting(self) -> list[str]:
        """Uids of its rejected pods that wait for the operator's decision (backoff)."""
        st = self.state
        decided = {**(st.handled or {}), **(st.gave_up or {}), **(st.released or {})}
        return sorted(uid for uid in self.failed if uid not in decided)

    def is_exhausted(self, now: float) -> bool:
        st = self.state
        return bool(st.exhausted) and now - st.last_rejection() <= RESET_AFTER_S

    def hold(self, now: float) -> str | None:
        """Why its new pods are held by :data:`GATE`: ``exhausted`` (the budget is
        spent), ``backoff`` (a rejected pod waits out its backoff: its controller's
        replacement must not be scheduled before), or None."""
        if not self.failed and not self.state.exhausted:
            return None
        if not self.settings.enabled:
            return None
        if self.is_exhausted(now):
            return "exhausted"
        return "backoff" if self.waiting() else None

    def avoid(self, now: float) -> list[str]:
        """Nodes its new pods should avoid: the nodes of its rejected pods now, then the
        nodes in its record, newest first (with ``avoidRejectingNodes``), plus the nodes
        that cannot fit it (:func:`~numalign.controller.fit.with_unfit`). Nothing until
        it was rejected once."""
        recorded = self.state.avoid_nodes(now)
        nodes = list(dict.fromkeys([*sorted(set(self.failed.values())), *recorded]))
        if not nodes or not self.settings.enabled:
            return []
        if not self.settings.avoid_rejecting_nodes:
            nodes = []
        return with_unfit(self.pod, nodes)


def _rejected_by_owner(namespace: str) -> dict[str, dict[str, str]]:
    """Controller uid -> {pod uid: node} of the namespace's pods Failed with
    TopologyAffinityError. Read from the API server's watch cache (resourceVersion "0":
    no etcd read): a controller learnt of its Failed pod from there before creating the
    replacement this answer is for; the operator's own watch may lag behind."""
    failed = kube.core().list_namespaced_pod(namespace, field_selector="status.phase=Failed",
                                             resource_version="0")
    out: dict[str, dict[str, str]] = {}
    for other in failed.items:
        if other.status.reason != REASON or other.metadata.deletion_timestamp:
            continue
        for r in other.metadata.owner_references or []:
            if r.controller:
                out.setdefault(str(r.uid), {})[str(other.metadata.uid)] = str(
                    other.spec.node_name or "")
    return out


def workload_of(pod: Mapping[str, Any], namespace: str,
                rejected: dict[str, dict[str, str]] | None = None) -> Workload | None:
    """The workload of a controller-owned pod (None for bare pods)."""
    ref = controller_ref(pod)
    if ref is None:
        return None
    owner = str(ref.get("uid"))
    if rejected is None:
        rejected = _rejected_by_owner(namespace)
    failed = {uid: node for uid, node in rejected.get(owner, {}).items()}
    for p in cache.FAILED.values():  # seen by the operator's watch, maybe not there yet
        if p.get("owner") == owner and p["metadata"].get("namespace") == namespace:
            failed.setdefault(str(p["metadata"].get("uid")), str(p.get("node") or ""))
    return Workload(workload_state(namespace, workload_key(pod)),
                    {u: n for u, n in failed.items() if n}, pod)


def has_gate(pod: Mapping[str, Any]) -> bool:
    return any(isinstance(g, Mapping) and g.get("name") == GATE
               for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def gate_message(pod: Mapping[str, Any], st: WorkloadState) -> str:
    """The Warning on a pod held because its workload spent its redeploy budget."""
    ref = controller_ref(pod) or {}
    kind, owner = str(ref.get("kind", "")), str(ref.get("name", ""))
    name = str((pod.get("metadata") or {}).get("name", ""))
    ns = str((pod.get("metadata") or {}).get("namespace", ""))
    spent = (f"{st.attempts} redeploy attempt(s) (budget {st.budget or st.attempts}"
             + (f", TopologyPolicy/{st.policy}" if st.policy else "") + ")")
    return (f"held by the scheduling gate {GATE}: {kind}/{owner} was rejected with "
            f"TopologyAffinityError and spent {spent}, so its new pods are not scheduled. "
            f"Fix the policy or free capacity, then release them all with `kubectl annotate "
            f"-n {ns} {kind.lower()}/{owner} {ANN_RESET}=$(date +%s) --overwrite`, or let "
            f"this one try once more by removing the gate (`kubectl patch -n {ns} pod/{name} "
            f"--type=json -p '[{{\"op\":\"remove\",\"path\":\"/spec/schedulingGates\"}}]'`"
            f"); released by itself {int(RESET_AFTER_S // 60)} minutes after the last "
            f"rejection")


def backoff_message(pod: Mapping[str, Any]) -> str:
    ref = controller_ref(pod) or {}
    return (f"held by the scheduling gate {GATE} while a pod of {ref.get('kind', '')}/"
            f"{ref.get('name', '')} rejected with TopologyAffinityError waits out its "
            f"redeploy backoff; released when the operator has redeployed it")


def release_budgets(now: float) -> None:
    """Release exhausted records whose controller's :data:`ANN_RESET` changed (or that
    expired, or whose controller is gone)."""
    for cm in cache.all_states():
        ns = str(cm["metadata"].get("namespace") or "")
        for key, text in (cm.get("data") or {}).items():
            st = WorkloadState.parse(text)
            if not st.exhausted:
                continue
            why = None
            if now - st.last_rejection() > RESET_AFTER_S:
                why = "expired"
            elif st.owner:
                owner = read_owner(st.owner.get("kind", ""), st.owner.get("name", ""), ns)
                if owner is None:
                    why = "controller gone"
                else:
                    token = str(((owner.get("metadata") or {}).get("annotations") or {}).get(
                        ANN_RESET, ""))
                    if token != (st.reset or ""):
                        why = f"{ANN_RESET}={token}"

            if why is None:
                continue

            def change(s: WorkloadState) -> bool:
                if not s.exhausted:
                    return False
                s.release(now)
                return True

            if update_record(ns, key, change) is not None:
                log.info(f"redeploy budget of {ns}/{key} released ({why})")


_warned: dict[str, set[str]] = {}


def _tell_once(pod: Mapping[str, Any], why: str, st: WorkloadState) -> None:
    """One event per held pod and reason: Normal for a backoff, Warning when the budget
    is spent."""
    uid = str((pod.get("metadata") or {}).get("uid", ""))
    seen = _warned.setdefault(uid, set())
    if why in seen:
        return
    if len(_warned) > 100_000:
        _warned.clear()
    seen.add(why)
    if why == "exhausted":
        kube.event(pod, "Warning", reason="RedeployExhausted", message=gate_message(pod, st))
    else:
        kube.event(pod, "Normal", reason="RedeployBackoff", message=backoff_message(pod))


def release_held(namespace: str | None = None, now: float | None = None) -> None:
    """Remove :data:`GATE` from held pods whose workload has no reason to hold them any
    more (its rejected pods were redeployed, its budget released); tell the others why
    they are held. One LIST of Failed pods per namespace with held pods. Idempotent."""
    now = time.time() if now is None else now
    by_ns: dict[str, list[Mapping[str, Any]]] = {}
    for pod in cache.GATED.values():
        ns = str((pod.get("metadata") or {}).get("namespace") or "")
        if ns and (namespace is None or ns == namespace):
            by_ns.setdefault(ns, []).append(pod)
    for ns, held in by_ns.items():
        rejected = _rejected_by_owner(ns)
        for one in held:
            wl = workload_of(one, ns, rejected)
            why = wl.hold(now) if wl is not None else None
            if wl is None or why is None:
                ungate(one)
            else:
                _tell_once(one, why, wl.state)


def periodic_release(now: float | None = None) -> None:
    """The periodic pass: release budgets, then held pods."""
    now = time.time() if now is None else now
    release_budgets(now)
    release_held(now=now)


def ungate(pod: Mapping[str, Any]) -> None:
    meta = pod.get("metadata") or {}
    gates = list((pod.get("spec") or {}).get("schedulingGates") or [])
    idx = next((i for i, g in enumerate(gates) if g.get("name") == GATE), None)
    if idx is None:
        return
    try:
        kube.core().patch_namespaced_pod(str(meta["name"]), str(meta["namespace"]), [
            {"op": "test", "path": f"/spec/schedulingGates/{idx}/name", "value": GATE},
            {"op": "remove", "path": f"/spec/schedulingGates/{idx}"}])
    except ApiException as e:
        if e.status == 404:  # gone
            cache.GATED.remove(pod)
            return
        if e.status in (409, 422):  # the gate moved or was removed already: next pass
            return
        raise
    cache.GATED.remove(pod)
    _warned.pop(str(meta.get("uid", "")), None)
    kube.event(pod, "Normal", reason="RedeployReleased",
               message=f"scheduling gate {GATE} removed: the workload's rejected pods were "
                       "redeployed or its redeploy budget was released")


# ---------------------------------------------------------------------------
# Kopf handler
#
# Not a kopf daemon: daemons (and timers) make Kopf put a finalizer on every object they
# serve, and a finalizer on pods would block their deletion while the operator is down.
# An event handler schedules one worker per rejected pod uid instead; on restart (or
# when a standby takes over) the initial listing schedules the pending ones again, and
# the durable decision in the ConfigMap makes a replay harmless.

_workers: dict[str, asyncio.Task[None]] = {}


def _run_worker(pod: Mapping[str, Any], stop: threading.Event,
                log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    first_seen = time.time()
    meta = pod.get("metadata") or {}
    while not stop.is_set():
        wait: float | None
        try:
            fresh = kube.to_dict(kube.core().read_namespaced_pod(meta["name"], meta["namespace"]))
            if fresh["metadata"].get("uid") != meta.get("uid") or not is_topology_rejected(fresh):
                wait = None
            else:
                wait = step(fresh, first_seen)
        except ApiException as e:
            if e.status == 404:
                wait = None
            else:
                log.info(f"redeploy of {meta.get('name')}: API error {e.status}, "
                         f"retrying: {e.reason}")
                wait = 1.0
        except Exception as e:  # a malformed object must not end the retries silently
            log.exception(f"redeploy of {meta.get('name')} failed, retrying: {e}")
            wait = 5.0
        if wait is None:
            break
        stop.wait(min(wait, 60.0))
    else:
        return
    # Decided: the replacements its controller made meanwhile may go (or, the budget
    # spent, learn why they stay held). The periodic pass catches what this misses.
    try:
        release_held(str(meta.get("namespace") or ""))
    except ApiException as e:
        log.info(f"releasing held pods after {meta.get('name')}: API error {e.status}")


async def _worker(pod: dict[str, Any], uid: str, log: kopf.Logger) -> None:
    stop = threading.Event()
    try:
        await asyncio.to_thread(_run_worker, pod, stop, log)
    except asyncio.CancelledError:
        stop.set()
        raise
    finally:
        _workers.pop(uid, None)


def _rejected(body: kopf.Body, **_: Any) -> bool:
    return is_topology_rejected(body) and not (body.get("metadata") or {}).get(
        "deletionTimestamp")


@kopf.on.event("", "v1", "pods", id="redeploy", when=_rejected)
async def rejected_pod(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    uid = str(body.get("metadata", {}).get("uid", ""))
    if not uid or uid in _workers:
        return
    metrics.REJECTIONS.labels(node=str((body.get("spec") or {}).get("nodeName") or "")).inc()
    _workers[uid] = asyncio.create_task(_worker(dict(body), uid, logger))


@kopf.on.event("", "v1", "pods", id="redeploy-gate")
async def gated_pod(body: kopf.Body, type: str | None, **_: Any) -> None:
    """Remember held pods (for :func:`release_held`) and tell each why it is held."""
    meta = body.get("metadata") or {}
    uid = str(meta.get("uid", ""))
    if not has_gate(body):
        if cache.GATED.get(uid) is not None:
            cache.GATED.remove(body)
        return
    cache.feed(cache.GATED, body, type, cache.slim_gated)
    if type == "DELETED" or not uid:
        _warned.pop(uid, None)
        return
    if _warned.get(uid):
        return
    ns = str(meta.get("namespace") or "")
    pod = dict(body)

    def tell() -> None:
        wl = workload_of(pod, ns)
        why = wl.hold(time.time()) if wl is not None else None
        if wl is not None and why is not None:
            _tell_once(pod, why, wl.state)

    await asyncio.to_thread(tell)


async def stop_workers() -> None:
    tasks = list(_workers.values())
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
