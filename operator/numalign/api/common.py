"""Shared pieces of the numalign custom resources: the base model, policy names (the
registry's: they become the CRD enums), label selectors, conditions and Kubernetes
quantities.

The models are the single source of the CRD schemas (``numalign.api.crdgen``):
field docstrings become the schema descriptions ``kubectl explain`` shows, pydantic
constraints become enums, defaults and ranges, and ``x-kubernetes-validations``
entries (see :func:`cel`) become CEL rules the API server enforces. Python-side
validators mirror the CEL rules so that code building these objects gets the same
answer the API server would give.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError, core_schema

from numalign.topology import policies
from numalign.topology.machine import MAX_NUMA_NODES as ENGINE_MAX_NUMA_NODES

from .resolved import MIN_MAX_ALLOWABLE_NUMA_NODES

GROUP = "numalign.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "numalign"


class _Checked:
    """A pydantic annotation that checks a value against the registry after its type's
    own validation (``check``), whatever is registered when a model is validated."""

    def check(self, value: Any) -> Any:
        raise NotImplementedError

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))


class _PolicyName(_Checked):
    """A policy name from the registry (``numalign.topology.policies``), checked when a
    model is validated and listed as the schema's enum when a CRD is generated: every
    registered policy, or with ``kubelet`` the kubelet's own four."""

    def __init__(self, kubelet: bool = False) -> None:
        self.kubelet = kubelet

    def allowed(self) -> tuple[str, ...]:
        return policies.kubelet_names() if self.kubelet else policies.names()

    def check(self, value: str) -> str:
        known = (value in self.allowed()) if self.kubelet else policies.known(value)
        if not known:  # worded as pydantic words a Literal's
            raise PydanticCustomError("literal_error", "Input should be {expected}",
                                      {"expected": _one_of(self.allowed())})
        return value

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {"enum": list(self.allowed()), "type": "string"}


class AtMostEveryPolicy(_Checked):
    """A list of policy names no longer than the registry's (``maxItems`` when a CRD is
    generated)."""

    def check(self, value: list[str]) -> list[str]:
        most = len(policies.names())
        if len(value) > most:
            raise PydanticCustomError(
                "too_long", "List should have at most {max_length} items after validation, "
                "not {actual_length}", {"max_length": most, "actual_length": len(value)})
        return value

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        out: dict[str, Any] = handler(schema)
        out["maxItems"] = len(policies.names())
        return out


def _one_of(names: tuple[str, ...]) -> str:
    quoted = [f"'{n}'" for n in names]
    return " or ".join([", ".join(quoted[:-1]), quoted[-1]]) if len(quoted) > 1 else quoted[0]


# A Topology Manager policy: a registered one (Policy) or, in a real kubelet's
# configuration, one of the kubelet's own (KubeletPolicy).
Policy = Annotated[str, _PolicyName()]
KubeletPolicy = Annotated[str, _PolicyName(kubelet=True)]
Scope = Literal["container", "pod"]
SCOPES: tuple[str, ...] = get_args(Scope)

MAX_NUMA_ID = 255
# The alignment engine's limit per machine, and the kubelet's default (and least)
# max-allowable-numa-nodes.
MAX_NUMA_NODES = ENGINE_MAX_NUMA_NODES
KUBELET_MAX_NUMA_NODES = MIN_MAX_ALLOWABLE_NUMA_NODES

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]"
    r"|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
# A Kubernetes quantity: an integer or a string such as "64Gi" or "500m".
Quantity = int | Annotated[str, StringConstraints(pattern=QUANTITY_PATTERN)]
# Bounds that keep every object (and the API server's CEL cost) small.
MAX_MATCH_LABELS = 64
NumaId = Annotated[int, Field(ge=0, le=MAX_NUMA_ID)]
Count = Annotated[int, Field(ge=0)]
# A Linux cpulist: "0-3,8-11"; "" for none.
CpuList = Annotated[str, StringConstraints(pattern=r"^[0-9,\-]*$", max_length=4096)]
DNSLabel = Annotated[
    str, StringConstraints(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]


def cel(
    rule: str, message: str, field_path: str | None = None, reason: str | None = None
) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry (a CEL rule the API server enforces)."""
    out = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    return out


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """``json_schema_extra`` carrying CEL rules for a model or a field."""
    return {"x-kubernetes-validations": list(rules)}


class Model(BaseModel):
    """Base of every custom-resource model: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        use_attribute_docstrings=True,
    )

    def to_dict(self) -> dict[str, Any]:
        """The object as the API server stores it (camelCase, unset fields left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# ---------------------------------------------------------------------------- selectors

SelectorOperator = Literal["In", "NotIn", "Exists", "DoesNotExist"]
LabelValue = Annotated[str, StringConstraints(max_length=63)]


class LabelSelectorRequirement(Model):
    """A label requirement: a key, an operator and (for In / NotIn) values."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0)"
                " : (!has(self.values) || size(self.values) == 0)",
                "values must be non-empty for operator In and NotIn and empty for Exists and "
                "DoesNotExist",
                field_path=".values",
            )
        )
    )

    key: Annotated[str, StringConstraints(min_length=1, max_length=317)]
    """The label key."""
    operator: SelectorOperator
    """In, NotIn, Exists or DoesNotExist."""
    values: Annotated[list[LabelValue], Field(max_length=64)] | None = None
    """The values for In and NotIn; must be empty for Exists and DoesNotExist."""

    @model_validator(mode="after")
    def _values_match_operator(self) -> Self:
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"values must be non-empty for operator {self.operator}")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"values must be empty for operator {self.operator}")
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.operator == "Exists":
            return present
        if self.operator == "DoesNotExist":
            return not present
        inside = present and labels[self.key] in (self.values or [])
        return inside if self.operator == "In" else not inside


