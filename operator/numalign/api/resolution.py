"""Policy resolution: which Topology Manager policy applies to a pod, and why.

One pure function, :func:`resolve`, used by the operator (mutating webhook, backstop
handler, redeploy settings); the rules (pod override, then the best-ranked matching
TopologyPolicy, then the node's default, else ``none``) are in the README (section
"TopologyPolicy"). An unbound pod that no policy matches gets the
*deferred* value (:data:`numalign.api.resolved.DEFERRED`): the agent admits it with its
node's default, the operator rewrites it once the pod is bound. Policies are read
through the CRD's own model (:class:`~numalign.api.topologypolicy.TopologyPolicySpec`);
an invalid one never matches.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from numalign.topology import policies as registry
from numalign.topology.policyconfig import SCOPES
from numalign.topology.text import clip, printable, quote

from .names import ANN_POLICY, ANN_SCOPE, SOURCE_POD, SOURCE_POLICY_PREFIX
from .resolved import DEFERRED, Resolved, parse_options
from .resolved import node_default as wire_node_default
from .selectors import selector_size, selectors_disjoint
from .topologypolicy import RedeployPolicy, TopologyPolicySpec


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


def _str_map(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v) for k, v in value.items() if v is not None}


# ---------------------------------------------------------------------------
# Policies: the CRD's model, validated once per object version


def _problem(err: Any) -> str:
    loc = ".".join(clip(p) for p in ("spec", *err["loc"]) if p != "")
    return f"{loc}: {printable(str(err['msg']).removeprefix('Value error, '))}"


def parse_spec(spec: Any) -> tuple[TopologyPolicySpec | None, tuple[str, ...]]:
    """A TopologyPolicy spec as the CRD's model (:class:`TopologyPolicySpec`, the one the
    CRD schema is generated from; strict: no coercion the API server would not do), or
    None and everything wrong with it, each naming the field."""
    if not isinstance(spec, Mapping):
        return None, ("spec: must be an object",)
    try:
        return TopologyPolicySpec.model_validate(spec, strict=True), ()
    except ValidationError as e:
        return None, tuple(_problem(err) for err in e.errors())


def policy_problems(spec: Any) -> list[str]:
    """Everything wrong with one TopologyPolicy spec (empty list: valid).

    The API server's schema and CEL rules refuse these already; this is what the
    operator's ``Valid`` condition reports and how it skips policies that slipped past
    (older CRD, webhook down)."""
    return list(parse_spec(spec)[1])


_PARSED: dict[tuple[str, str], tuple[TopologyPolicySpec | None, tuple[str, ...]]] = {}
_PARSED_LOCK = threading.Lock()


@dataclass(frozen=True)
class PolicyRef:
    """A TopologyPolicy by name with its spec (a mapping as in the API object) and the
    spec's model (None when invalid; then :attr:`problems` says why)."""

    name: str
    spec: Mapping[str, Any]
    model: TopologyPolicySpec | None = field(default=None, compare=False)
    problems: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.model is None and not self.problems:
            model, problems = parse_spec(self.spec)
            object.__setattr__(self, "model", model)
            object.__setattr__(self, "problems", problems)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PolicyRef:
        """From a TopologyPolicy object; its spec is validated once per resourceVersion."""
        meta = obj.get("metadata") or {}
        raw = obj.get("spec") or {}
        spec = raw if isinstance(raw, Mapping) else {}
        name = str(meta.get("name", ""))
        version = meta.get("resourceVersion")
        if not version:
            return cls(name, spec)
        key = (name, str(version))
        with _PARSED_LOCK:
            hit = _PARSED.get(key)
        if hit is None:
            hit = parse_spec(spec)
            with _PARSED_LOCK:
                if len(_PARSED) > 4096:
                    _PARSED.clear()
                _PARSED[key] = hit
        return cls(name, spec, *hit)


def policy_refs(objs: Sequence[Mapping[str, Any]]) -> list[PolicyRef]:
    return [PolicyRef.from_object(o) for o in objs]


# ---------------------------------------------------------------------------
# Matching and ranking (valid policies only)


def specificity(m: TopologyPolicySpec) -> tuple[int, int, int]:
    """How specific a policy's pod matching is; compared lexicographically, larger wins.

    (podSelector requirement count, namespace rank: explicit ``namespaces`` list 2,
    ``namespaceSelector`` 1, every namespace 0, namespaceSelector requirement count).
    """
    ns_rank = 2 if m.namespaces else (1 if m.namespace_selector is not None else 0)
    return (selector_size(m.pod_selector), ns_rank, selector_size(m.namespace_selector))


def _rank(ref: PolicyRef) -> tuple[int, tuple[int, int, int]]:
    m = ref.model
    return (0, (0, 0, 0)) if m is None else (m.priority, specificity(m))


def rank_key(ref: PolicyRef) -> tuple[int, tuple[int, int, int], str]:
    return (*_rank(ref), ref.name)


def _ordered(matches: Iterable[PolicyRef]) -> list[PolicyRef]:
    # Highest priority, then most specific, then smallest name.
    def key(r: PolicyRef) -> tuple[int, tuple[int, ...], str]:
        prio, spec = _rank(r)
        return (-prio, tuple(-x for x in spec), r.name)
    return sorted(matches, key=key)


def namespace_matches(m: TopologyPolicySpec, namespace: str,
                      namespace_labels: Mapping[str, str]) -> bool:
    return m.matches_namespace(namespace, dict(namespace_labels))


def policy_options(m: TopologyPolicySpec | None) -> dict[str, Any]:
    """The options a policy sets (only those given), as the policy spells them."""
    if m is None or m.options is None:
        return {}
    return m.options.model_dump(by_alias=True, exclude_unset=True, exclude_none=True)


