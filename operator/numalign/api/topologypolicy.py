"""TopologyPolicy (``tp``): a Topology Manager policy for the pods of some namespaces."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, model_validator

from .common import (
    CONDITIONS_LIST,
    AtMostEveryPolicy,
    Condition,
    Count,
    DNSLabel,
    LabelSelector,
    Model,
    Policy,
    Scope,
    TopologyOptions,
    cel,
    validations,
)

KIND = "TopologyPolicy"
PLURAL = "topologypolicies"
SINGULAR = "topologypolicy"
SHORT_NAMES = ("tp",)

MAX_REDEPLOY_ATTEMPTS = 20
MAX_PRIORITY = 1_000_000_000

# Condition types in status.conditions.
VALID = "Valid"
CONFLICTING = "Conflicting"


class PodOverrides(Model):
    """Whether pods may choose their own policy with the numalign.io/policy and
    numalign.io/scope annotations."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "self.allowed || !has(self.policies)",
                "policies may only be listed when allowed is true",
                field_path=".policies",
            )
        )
    )

    allowed: bool = False
    """Pods selected by this policy may override it with annotations."""
    policies: (
        Annotated[
            list[Policy],
            Field(min_length=1, json_schema_extra={"x-kubernetes-list-type": "set"}),
            AtMostEveryPolicy(),
        ]
        | None
    ) = None
    """The policies a pod may ask for (unset: any); only with allowed: true."""

    @model_validator(mode="after")
    def _policies_only_when_allowed(self) -> Self:
        if self.policies is not None and not self.allowed:
            raise ValueError("podOverrides.policies may only be listed when allowed is true")
        return self

    def permits(self, policy: str) -> bool:
        return self.allowed and (self.policies is None or policy in self.policies)


class RedeployPolicy(Model):
    """Automatic redeploy of pods rejected with TopologyAffinityError."""

    enabled: bool = True
    """Redeploy rejected pods (a controller-owned pod is deleted so that its controller
    recreates it; a bare pod is recreated from its spec)."""
    max_attempts: Annotated[int, Field(ge=1, le=MAX_REDEPLOY_ATTEMPTS)] = 3
    """Redeploy attempts per replica: a workload's budget is maxAttempts x its
    controller's spec.replicas (1 for bare pods and Jobs). Once it is spent, a further
    rejection is left Failed with a Warning event, and new pods of the workload are held
    by the scheduling gate numalign.io/redeploy until the controller's annotation
    numalign.io/redeploy-reset changes or an hour passes without a rejection."""
    backoff_seconds: Annotated[int, Field(ge=1, le=3600)] = 10
    """Delay before the first redeploy; it doubles with each further round of attempts
    (one attempt per replica). The
    replacement a controller creates at once for a rejected pod is held by the
    scheduling gate numalign.io/redeploy meanwhile."""
    avoid_rejecting_nodes: bool = True
    """Keep replacements off nodes that rejected the same workload recently (never off
    every node the pod may select: then the one that rejected it longest ago is
    retried)."""