class LabelSelector(Model):
    """A Kubernetes label selector; all requirements must hold. An empty selector
    matches everything."""

    match_labels: Annotated[dict[str, LabelValue], Field(max_length=MAX_MATCH_LABELS)] | None = (
        None
    )
    """Labels that must be present with exactly these values."""
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=32)] | None = (
        None
    )
    """Requirements that must all hold."""

    def matches(self, labels: Mapping[str, str]) -> bool:
        for key, value in (self.match_labels or {}).items():
            if labels.get(key) != value:
                return False
        return all(req.matches(labels) for req in self.match_expressions or [])

    @property
    def is_empty(self) -> bool:
        return not self.match_labels and not self.match_expressions


# ---------------------------------------------------------------------------- options


class TopologyOptions(Model):
    """Topology Manager policy options, as the kubelet's topologyManagerPolicyOptions."""

    model_config = ConfigDict(
        json_schema_extra=validations(
            cel(
                f"!has(self.maxAllowableNumaNodes) || self.maxAllowableNumaNodes >= "
                f"{KUBELET_MAX_NUMA_NODES}",
                f"maxAllowableNumaNodes must be at least {KUBELET_MAX_NUMA_NODES} (the kubelet's "
                f"default) and at most {MAX_NUMA_NODES}",
                field_path=".maxAllowableNumaNodes",
            )
        )
    )

    prefer_closest_numa_nodes: bool = False
    """prefer-closest-numa-nodes: among equally narrow NUMA affinities prefer the one with
    the lowest average distance (has no effect under single-numa-node)."""
    max_allowable_numa_nodes: Annotated[int, Field(le=MAX_NUMA_NODES)] | None = None
    """max-allowable-numa-nodes: the largest number of NUMA nodes a machine may have for
    the policy to apply (8 to 64; unset: up to 64, numalign's limit)."""

    @field_validator("max_allowable_numa_nodes")
    @classmethod
    def _max_allowable(cls, n: int | None) -> int | None:
        if n is not None and n < KUBELET_MAX_NUMA_NODES:
            raise ValueError(
                f"maxAllowableNumaNodes must be at least {KUBELET_MAX_NUMA_NODES} (the kubelet's "
                f"default) and at most {MAX_NUMA_NODES}, got {n}"
            )
        return n


# ---------------------------------------------------------------------------- conditions

ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(Model):
    """A status condition, shaped like metav1.Condition."""

    type: Annotated[str, StringConstraints(min_length=1, max_length=316)]
    """The condition's type, e.g. Valid."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: Annotated[str, StringConstraints(max_length=1024)] = ""
    """A CamelCase machine-readable reason for the last transition."""
    message: Annotated[str, StringConstraints(max_length=32768)] = ""
    """A human-readable message about the last transition."""
    last_transition_time: datetime | None = None
    """When the status last changed."""
    observed_generation: Count | None = None
    """The metadata.generation the condition was computed from."""


def set_condition(
    conditions: list[Condition] | None,
    type_: str,
    status: ConditionStatus,
    reason: str = "",
    message: str = "",
    generation: int | None = None,
    now: datetime | None = None,
) -> list[Condition]:
    """Return ``conditions`` with ``type_`` set; lastTransitionTime changes only when the
    status does."""
    out = list(conditions or [])
    stamp = (now or datetime.now(UTC)).replace(microsecond=0)
    for i, cond in enumerate(out):
        if cond.type == type_:
            changed = cond.status != status
            out[i] = Condition(
                type=type_,
                status=status,
                reason=reason,
                message=message,
                last_transition_time=stamp if changed else cond.last_transition_time or stamp,
                observed_generation=generation,
            )
            return out
    out.append(
        Condition(
            type=type_,
            status=status,
            reason=reason,
            message=message,
            last_transition_time=stamp,
            observed_generation=generation,
        )
    )
    return out


def get_condition(conditions: list[Condition] | None, type_: str) -> Condition | None:
    for cond in conditions or []:
        if cond.type == type_:
            return cond
    return None


LIST_MAP = {"x-kubernetes-list-type": "map"}
CONDITIONS_LIST = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
