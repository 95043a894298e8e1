"""The pure redeploy logic: names, keys, backoff, node avoidance, replacements, and the
durable record of a workload (:class:`WorkloadState`). The rules are in the README
(section "TopologyPolicy"); nothing here talks to the API server."""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from numalign.api.names import (
    ANN_ALLOCATION,
    ANN_REDEPLOY_BASE,
    ANN_REDEPLOY_OF,
    ANN_REDEPLOY_OF_UID,
    ANN_REJECTION,
    ANN_RESOLVED,
    ANN_WORKLOAD,
    REDEPLOY_GATE,
    REJECT_REASON,
)
from numalign.topology import jsontext

REPLICATED_KINDS = ("ReplicaSet", "StatefulSet", "ReplicationController")
RESET_AFTER_S = 3600.0
AVOID_FOR_S = 1800.0
MAX_HANDLED = 64
# A ConfigMap holds at most 1 MiB: the records of a namespace are pruned below this.
MAX_RECORD_BYTES = 1 << 20
MAX_DATA_BYTES = 768 << 10
MAX_NAME = 253

# ---------------------------------------------------------------------------
# Pure helpers (unit-tested)


def is_topology_rejected(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    return bool(status.get("phase") == "Failed" and status.get("reason") == REJECT_REASON)


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
    return str(ann.get(ANN_REDEPLOY_BASE) or meta.get("name") or "pod")


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


def iso(ts: float) -> str:
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
    reset: str | None = None  # the controller's ANN_REDEPLOY_RESET value when it was exhausted
    released: dict[str, str] | None = None  # gave_up entries from before a release
    last: str | None = None  # the last rejection (ISO time)
    budget: int | None = None  # attempts allowed at the last decision

    @classmethod
    def parse(cls, text: str | None) -> WorkloadState:
        try:
            doc = jsontext.loads(text, "redeploy record", max_bytes=MAX_RECORD_BYTES) \
                if text else {}
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


def repeats_a_counted_rejection(pod: Mapping[str, Any], st: WorkloadState, node: str,
                                now: float) -> bool:
    """Whether the rejection of ``pod`` on ``node`` only repeats one the workload's record
    already counted: a controller's pod that the operator's webhook never admitted (no
    :data:`ANN_WORKLOAD`: created while the operator or its webhook was away) rejected by
    a node that rejected the workload within :data:`AVOID_FOR_S`. A ReplicaSet replaces a
    Failed pod at once, so while nobody keeps its replacements off the rejecting node they
    land there again and again; counting each would spend the budget without one
    replacement that avoids the node ever being tried. Pods the webhook admitted (marked
    under a policy that redeploys) always count."""
    if not node or controller_ref(pod) is None:
        return False
    if ANN_WORKLOAD in ((pod.get("metadata") or {}).get("annotations") or {}):
        return False
    return node in st.avoid_nodes(now)


def _pinned(term: Mapping[str, Any]) -> set[str] | None:
    """The node names a nodeSelectorTerm allows by ``metadata.name In`` (None: any)."""
    pins: set[str] | None = None
    for f in term.get("matchFields") or []:
        if f.get("key") == "metadata.name" and f.get("operator") == "In":
            values = {str(v) for v in f.get("values") or []}
            pins = values if pins is None else pins & values
    return pins


def with_node_avoidance(spec: Mapping[str, Any], avoid: list[str]) -> dict[str, Any]:
    """A copy of a pod spec whose required node affinity excludes ``avoid`` nodes (by
    ``metadata.name`` field, one requirement per node; added to every nodeSelectorTerm,
    since terms are ORed) -- unless that would leave it no node at all: a pod bound to a
    node already, or one whose every term names only avoided nodes (DaemonSet pods)."""
    out = copy.deepcopy(dict(spec))
    if not avoid or out.get("nodeName"):
        return out
    avoided = set(avoid)
    existing = ((((out.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
                .get("nodeSelectorTerms") or [{}])
    if all((p := _pinned(t)) is not None and not p - avoided for t in existing):
        # Every term names its nodes (a DaemonSet pod's matchFields, a pod pinned by
        # name) and all of them are avoided: the pod would fit no node, ever. It keeps
        # its nodes; the kubelet's rejections count towards the budget as before.
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


_DROP_ANNOTATIONS = (ANN_RESOLVED, ANN_ALLOCATION, ANN_REJECTION,
                     "kubectl.kubernetes.io/last-applied-configuration")


def is_replacement_of(existing: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether ``existing`` (found under the replacement's name) is the replacement this
    operator created for ``pod``: it names the original and its uid."""
    ann = (existing.get("metadata") or {}).get("annotations") or {}
    meta = pod.get("metadata") or {}
    return (ann.get(ANN_REDEPLOY_OF) == meta.get("name")
            and ann.get(ANN_REDEPLOY_OF_UID) == meta.get("uid"))


def build_replacement(pod: Mapping[str, Any], name: str, avoid: list[str]) -> dict[str, Any]:
    """The bare-pod replacement: same labels, annotations (minus what the operator and
    the agent wrote) and spec, without nodeName, with node avoidance. Its ResourceClaims
    are the pod's ``spec.resourceClaims`` as they are: a template's claim is generated
    afresh for it (the rejected pod's goes with that pod), a claim named by
    ``resourceClaimName`` is shared and left alone (never deleted nor changed)."""
    meta = pod.get("metadata") or {}
    ann = {k: v for k, v in (meta.get("annotations") or {}).items()
           if k not in _DROP_ANNOTATIONS and not k.startswith("kopf.zalando.org/")}
    ann[ANN_REDEPLOY_OF] = str(meta.get("name", ""))
    ann[ANN_REDEPLOY_OF_UID] = str(meta.get("uid", ""))
    ann[ANN_REDEPLOY_BASE] = base_name(pod)
    spec = dict(pod.get("spec") or {})
    spec.pop("nodeName", None)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": meta.get("namespace"),
                     "labels": dict(meta.get("labels") or {}), "annotations": ann},
        "spec": with_node_avoidance(spec, avoid),
    }


def has_gate(pod: Mapping[str, Any]) -> bool:
    return any(isinstance(g, Mapping) and g.get("name") == REDEPLOY_GATE
               for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _uids(st: WorkloadState) -> set[str]:
    return {*(st.handled or {}), *(st.gave_up or {}), *(st.released or {})}


def prune(data: dict[str, str], now: float, live: set[str],
          max_bytes: int = MAX_DATA_BYTES) -> list[str]:
    """Remove from ``data`` the records that no longer matter and return their keys.

    A record matters while its workload was rejected within :data:`RESET_AFTER_S` (its
    budget and avoided nodes still apply; :meth:`WorkloadState.expire` resets it after
    that anyway), while it is exhausted (its new pods are held), or while one of the pods
    it decided on is still Failed (``live``: a record lost would redeploy a pod it gave
    up on). A workload that is gone is quiet, so its record goes an hour later. Past
    ``max_bytes`` the quiet-but-young records go too, oldest first, so that a namespace
    with many workloads never outgrows its ConfigMap."""
    removed: list[str] = []
    candidates: list[tuple[float, str]] = []
    for key, text in list(data.items()):
        st = WorkloadState.parse(text)
        if st.exhausted or _uids(st) & live:
            continue
        last = st.last_rejection()
        if now - last > RESET_AFTER_S:
            del data[key]
            removed.append(key)
        else:
            candidates.append((last, key))
    size = sum(len(k) + len(v) for k, v in data.items())
    for _last, key in sorted(candidates):
        if size <= max_bytes:
            break
        size -= len(key) + len(data[key])
        del data[key]
        removed.append(key)
    return removed
