"""Policy resolution: which Topology Manager policy applies to a pod, and why.

ONE pure function, :func:`resolve`, used by the operator (mutating webhook and backstop
pod handler), by the node agent at admission and by ``numalign explain``. No Kubernetes
client, no I/O: inputs are plain mappings as they appear in the API objects.

Rules (first that applies wins):

1. **Pod override** — annotations ``numalign.io/policy`` and/or ``numalign.io/scope``,
   valid only if the TopologyPolicy that rule 2 selects for the pod allows overrides
   (``podOverrides.allowed``) and lists the requested policy in ``podOverrides.policies``
   (an absent list allows every policy). A scope-only override keeps that policy's
   policy; a policy-only override keeps its scope. The options come from that policy.
   Source ``pod``.
2. **TopologyPolicy** — among the *valid* policies whose namespace part
   (listed in ``namespaces`` AND matching ``namespaceSelector``, each when set;
   neither = every namespace) AND
   ``podSelector`` (absent = every pod) match, the highest ``priority``; ties go to the
   more specific selector (see :func:`specificity`), then to the lexically smallest
   name. Two matches with equal priority and equal specificity are a conflict: the
   name still decides (so the answer is deterministic) and both are reported in
   :attr:`Resolved.conflicting` (the operator marks them ``Conflicting``).
   Source ``TopologyPolicy/<name>``.
3. **Node default** — the node's ``NodeTopology.spec`` (policy, scope, options), source
   ``node-default``; when the node has none, ``none`` / ``container``, source ``none``.

An invalid override never wins: :attr:`Resolved.problems` says what is wrong and which
values are allowed (the validating webhook refuses the pod with that message; without
the webhook the operator emits a Warning event) and the pod gets the rule 2/3 policy.

**nodeSelector.** Resolution happens when the pod is created, before it is scheduled,
so a policy's ``nodeSelector`` does not take part in rules 1-2: a policy matches pods by
namespace and podSelector wherever they land. A ``nodeSelector`` *additionally* makes
the policy the default of every node it selects (:func:`node_default_for`): the
operator pushes it into that node's ``NodeTopology.spec`` and rule 3 applies it to
pods that no policy matches. A policy without a nodeSelector sets no node default.

**Unbound pods and rule 3.** When the operator resolves a pod before it is bound it
does not know the node, so rule 3 yields a *deferred* result: source ``node-default``
with ``policy``/``scope`` null in the annotation. The agent completes it at admission
with :func:`complete_for_node` (its own ``NodeTopology.spec``); the operator rewrites
the annotation with the concrete values once the pod is bound.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from numalign.topology import jsontext
from numalign.topology.policy import (
    OPTION_MAX_ALLOWABLE_NUMA_NODES,
    OPTION_PREFER_CLOSEST_NUMA_NODES,
    POLICIES,
    SCOPES,
)

from .selectors import selector_matches, selector_problems, selector_size, selectors_disjoint

# A TopologyPolicy's option name -> the kubelet's (what the engine takes).
KUBELET_OPTION_NAMES: dict[str, str] = {
    "preferClosestNumaNodes": OPTION_PREFER_CLOSEST_NUMA_NODES,
    "maxAllowableNumaNodes": OPTION_MAX_ALLOWABLE_NUMA_NODES,
}
OPTION_KEYS: tuple[str, ...] = tuple(KUBELET_OPTION_NAMES)
MIN_MAX_ALLOWABLE_NUMA_NODES = 8
MAX_MAX_ALLOWABLE_NUMA_NODES = 64

ANN_POLICY = "numalign.io/policy"
ANN_SCOPE = "numalign.io/scope"
ANN_RESOLVED = "numalign.io/resolved"
# A resolution is ~200 bytes; anything much larger is not one.
MAX_RESOLVED_BYTES = 4096

SOURCE_POD = "pod"
SOURCE_NODE_DEFAULT = "node-default"
SOURCE_NONE = "none"
SOURCE_POLICY_PREFIX = "TopologyPolicy/"

DEFAULT_SCOPE = "container"


class _Unknown:
    """Sentinel type: the pod's node is not known yet (pod not bound)."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NODE_UNKNOWN"


NODE_UNKNOWN = _Unknown()