class TopologyPolicySpec(Model):
    """The desired policy and which pods and nodes it applies to."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "!has(self.namespaces) || size(self.namespaces) > 0",
                "namespaces must list at least one namespace: omit namespaces (and "
                "namespaceSelector) to select every namespace",
                field_path=".namespaces",
            ),
        )
    )

    policy: Policy
    """The Topology Manager policy: none, best-effort, restricted or single-numa-node."""
    scope: Scope = "container"
    """Align each container on its own (container) or the whole pod at once (pod)."""
    options: TopologyOptions | None = None
    """Topology Manager policy options."""
    namespaces: (
        Annotated[
            list[DNSLabel],
            Field(max_length=256, json_schema_extra={"x-kubernetes-list-type": "set"}),
        ]
        | None
    ) = None
    """Namespaces the policy applies to. With namespaceSelector too, a namespace must be
    listed and match the selector; with neither, every namespace."""
    namespace_selector: LabelSelector | None = None
    """Namespaces (by label) the policy applies to; see namespaces."""
    pod_selector: LabelSelector | None = None
    """Pods (by label) the policy applies to within its namespaces (unset: every pod)."""
    node_selector: LabelSelector | None = None
    """Nodes (by label) whose default policy this becomes (unset: none; the policy still
    applies to its pods wherever they run)."""
    priority: Annotated[int, Field(ge=0, le=MAX_PRIORITY)] = 0
    """Higher wins when several policies match a pod; ties go to the more specific
    selector, then the name. Equal priority and specificity marks both Conflicting."""
    pod_overrides: PodOverrides | None = None
    """Whether the selected pods may override the policy by annotation."""
    redeploy: Annotated[RedeployPolicy, Field(json_schema_extra={"default": {}})] = Field(
        default_factory=RedeployPolicy
    )
    """Redeploy of pods rejected with TopologyAffinityError (on by default)."""

    @model_validator(mode="after")
    def _namespaces_non_empty(self) -> Self:
        if self.namespaces is not None and not self.namespaces:
            raise ValueError(
                "namespaces must list at least one namespace: omit namespaces (and "
                "namespaceSelector) to select every namespace"
            )
        return self

    def matches_namespace(self, name: str, labels: dict[str, str] | None = None) -> bool:
        if self.namespaces is not None and name not in self.namespaces:
            return False
        if self.namespace_selector is not None:
            return self.namespace_selector.matches(labels or {})
        return True

    def matches_pod(self, labels: dict[str, str] | None) -> bool:
        return self.pod_selector is None or self.pod_selector.matches(labels or {})


class TopologyPolicyStatus(Model):
    """What the operator found: validity, conflicts and the pods the policy covers."""

    conditions: Annotated[list[Condition], Field(json_schema_extra=CONDITIONS_LIST)] | None = None
    """Valid (the policy is usable) and Conflicting (another policy of equal priority and
    specificity matches the same pods)."""
    matched_namespaces: list[str] | None = None
    """Namespaces the policy currently selects."""
    namespace_summary: str | None = None
    """matchedNamespaces shortened for kubectl get ("a,b,+3"; "*" for every namespace)."""
    admitted_pods: Count | None = None
    """Pods admitted under this policy."""
    rejected_pods: Count | None = None
    """Pods rejected with TopologyAffinityError under this policy."""
    observed_generation: Count | None = None
    """The metadata.generation this status describes."""


class TopologyPolicy(Model):
    """A TopologyPolicy object as a whole (metadata kept as a plain mapping)."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["numalign.io/v1alpha1"] = "numalign.io/v1alpha1"
    kind: Literal["TopologyPolicy"] = "TopologyPolicy"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: TopologyPolicySpec
    status: TopologyPolicyStatus | None = None

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))


def namespace_summary(names: list[str], every: bool = False, limit: int = 3) -> str:
    """The NAMESPACES printer column: "*" for every namespace, else the first few names."""
    if every:
        return "*"
    names = sorted(names)
    if len(names) <= limit:
        return ",".join(names)
    return ",".join(names[:limit]) + f",+{len(names) - limit}"


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Policy", "type": "string", "jsonPath": ".spec.policy"},
    {"name": "Scope", "type": "string", "jsonPath": ".spec.scope"},
    {"name": "Priority", "type": "integer", "jsonPath": ".spec.priority"},
    {"name": "Valid", "type": "string",
     "jsonPath": '.status.conditions[?(@.type=="Valid")].status'},
    {
        "name": "Namespaces",
        "type": "string",
        "jsonPath": ".status.namespaceSummary",
        "description": "namespaces the policy selects",
    },
    {
        "name": "Conflicting",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Conflicting")].status',
        "priority": 1,
    },
    {"name": "Admitted", "type": "integer", "jsonPath": ".status.admittedPods", "priority": 1},
    {"name": "Rejected", "type": "integer", "jsonPath": ".status.rejectedPods", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
SELECTABLE_FIELDS = [".spec.policy", ".spec.scope"]
