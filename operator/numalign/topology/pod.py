"""A pure model of a pod as the kubelet sees it at admission.

Parsed from a Kubernetes Pod as a plain mapping (from YAML or JSON). Holds what the
Topology Manager's hint providers look at: containers in start order (init containers,
restartable ones being sidecars, then app containers), requests and limits per resource,
the QoS class computed as ``GetPodQOS`` does, and the pod's effective request as the
kubelet's resource helpers compute it for the pod scope::

    max(largest init container (plus the sidecars started before it),
        sum of app containers + sum of sidecars)

API defaulting is applied: a resource with a limit and no request requests its limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal, TypeVar

from .errors import TopologyError
from .quantity import parse_quantity

QOS_GUARANTEED = "Guaranteed"
QOS_BURSTABLE = "Burstable"
QOS_BEST_EFFORT = "BestEffort"

HUGEPAGES_PREFIX = "hugepages-"

ContainerKind = Literal["init", "app"]


def is_hugepages(resource: str) -> bool:
    return resource.startswith(HUGEPAGES_PREFIX)


def is_extended(resource: str) -> bool:
    """An extended resource (``vendor.com/thing``), as served by device plugins."""
    return "/" in resource and not resource.startswith("kubernetes.io/")


@dataclass(frozen=True)
class Container:
    name: str
    kind: ContainerKind
    index: int  # position in its list (initContainers or containers)
    restartable: bool  # an init container with restartPolicy Always (a sidecar)
    requests: Mapping[str, Decimal]  # after defaulting from limits
    limits: Mapping[str, Decimal]

    @property
    def path(self) -> str:
        """Where the container is in the pod, for error messages."""
        lst = "initContainers" if self.kind == "init" else "containers"
        return f"spec.{lst}[{self.index}]"

    def request(self, resource: str) -> Decimal:
        return self.requests.get(resource, Decimal(0))

    @property
    def is_init(self) -> bool:
        """A plain (run-to-completion) init container, whose resources app containers reuse."""
        return self.kind == "init" and not self.restartable


@dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    uid: str
    annotations: Mapping[str, str]
    init_containers: tuple[Container, ...]
    containers: tuple[Container, ...]
    qos: str = field(default=QOS_BEST_EFFORT)

    @property
    def all_containers(self) -> tuple[Container, ...]:
        """Init containers in order, then app containers: the kubelet's admission order."""
        return self.init_containers + self.containers

    def container(self, name: str) -> Container:
        for c in self.all_containers:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def resources(self) -> list[str]:
        """Every resource any container requests, sorted."""
        return sorted({r for c in self.all_containers for r in c.requests})

    def effective(self, value: Callable[[Container], int]) -> int:
        """The pod-scope amount of a per-container quantity ``value``, as the kubelet sums it."""
        return effective_request(self.init_containers, self.containers, value, 0)

    def effective_requests(self) -> dict[str, Decimal]:
        """Effective request per resource (the pod-scope request)."""
        out: dict[str, Decimal] = {}
        for res in self.resources:
            out[res] = effective_request(self.init_containers, self.containers,
                                         lambda c, r=res: c.request(r),  # type: ignore[misc]
                                         Decimal(0))
        return {k: v for k, v in out.items() if v}


Amount = TypeVar("Amount", int, Decimal)


def effective_request(inits: Iterable[Container], apps: Iterable[Container],
                      value: Callable[[Container], Amount], zero: Amount) -> Amount:
    """max(largest init container + sidecars started before it, apps + all sidecars);
    ``zero`` is 0 or ``Decimal(0)``, as ``value`` gives."""
    sidecars = zero
    init_peak = zero
    for c in inits:
        v = value(c)
        if c.restartable:
            sidecars += v
        else:
            init_peak = max(init_peak, sidecars + v)
    running = sum((value(c) for c in apps), zero) + sidecars
    return max(init_peak, running)


def compute_qos(containers: Iterable[Container]) -> str:
    """The pod's QoS class, as Kubernetes' GetPodQOS computes it (cpu and memory only)."""
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    for c in containers:
        for name, q in c.requests.items():
            if name in ("cpu", "memory") and q > 0:
                requests[name] = requests.get(name, Decimal(0)) + q
        found: set[str] = set()
        for name, q in c.limits.items():
            if name in ("cpu", "memory") and q > 0:
                found.add(name)
                limits[name] = limits.get(name, Decimal(0)) + q
        if not {"cpu", "memory"} <= found:
            guaranteed = False
    if not requests and not limits:
        return QOS_BEST_EFFORT
    if guaranteed:
        for name, req in requests.items():
            if limits.get(name) != req:
                guaranteed = False
                break
    if guaranteed and len(requests) == len(limits):
        return QOS_GUARANTEED
    return QOS_BURSTABLE