def matching_policies(pod: PodMeta, namespace_labels: Mapping[str, str],
                      policies: Iterable[PolicyRef]) -> list[PolicyRef]:
    """The valid policies matching the pod, best first."""
    return _ordered(p for p in policies
                    if p.model is not None
                    and namespace_matches(p.model, pod.namespace, namespace_labels)
                    and p.model.matches_pod(dict(pod.labels)))


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
    po = winner.model.pod_overrides if winner is not None and winner.model else None
    allowed = po is not None and po.allowed
    allowed_policies: list[str] = (list(po.policies or registry.names())
                                   if po is not None and allowed else [])
    if not allowed:
        why = (f"TopologyPolicy/{winner.name} does not allow pod overrides"
               if winner is not None else "no TopologyPolicy that matches this pod allows them")
        keys = [k for k, v in ((ANN_POLICY, raw_pol), (ANN_SCOPE, raw_scope)) if v is not None]
        problems.append(f"{' and '.join(keys)}: overrides are not allowed here ({why}); "
                        "remove the annotation")
        return None, None, problems
    if pol is not None and pol not in allowed_policies:
        what = "is not a policy" if not registry.known(pol) else (
            f"is not allowed by TopologyPolicy/{winner.name if winner else '?'}")
        problems.append(f"{ANN_POLICY}: {quote(raw_pol)} {what}; allowed values: "
                        f"{', '.join(allowed_policies)}")
    if scope is not None and scope not in SCOPES:
        problems.append(f"{ANN_SCOPE}: {quote(raw_scope)} is not a scope; allowed values: "
                        f"{', '.join(SCOPES)}")
    if problems:
        return None, None, problems
    return pol, scope, []


def _node_default_result(node_default: Mapping[str, Any] | _Unknown | None,
                         problems: tuple[str, ...]) -> Resolved:
    if isinstance(node_default, _Unknown):
        return replace(DEFERRED, problems=problems)
    return replace(wire_node_default(node_default), problems=problems)


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
    if len(ranked) > 1 and _rank(ranked[0]) == _rank(ranked[1]):
        top = _rank(ranked[0])
        conflicting = tuple(r.name for r in ranked if _rank(r) == top)
    pol, scope, problems = _override_problems(pod, winner)
    probs = tuple(problems)
    if winner is not None and winner.model is not None:
        m = winner.model
        opts = parse_options(policy_options(m), "spec.options")
        if pol is not None or scope is not None:
            return Resolved(pol or m.policy, scope or m.scope, opts, SOURCE_POD,
                            governing=winner.name, conflicting=conflicting)
        return Resolved(m.policy, m.scope, opts, SOURCE_POLICY_PREFIX + winner.name,
                        governing=winner.name, problems=probs, conflicting=conflicting)
    return _node_default_result(node_default, probs)


def node_default_for(node_labels: Mapping[str, str],
                     policies: Iterable[PolicyRef]) -> tuple[PolicyRef | None, tuple[str, ...]]:
    """The policy that sets a node's default: the valid policies whose ``nodeSelector``
    matches the node, ranked by priority, then nodeSelector size, then name.

    Returns (winner or None, names of equally-ranked rivals including the winner when
    there is a tie, else ())."""
    labels = dict(node_labels)

    def key(r: PolicyRef) -> tuple[int, int]:
        assert r.model is not None
        return (r.model.priority, selector_size(r.model.node_selector))

    cands = [p for p in policies
             if p.model is not None and p.model.node_selector is not None
             and p.model.node_selector.matches(labels)]
    if not cands:
        return None, ()
    cands.sort(key=lambda r: (-key(r)[0], -key(r)[1], r.name))
    tied = tuple(r.name for r in cands if key(r) == key(cands[0]))
    return cands[0], (tied if len(tied) > 1 else ())


def node_spec_from(ref: PolicyRef | None) -> dict[str, Any]:
    """The NodeTopology.spec content (without policyGeneration) a node-default pushes."""
    if ref is None or ref.model is None:
        return {}
    return {"policy": ref.model.policy, "scope": ref.model.scope,
            "options": policy_options(ref.model)}


# ---------------------------------------------------------------------------
# Policy-level views: conflicts, matched namespaces, redeploy settings


def matched_namespaces(ref: PolicyRef,
                       namespaces: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The existing namespaces a valid policy selects (none for an invalid one)."""
    m = ref.model
    if m is None:
        return []
    return sorted(n for n, labels in namespaces.items() if namespace_matches(m, n, labels))


def conflicts(policies: Sequence[PolicyRef],
              namespaces: Mapping[str, Mapping[str, str]]) -> dict[str, list[str]]:
    """For each valid policy, the other policies it conflicts with: equal priority and
    equal specificity, at least one existing namespace matched by both, and pod
    selectors that can match the same pod."""
    valid = [p for p in policies if p.model is not None]
    out: dict[str, list[str]] = {p.name: [] for p in valid}
    for i, a in enumerate(valid):
        for b in valid[i + 1:]:
            assert a.model is not None and b.model is not None
            if _rank(a) != _rank(b):
                continue
            if selectors_disjoint(a.model.pod_selector, b.model.pod_selector):
                continue
            if not set(matched_namespaces(a, namespaces)) & set(
                    matched_namespaces(b, namespaces)):
                continue
            out[a.name].append(b.name)
            out[b.name].append(a.name)
    return {k: sorted(v) for k, v in out.items()}


def redeploy_settings(ref: PolicyRef | None) -> RedeployPolicy:
    """A policy's ``redeploy`` block with the CRD's defaults (also for pods that no
    policy governs: a real kubelet's rejections are redeployed too)."""
    if ref is None or ref.model is None:
        return RedeployPolicy()
    return ref.model.redeploy