@dataclass(frozen=True)
class PodMeta:
    """What resolution needs from a pod: its namespace, labels and annotations."""

    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    name: str = ""

    @classmethod
    def from_object(cls, pod: Mapping[str, Any]) -> PodMeta:
        """Build from a pod object (dict); tolerates missing or malformed metadata."""
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        meta = meta if isinstance(meta, Mapping) else {}
        return cls(
            namespace=str(meta.get("namespace") or ""),
            labels=_str_map(meta.get("labels")),
            annotations=_str_map(meta.get("annotations")),
            name=str(meta.get("name") or meta.get("generateName") or ""),
        )


@dataclass(frozen=True)
class PolicyRef:
    """A TopologyPolicy by name with its spec (a mapping as in the API object)."""

    name: str
    spec: Mapping[str, Any]

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PolicyRef:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        return cls(name=str(meta.get("name", "")), spec=spec if isinstance(spec, Mapping) else {})


@dataclass(frozen=True)
class Resolved:
    """The outcome of :func:`resolve`.

    ``policy``/``scope`` are None only for a deferred node default (pod not bound).
    ``governing`` is the TopologyPolicy whose settings (redeploy, overrides) apply to
    the pod, if any; ``problems`` lists what is wrong with the pod's override
    annotations; ``conflicting`` names equally-ranked matching policies.
    """

    policy: str | None
    scope: str | None
    options: Mapping[str, Any]
    source: str
    governing: str | None = None
    problems: tuple[str, ...] = ()
    conflicting: tuple[str, ...] = ()

    @property
    def deferred(self) -> bool:
        return self.policy is None

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "scope": self.scope,
                "options": dict(self.options), "source": self.source}

    def annotation(self) -> str:
        """The value of ``numalign.io/resolved``: compact JSON with sorted keys."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items() if v is not None}


# ---------------------------------------------------------------------------
# Policy validation


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def options_problems(options: Any, where: str = "spec.options") -> list[str]:
    if options is None:
        return []
    if not isinstance(options, Mapping):
        return [f"{where}: must be an object"]
    out: list[str] = []
    for key in sorted(set(options) - set(OPTION_KEYS)):
        out.append(f"{where}.{key}: unknown option; known: {', '.join(OPTION_KEYS)}")
    pc = options.get("preferClosestNumaNodes")
    if pc is not None and not isinstance(pc, bool):
        out.append(f"{where}.preferClosestNumaNodes: must be true or false")
    mx = options.get("maxAllowableNumaNodes")
    if mx is not None and (not _is_int(mx) or not
                           MIN_MAX_ALLOWABLE_NUMA_NODES <= mx <= MAX_MAX_ALLOWABLE_NUMA_NODES):
        out.append(f"{where}.maxAllowableNumaNodes: must be an integer from "
                   f"{MIN_MAX_ALLOWABLE_NUMA_NODES} to {MAX_MAX_ALLOWABLE_NUMA_NODES}, got {mx!r}")
    return out


def policy_problems(spec: Any) -> list[str]:
    """Everything wrong with one TopologyPolicy spec (empty list: valid).

    The API server's schema and CEL rules refuse most of these already; this is what
    the operator's ``Valid`` condition reports and how it skips policies that slipped
    past (older CRD, webhook down)."""
    if not isinstance(spec, Mapping):
        return ["spec: must be an object"]
    out: list[str] = []
    pol = spec.get("policy")
    if pol not in POLICIES:
        out.append(f"spec.policy: {pol!r} is not one of {', '.join(POLICIES)}")
    scope = spec.get("scope")
    if scope is not None and scope not in SCOPES:
        out.append(f"spec.scope: {scope!r} is not one of {', '.join(SCOPES)}")
    out += options_problems(spec.get("options"))
    ns = spec.get("namespaces")
    if ns is not None and not (isinstance(ns, list) and all(isinstance(n, str) for n in ns)):
        out.append("spec.namespaces: must be a list of namespace names")
    for key in ("namespaceSelector", "podSelector", "nodeSelector"):
        out += selector_problems(spec.get(key), f"spec.{key}")
    prio = spec.get("priority")
    if prio is not None and (not _is_int(prio) or prio < 0):
        out.append(f"spec.priority: must be an integer >= 0, got {prio!r}")
    po = spec.get("podOverrides")
    if po is not None:
        if not isinstance(po, Mapping):
            out.append("spec.podOverrides: must be an object")
        else:
            if "allowed" in po and not isinstance(po["allowed"], bool):
                out.append("spec.podOverrides.allowed: must be true or false")
            lst = po.get("policies")
            if lst is not None and not (isinstance(lst, list) and all(p in POLICIES for p in lst)):
                out.append(f"spec.podOverrides.policies: each must be one of {', '.join(POLICIES)}")
    rd = spec.get("redeploy")
    if rd is not None:
        if not isinstance(rd, Mapping):
            out.append("spec.redeploy: must be an object")
        else:
            for key in ("enabled", "avoidRejectingNodes"):
                if key in rd and not isinstance(rd[key], bool):
                    out.append(f"spec.redeploy.{key}: must be true or false")
            for key, lo in (("maxAttempts", 0), ("backoffSeconds", 0)):
                v = rd.get(key)
                if v is not None and (not _is_int(v) or v < lo):
                    out.append(f"spec.redeploy.{key}: must be an integer >= {lo}, got {v!r}")
    return out


def specificity(spec: Mapping[str, Any]) -> tuple[int, int, int]:
    """How specific a policy's pod matching is; compared lexicographically, larger wins.

    (podSelector requirement count, namespace rank: explicit ``namespaces`` list 2,
    ``namespaceSelector`` 1, every namespace 0, namespaceSelector requirement count).
    """
    ns_rank = 2 if spec.get("namespaces") else (1 if spec.get("namespaceSelector") else 0)
    return (selector_size(spec.get("podSelector")), ns_rank,
            selector_size(spec.get("namespaceSelector")))


def namespace_matches(spec: Mapping[str, Any], namespace: str,
                      namespace_labels: Mapping[str, str]) -> bool:
    names = spec.get("namespaces")
    if names is not None and namespace not in names:
        return False
    return selector_matches(spec.get("namespaceSelector"), namespace_labels)


def policy_matches_pod(spec: Mapping[str, Any], pod: PodMeta,
                       namespace_labels: Mapping[str, str]) -> bool:
    return namespace_matches(spec, pod.namespace, namespace_labels) and selector_matches(
        spec.get("podSelector"), pod.labels)


def _priority(spec: Mapping[str, Any]) -> int:
    p = spec.get("priority", 0)
    return p if _is_int(p) else 0


def rank_key(ref: PolicyRef) -> tuple[int, tuple[int, int, int], str]:
    return (_priority(ref.spec), specificity(ref.spec), ref.name)


def _ordered(matches: Iterable[PolicyRef]) -> list[PolicyRef]:
    # Highest priority, then most specific, then smallest name.
    return sorted(matches, key=lambda r: (-_priority(r.spec),
                                          tuple(-x for x in specificity(r.spec)), r.name))


def policy_options(spec: Mapping[str, Any]) -> dict[str, Any]:
    opts = spec.get("options")
    if not isinstance(opts, Mapping):
        return {}
    return {k: opts[k] for k in OPTION_KEYS if k in opts and opts[k] is not None}


def matching_policies(pod: PodMeta, namespace_labels: Mapping[str, str],
                      policies: Iterable[PolicyRef]) -> list[PolicyRef]:
    """The valid policies matching the pod, best first."""
    return _ordered(p for p in policies
                    if not policy_problems(p.spec)
                    and policy_matches_pod(p.spec, pod, namespace_labels))


# ---------------------------------------------------------------------------
# Resolution


def _override_problems(pod: PodMeta, winner: PolicyRef | None) -> tuple[
        str | None, str | None, list[str]]:
    """Validate the override annotations against the rule-2 winner.

    Returns (policy override, scope override, problems)."""
    ann = pod.annotations
    raw_pol = ann.get(ANN_POLICY)
    raw_scope = ann.get(ANN_SCOPE)
    if raw_pol is None and raw_scope is None:
        return None, None, []
    problems: list[str] = []
    pol = raw_pol.strip() if isinstance(raw_pol, str) else None
    scope = raw_scope.strip() if isinstance(raw_scope, str) else None
    po: Mapping[str, Any] = {}
    if winner is not None and isinstance(winner.spec.get("podOverrides"), Mapping):
        po = winner.spec["podOverrides"]
    allowed = bool(po.get("allowed", False))
    allowed_policies: list[str] = list(po.get("policies") or POLICIES) if allowed else []
    if not allowed:
        why = (f"TopologyPolicy/{winner.name} does not allow pod overrides"
               if winner is not None else "no TopologyPolicy that matches this pod allows them")
        keys = [k for k, v in ((ANN_POLICY, raw_pol), (ANN_SCOPE, raw_scope)) if v is not None]
        problems.append(f"{' and '.join(keys)}: overrides are not allowed here ({why}); "
                        "remove the annotation")
        return None, None, problems
    if pol is not None and pol not in allowed_policies:
        what = "is not a policy" if pol not in POLICIES else (
            f"is not allowed by TopologyPolicy/{winner.name if winner else '?'}")
        problems.append(f"{ANN_POLICY}: {raw_pol!r} {what}; allowed values: "
                        f"{', '.join(allowed_policies)}")
    if scope is not None and scope not in SCOPES:
        problems.append(f"{ANN_SCOPE}: {raw_scope!r} is not a scope; allowed values: "
                        f"{', '.join(SCOPES)}")
    if problems:
        return None, None, problems
    return pol, scope, []


def _node_default_result(node_default: Mapping[str, Any] | _Unknown | None,
                         problems: tuple[str, ...]) -> Resolved:
    if isinstance(node_default, _Unknown):
        return Resolved(None, None, {}, SOURCE_NODE_DEFAULT, problems=problems)
    if isinstance(node_default, Mapping) and node_default.get("policy") in POLICIES:
        scope = node_default.get("scope")
        return Resolved(str(node_default["policy"]),
                        scope if scope in SCOPES else DEFAULT_SCOPE,
                        policy_options(node_default), SOURCE_NODE_DEFAULT, problems=problems)
    return Resolved("none", DEFAULT_SCOPE, {}, SOURCE_NONE, problems=problems)


def resolve(pod: PodMeta, namespace_labels: Mapping[str, str] | None,
            policies: Iterable[PolicyRef],
            node_default: Mapping[str, Any] | _Unknown | None = None) -> Resolved:
    """Resolve the policy of one pod (see the module docstring for the rules).

    ``node_default`` is the node's ``NodeTopology.spec`` (or None when it has none), or
    :data:`NODE_UNKNOWN` when the pod is not bound yet (rule 3 is then deferred).
    Never raises on malformed input: bad policies are skipped, bad annotations are
    reported in ``problems``.
    """
    ns_labels = namespace_labels or {}
    ranked = matching_policies(pod, ns_labels, policies)
    winner = ranked[0] if ranked else None
    conflicting: tuple[str, ...] = ()
    if len(ranked) > 1 and (_priority(ranked[0].spec), specificity(ranked[0].spec)) == (
            _priority(ranked[1].spec), specificity(ranked[1].spec)):
        top = (_priority(ranked[0].spec), specificity(ranked[0].spec))
        conflicting = tuple(r.name for r in ranked
                            if (_priority(r.spec), specificity(r.spec)) == top)
    pol, scope, problems = _override_problems(pod, winner)
    probs = tuple(problems)
    if winner is not None:
        wpol = str(winner.spec["policy"])
        wscope = winner.spec.get("scope") or DEFAULT_SCOPE
        opts = policy_options(winner.spec)
        if pol is not None or scope is not None:
            return Resolved(pol or wpol, scope or wscope, opts, SOURCE_POD,
                            governing=winner.name, conflicting=conflicting)
        return Resolved(wpol, wscope, opts, SOURCE_POLICY_PREFIX + winner.name,
                        governing=winner.name, problems=probs, conflicting=conflicting)
    return _node_default_result(node_default, probs)


def node_default_for(node_labels: Mapping[str, str],
                     policies: Iterable[PolicyRef]) -> tuple[PolicyRef | None, tuple[str, ...]]:
    """The policy that sets a node's default: the valid policies whose ``nodeSelector``
    matches the node, ranked by priority, then nodeSelector size, then name.

    Returns (winner or None, names of equally-ranked rivals including the winner when
    there is a tie, else ())."""
    cands = [p for p in policies
             if p.spec.get("nodeSelector") is not None and not policy_problems(p.spec)
             and selector_matches(p.spec.get("nodeSelector"), node_labels)]
    if not cands:
        return None, ()
    cands.sort(key=lambda r: (-_priority(r.spec), -selector_size(r.spec.get("nodeSelector")),
                              r.name))

    def key(r: PolicyRef) -> tuple[int, int]:
        return (_priority(r.spec), selector_size(r.spec.get("nodeSelector")))

    tied = tuple(r.name for r in cands if key(r) == key(cands[0]))
    return cands[0], (tied if len(tied) > 1 else ())


def node_spec_from(ref: PolicyRef | None) -> dict[str, Any]:
    """The NodeTopology.spec content (without policyGeneration) a node-default pushes."""
    if ref is None:
        return {}
    return {"policy": ref.spec["policy"], "scope": ref.spec.get("scope") or DEFAULT_SCOPE,
            "options": policy_options(ref.spec)}


def parse_resolved(text: str | None) -> Resolved | None:
    """Parse a ``numalign.io/resolved`` annotation; None when absent or malformed."""
    if not text:
        return None
    try:
        doc = jsontext.loads(text, ANN_RESOLVED, max_bytes=MAX_RESOLVED_BYTES)
    except ValueError:
        return None
    if not isinstance(doc, Mapping):
        return None
    pol, scope, source = doc.get("policy"), doc.get("scope"), doc.get("source")
    opts = doc.get("options") or {}
    if not isinstance(source, str) or not isinstance(opts, Mapping):
        return None
    if source not in (SOURCE_POD, SOURCE_NODE_DEFAULT, SOURCE_NONE) and not (
            source.startswith(SOURCE_POLICY_PREFIX) and len(source) > len(SOURCE_POLICY_PREFIX)):
        return None
    if pol is None and scope is None and source == SOURCE_NODE_DEFAULT:
        return Resolved(None, None, {}, source)
    if pol not in POLICIES or scope not in SCOPES or options_problems(opts):
        return None
    return Resolved(str(pol), str(scope), dict(opts), source)


def complete_for_node(resolved: Resolved | None,
                      node_default: Mapping[str, Any] | None) -> Resolved:
    """Make a (possibly deferred or missing) resolution concrete on a known node."""
    if resolved is None or resolved.deferred:
        return _node_default_result(node_default, ())
    return resolved


def policy_refs(objs: Sequence[Mapping[str, Any]]) -> list[PolicyRef]:
    return [PolicyRef.from_object(o) for o in objs]


# ---------------------------------------------------------------------------
# Policy-level views: conflicts, matched namespaces, redeploy settings


def matched_namespaces(spec: Mapping[str, Any],
                       namespaces: Mapping[str, Mapping[str, str]]) -> list[str]:
    return sorted(n for n, labels in namespaces.items() if namespace_matches(spec, n, labels))


def conflicts(policies: Sequence[PolicyRef],
              namespaces: Mapping[str, Mapping[str, str]]) -> dict[str, list[str]]:
    """For each valid policy, the other policies it conflicts with: equal priority and
    equal specificity, at least one existing namespace matched by both, and pod
    selectors that can match the same pod."""
    valid = [p for p in policies if not policy_problems(p.spec)]
    out: dict[str, list[str]] = {p.name: [] for p in valid}
    for i, a in enumerate(valid):
        for b in valid[i + 1:]:
            if (_priority(a.spec), specificity(a.spec)) != (_priority(b.spec), specificity(b.spec)):
                continue
            if selectors_disjoint(a.spec.get("podSelector"), b.spec.get("podSelector")):
                continue
            if not set(matched_namespaces(a.spec, namespaces)) & set(
                    matched_namespaces(b.spec, namespaces)):
                continue
            out[a.name].append(b.name)
            out[b.name].append(a.name)
    return {k: sorted(v) for k, v in out.items()}


@dataclass(frozen=True)
class RedeploySettings:
    enabled: bool = True
    max_attempts: int = 3
    backoff_seconds: int = 10
    avoid_rejecting_nodes: bool = True


def redeploy_settings(spec: Mapping[str, Any] | None) -> RedeploySettings:
    """A policy's ``redeploy`` block with the CRD's defaults (also for pods that no
    policy governs: a real kubelet's rejections are redeployed too)."""
    d = RedeploySettings()
    rd = spec.get("redeploy") if isinstance(spec, Mapping) else None
    if not isinstance(rd, Mapping):
        return d
    def _int(key: str, default: int, lo: int) -> int:
        v = rd.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= lo else default
    return RedeploySettings(
        enabled=rd.get("enabled", True) is not False,
        max_attempts=_int("maxAttempts", d.max_attempts, 0),
        backoff_seconds=_int("backoffSeconds", d.backoff_seconds, 0),
        avoid_rejecting_nodes=rd.get("avoidRejectingNodes", True) is not False,
    )
