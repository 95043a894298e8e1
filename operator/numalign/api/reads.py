"""Lenient read models of the objects numalign decides from: a pod (:class:`PodRead`) and a
NodeTopology (:class:`NodeTopologyRead`), each built once from the raw object (a mapping
as the API server sends it) by :meth:`ObjectRead.of`.

What the API's models (:mod:`.nodetopology`) validate strictly for writing, these read
leniently: extra fields are ignored, a malformed part reads as absent (a field of the
wrong type as None, a condition that is not an object as no condition), and building one
never raises. Every decider reads the same fields the same way through them
(:mod:`.effective`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Self, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)

from .names import ANN_RESOLVED, LABEL_MANAGED, MANAGED_NRI
from .nodetopology import NRI_NOT_PLACING, NRI_PLACEMENT

T = TypeVar("T")


def _absent_on_error(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    try:
        return handler(value)
    except ValidationError:
        return None


def _str_map(value: Any) -> dict[str, str] | None:
    """A string map as the API's labels and annotations are: None values dropped, other
    values as text; not a mapping: absent."""
    if not isinstance(value, Mapping):
        return None
    return {str(k): str(v) for k, v in value.items() if v is not None}


def _mapping(value: Any) -> dict[str, Any] | None:
    return dict(value) if isinstance(value, Mapping) else None


def _list(value: Any) -> list[Any]:
    """A list as it is (its items unread); not a list: empty."""
    return value if isinstance(value, list) else []


def _objects(value: Any) -> list[Any]:
    """A list's objects (its other items dropped); not a list: empty."""
    return [x for x in value if isinstance(x, Mapping)] if isinstance(value, list) else []


Lenient = Annotated[T | None, WrapValidator(_absent_on_error)]
StrMap = Annotated[dict[str, str] | None, BeforeValidator(_str_map)]
RawMap = Annotated[dict[str, Any] | None, BeforeValidator(_mapping)]


class ReadModel(BaseModel):
    """The config every read model shares: extra fields ignored, camelCase names as on
    the wire, immutable."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class MetadataRead(ReadModel):
    """An object's ``metadata``: the part numalign reads."""

    name: Lenient[str] = None
    generate_name: Lenient[str] = Field(default=None, validation_alias="generateName")
    namespace: Lenient[str] = None
    uid: Lenient[str] = None
    resource_version: Lenient[str] = Field(default=None, validation_alias="resourceVersion")
    labels: StrMap = None
    annotations: StrMap = None

    def annotation(self, key: str) -> str | None:
        return (self.annotations or {}).get(key)

    def label(self, key: str) -> str | None:
        return (self.labels or {}).get(key)


class ObjectRead(ReadModel):
    """An API object read leniently (:meth:`of`); its kinds add what they read."""

    metadata: Annotated[MetadataRead, WrapValidator(
        lambda v, h: _absent_on_error(v, h) or MetadataRead())] = MetadataRead()

    @classmethod
    def of(cls, obj: Any) -> Self:
        """Read ``obj`` (a mapping, or a read model already); never raises: what is not
        a mapping reads as an empty object."""
        if isinstance(obj, cls):
            return obj
        if not isinstance(obj, Mapping):
            return cls()
        try:
            return cls.model_validate(obj)
        except ValidationError:  # a malformed part the fields did not absorb
            return cls()


class PodRead(ObjectRead):
    """A pod: its metadata (name, namespace, uid, labels, annotations)."""

    @property
    def resolved_annotation(self) -> str | None:
        """The raw ``numalign.io/resolved`` (None: absent)."""
        return self.metadata.annotation(ANN_RESOLVED)


class ConditionRead(ReadModel):
    type: Lenient[str] = None
    status: Lenient[str] = None
    reason: Lenient[str] = None
    message: Lenient[str] = None
    last_transition_time: Lenient[str] = Field(default=None,
                                               validation_alias="lastTransitionTime")