# ---------------------------------------------------------------- parsing


def _mapping(v: Any, where: str, required: bool = False) -> Mapping[str, Any]:
    if v is None:
        if required:
            raise TopologyError(where, "is required")
        return {}
    if not isinstance(v, Mapping):
        raise TopologyError(where, f"must be a mapping, got {type(v).__name__}")
    return v


def _resources(raw: Any, where: str) -> dict[str, Decimal]:
    out: dict[str, Decimal] = {}
    for k, v in _mapping(raw, where).items():
        if not isinstance(k, str) or not k:
            raise TopologyError(where, f"resource name {k!r} must be a non-empty string")
        w = f"{where}.{k}"
        try:
            q = parse_quantity(v)
        except ValueError as e:
            raise TopologyError(w, str(e)) from None
        if q < 0:
            raise TopologyError(w, f"{v!r} is negative")
        if is_extended(k) and q != q.to_integral_value():
            raise TopologyError(w, f"{v!r}: an extended resource must be a whole number")
        out[k] = q
    return out


def _container(raw: Any, kind: ContainerKind, index: int) -> Container:
    lst = "initContainers" if kind == "init" else "containers"
    where = f"spec.{lst}[{index}]"
    c = _mapping(raw, where, required=True)
    name = c.get("name")
    if not isinstance(name, str) or not name:
        raise TopologyError(f"{where}.name", "must be a non-empty string")
    res = _mapping(c.get("resources"), f"{where}.resources")
    limits = _resources(res.get("limits"), f"{where}.resources.limits")
    requests = _resources(res.get("requests"), f"{where}.resources.requests")
    for k, v in limits.items():
        requests.setdefault(k, v)  # API defaulting: requests default to limits
    for k, v in requests.items():
        if k in limits and v > limits[k]:
            raise TopologyError(f"{where}.resources.requests.{k}",
                                f"request {v} is more than its limit {limits[k]}")
        if is_extended(k) and k in limits and v != limits[k]:
            raise TopologyError(f"{where}.resources.requests.{k}",
                                "must equal its limit (extended resources cannot be overcommitted)")
    restart = c.get("restartPolicy")
    if restart is not None and (kind != "init" or restart != "Always"):
        raise TopologyError(f"{where}.restartPolicy",
                            f"{restart!r}: only an init container may set it, to 'Always'")
    return Container(name=name, kind=kind, index=index, restartable=restart == "Always",
                     requests=requests, limits=limits)


def pod_from_dict(doc: Any, source: str = "") -> Pod:
    """Validate a Pod mapping. Errors are TopologyError naming the field."""
    try:
        return _pod_from_dict(doc)
    except TopologyError as e:
        if source:
            raise TopologyError(f"{source}: {e.field}" if e.field else source, e.problem) from None
        raise


def _pod_from_dict(doc: Any) -> Pod:
    if not isinstance(doc, Mapping):
        raise TopologyError("", "a pod must be a mapping (a Kubernetes Pod object)")
    kind = doc.get("kind", "Pod")
    if kind != "Pod":
        raise TopologyError("kind", f"must be Pod, got {kind!r}")
    meta = _mapping(doc.get("metadata"), "metadata", required=True)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise TopologyError("metadata.name", "must be a non-empty string")
    namespace = meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        raise TopologyError("metadata.namespace", "must be a string")
    uid = meta.get("uid") or f"{namespace}/{name}"
    if not isinstance(uid, str):
        raise TopologyError("metadata.uid", "must be a string")
    annotations_raw = _mapping(meta.get("annotations"), "metadata.annotations")
    annotations: dict[str, str] = {}
    for k, v in annotations_raw.items():
        if not isinstance(v, str):
            raise TopologyError(f"metadata.annotations.{k}", "must be a string")
        annotations[str(k)] = v
    spec = _mapping(doc.get("spec"), "spec", required=True)
    raw_apps = spec.get("containers")
    if not isinstance(raw_apps, list) or not raw_apps:
        raise TopologyError("spec.containers", "must be a non-empty list")
    raw_inits = spec.get("initContainers") or []
    if not isinstance(raw_inits, list):
        raise TopologyError("spec.initContainers", "must be a list")
    inits = tuple(_container(c, "init", i) for i, c in enumerate(raw_inits))
    apps = tuple(_container(c, "app", i) for i, c in enumerate(raw_apps))
    seen: set[str] = set()
    for c in inits + apps:
        if c.name in seen:
            raise TopologyError(f"{c.path}.name", f"container name {c.name!r} is used twice")
        seen.add(c.name)
    return Pod(name=name, namespace=namespace, uid=uid, annotations=annotations,
               init_containers=inits, containers=apps, qos=compute_qos(inits + apps))