class ZoneRead(ReadModel):
    """One ``status.zones`` entry's amounts: its id (as published); ``total``, its
    allocatable (else its capacity) and ``free``, its available (else its allocatable),
    each resource -> quantity as published; both None when the one given is not an
    object."""

    id: Any = None
    total: RawMap = None
    free: RawMap = None

    @model_validator(mode="before")
    @classmethod
    def _amounts(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        total = data.get("allocatable") or data.get("capacity") or {}
        free = data.get("available") or total
        if not isinstance(total, Mapping) or not isinstance(free, Mapping):
            total = free = None
        return {"id": data.get("id"), "total": total, "free": free}


class SummaryRead(ReadModel):
    """``status.summary``: the printer-column totals (what numalign reads of them: the
    admitted pods, as published)."""

    pods: Any = None


class NodeTopologyStatusRead(ReadModel):
    """A NodeTopology's ``status``: its conditions, what its agent says of the kubelet
    (``kubelet``, as the kubelet's configuration spells it), its zones (an entry that is
    not an object reads as None, so that the others keep their index), its admitted
    pods' entries (as published: :func:`numalign.api.allocation.parse_admitted` reads one) and
    its summary. ``present``: the object has a status (an object) at all."""

    present: bool = Field(default=False, exclude=True)
    conditions: Annotated[list[ConditionRead], BeforeValidator(_objects)] = []
    kubelet: RawMap = None
    zones: Annotated[list[Lenient[ZoneRead]], BeforeValidator(_list)] = []
    admitted: Annotated[list[Any], BeforeValidator(_list)] = []
    summary: Lenient[SummaryRead] = None

    @model_validator(mode="before")
    @classmethod
    def _present(cls, data: Any) -> Any:
        return {**data, "present": True} if isinstance(data, Mapping) else data

    @property
    def admitted_entries(self) -> list[Mapping[str, Any]]:
        """The ``status.admitted`` entries that are objects."""
        return [e for e in self.admitted if isinstance(e, Mapping)]

    @property
    def kubelet_settings(self) -> dict[str, Any] | None:
        """``status.kubelet`` when the node is a real node whose agent reads its kubelet
        (it names the kubelet's ``topologyManagerPolicy``)."""
        return self.kubelet if self.kubelet and self.kubelet.get("topologyManagerPolicy") \
            else None

    def condition(self, kind: str) -> ConditionRead | None:
        return next((c for c in self.conditions if c.type == kind), None)

    @property
    def nri_placing(self) -> bool | None:
        """The ``NRIPlacement`` condition: True while numalign's NRI plugin places the
        node's containers or is about to (registered, starting, the runtime away), False
        when it says the kubelet does (``NotManaged``, ``KubeletManagersOn``), None
        without the condition."""
        cond = self.condition(NRI_PLACEMENT)
        if cond is None:
            return None
        return cond.status == "True" or cond.reason not in NRI_NOT_PLACING

    @property
    def kubelet_policy(self) -> str | None:
        """The kubelet's ``topologyManagerPolicy`` as reported (None: not reported)."""
        value = (self.kubelet or {}).get("topologyManagerPolicy")
        return str(value) if value else None


NO_STATUS = NodeTopologyStatusRead.model_construct()  # a NodeTopology without status


class NodeTopologyRead(ObjectRead):
    """A NodeTopology: its ``spec`` (the node default, a mapping as the operator writes
    it) and ``status``; ``labels``: the Node's labels where the reader knows them."""

    spec: RawMap = None
    status: Annotated[NodeTopologyStatusRead, WrapValidator(
        lambda v, h: _absent_on_error(v, h) or NO_STATUS)] = NO_STATUS
    node_labels: StrMap = Field(default=None, exclude=True)

    def with_node_labels(self, labels: Mapping[str, str] | None) -> NodeTopologyRead:
        """The same read, knowing the Node's labels."""
        return self.model_copy(update={"node_labels": _str_map(labels)})

    @property
    def labelled_nri(self) -> bool | None:
        """The Node's label ``numalign.io/managed=nri`` (None: its labels not known)."""
        if self.node_labels is None:
            return None
        return labelled_nri(self.node_labels)


def labelled_nri(labels: Mapping[str, Any] | None) -> bool:
    """Whether a Node's labels ask numalign's NRI plugin to place its containers
    (``numalign.io/managed=nri``)."""
    return isinstance(labels, Mapping) and labels.get(LABEL_MANAGED) == MANAGED_NRI
