"""The pod annotations the agent reads and writes (pure: parsing and formatting).

- ``numalign.io/resolved`` (written by the operator): ``{"policy", "scope", "options", "source"}``.
- ``numalign.io/allocation`` (written by the agent): ``{"numaNodes": [...], "containers":
  {NAME: {"cpus": [...], "memory": {"ZONE": bytes}, "devices": {RES: [ids]}}},
  "gpus": {REQUEST: [ids]}}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from numalign.api.resolution import KUBELET_OPTION_NAMES
from numalign.api.resolution import parse_resolved as parse_shared_resolved
from numalign.topology.policy import OPTION_MAX_ALLOWABLE_NUMA_NODES, POLICIES, SCOPES

RESOLVED = "numalign.io/resolved"
ALLOCATION = "numalign.io/allocation"


# Either spelling -> the kubelet's (what the engine takes).
OPTION_NAMES = {**KUBELET_OPTION_NAMES, **{k: k for k in KUBELET_OPTION_NAMES.values()}}


class AnnotationError(ValueError):
    """A malformed annotation; the message names the annotation and the problem."""


@dataclass(frozen=True)
class Resolved:
    """The policy a pod is admitted with, and where it came from."""

    policy: str = "none"
    scope: str = "container"
    options: Mapping[str, str] = field(default_factory=dict)
    source: str = "none"

    def to_json(self) -> dict[str, Any]:
        return {"policy": self.policy, "scope": self.scope, "options": dict(self.options),
                "source": self.source}


NONE = Resolved()


def normalize_options(raw: Any, where: str) -> dict[str, str]:
    """Options as the kubelet spells them, values as strings ("true", "8")."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise AnnotationError(f"{where}: options must be an object, got {type(raw).__name__}")
    out: dict[str, str] = {}
    for k, v in raw.items():
        name = OPTION_NAMES.get(str(k))
        if name is None:
            raise AnnotationError(f"{where}: unknown option {k!r}")
        if v is None:
            continue
        if isinstance(v, bool):
            out[name] = "true" if v else "false"
        elif isinstance(v, int | str):
            out[name] = str(v).lower() if isinstance(v, str) else str(v)
        else:
            raise AnnotationError(f"{where}: option {k!r} must be a boolean, integer or string")
    if OPTION_MAX_ALLOWABLE_NUMA_NODES in out:
        try:
            n = int(out[OPTION_MAX_ALLOWABLE_NUMA_NODES])
        except ValueError:
            raise AnnotationError(f"{where}: option maxAllowableNumaNodes must be an integer") \
                from None
        if n < 8:
            raise AnnotationError(f"{where}: option maxAllowableNumaNodes must be >= 8, got {n}")
    return out


def resolved_from_spec(spec: Mapping[str, Any] | None) -> Resolved:
    """The node default pushed into ``NodeTopology.spec`` (bad fields fall back to none)."""
    if not spec:
        return NONE
    policy = spec.get("policy")
    if policy not in POLICIES:
        return NONE
    scope = spec.get("scope") or "container"
    if scope not in SCOPES:
        scope = "container"
    try:
        options = normalize_options(spec.get("options"), "NodeTopology.spec")
    except AnnotationError:
        options = {}
    return Resolved(policy=str(policy), scope=str(scope), options=options,
                    source="node-default" if policy != "none" or spec.get("policy") else "none")


def parse_resolved(value: str) -> Resolved:
    """Parse ``numalign.io/resolved``; raises AnnotationError naming what is wrong."""
    where = f"annotation {RESOLVED}"
    try:
        doc = json.loads(value)
    except ValueError as e:
        raise AnnotationError(f"{where} is not valid JSON: {e}") from None
    if not isinstance(doc, Mapping):
        raise AnnotationError(f"{where} must be a JSON object")
    policy = doc.get("policy")
    if policy not in POLICIES:
        raise AnnotationError(f"{where}: policy must be one of {', '.join(POLICIES)}, "
                              f"got {policy!r}")
    scope = doc.get("scope", "container")
    if scope is None:
        scope = "container"
    if scope not in SCOPES:
        raise AnnotationError(f"{where}: scope must be container or pod, got {scope!r}")
    options = normalize_options(doc.get("options"), where)
    source = doc.get("source", "pod")
    if not isinstance(source, str) or not source:
        raise AnnotationError(f"{where}: source must be a non-empty string")
    return Resolved(policy=str(policy), scope=str(scope), options=options, source=source)


def resolve_pod(pod: Mapping[str, Any], default: Resolved) -> tuple[Resolved, str | None]:
    """The pod's policy: its resolved annotation, else ``default``. Also the problem
    with a malformed annotation (then ``default`` is used)."""
    ann = ((pod.get("metadata") or {}).get("annotations") or {}).get(RESOLVED)
    if ann is None:
        return default, None
    shared = parse_shared_resolved(str(ann))
    if shared is not None and shared.deferred:
        # The operator resolved the pod before it was bound: rule 3, this node's default.
        return default, None
    try:
        return parse_resolved(str(ann)), None
    except AnnotationError as e:
        return default, str(e)


@dataclass
class ContainerAllocation:
    cpus: list[int] = field(default_factory=list)
    memory: dict[str, int] = field(default_factory=dict)  # zone ("0") -> bytes, all kinds
    devices: dict[str, list[str]] = field(default_factory=dict)
    numa_nodes: list[int] | None = None
    hugepages: dict[str, dict[str, int]] = field(default_factory=dict)  # size -> zone -> bytes
    # the NUMA nodes the container's memory may use (the memory manager's block affinity;
    # set even when it took no bytes of its own, reusing its init container's memory)
    memory_numa_nodes: list[int] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cpus": list(self.cpus), "memory": dict(self.memory),
                               "devices": {k: list(v) for k, v in self.devices.items()}}
        if self.numa_nodes is not None:
            out["numaNodes"] = list(self.numa_nodes)
        if self.hugepages:
            out["hugepages"] = {k: dict(v) for k, v in self.hugepages.items()}
        if self.memory_numa_nodes is not None:
            out["memoryNumaNodes"] = list(self.memory_numa_nodes)
        return out


@dataclass
class Allocation:
    """What one admitted pod holds."""

    numa_nodes: list[int] = field(default_factory=list)
    containers: dict[str, ContainerAllocation] = field(default_factory=dict)
    gpus: dict[str, list[str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"numaNodes": list(self.numa_nodes),
                "containers": {k: v.to_json() for k, v in self.containers.items()},
                "gpus": {k: list(v) for k, v in self.gpus.items()}}

    def to_annotation(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    @property
    def cpus(self) -> list[int]:
        return sorted({c for ca in self.containers.values() for c in ca.cpus})

    @property
    def devices(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for ca in self.containers.values():
            for r, ids in ca.devices.items():
                out.setdefault(r, []).extend(ids)
        return {r: sorted(set(v)) for r, v in sorted(out.items())}

    @property
    def memory(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for ca in self.containers.values():
            for z, b in ca.memory.items():
                out[z] = out.get(z, 0) + b
        return dict(sorted(out.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0))


def _int_list(v: Any, where: str) -> list[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                          for x in v):
        raise AnnotationError(f"{where} must be a list of integers")
    return [int(x) for x in v]


def _str_lists(v: Any, where: str) -> dict[str, list[str]]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise AnnotationError(f"{where} must be an object")
    out: dict[str, list[str]] = {}
    for k, ids in v.items():
        if not isinstance(ids, list):
            raise AnnotationError(f"{where}.{k} must be a list of ids")
        out[str(k)] = [str(i) for i in ids]
    return out


def _bytes_per_zone(raw: Any, where: str) -> dict[str, int]:
    if not isinstance(raw, Mapping):
        raise AnnotationError(f"{where} must be an object")
    out: dict[str, int] = {}
    for z, b in raw.items():
        if isinstance(b, str) and b.isdigit():
            b = int(b)
        if not isinstance(b, int) or isinstance(b, bool):
            raise AnnotationError(f"{where}.{z} must be an integer (bytes)")
        out[str(z)] = b
    return out


def allocation_from_json(doc: Any, where: str = f"annotation {ALLOCATION}") -> Allocation:
    if not isinstance(doc, Mapping):
        raise AnnotationError(f"{where} must be a JSON object")
    numa = _int_list(doc.get("numaNodes") or [], f"{where}.numaNodes")
    containers: dict[str, ContainerAllocation] = {}
    raw_c = doc.get("containers") or {}
    if not isinstance(raw_c, Mapping):
        raise AnnotationError(f"{where}.containers must be an object")
    for name, c in raw_c.items():
        w = f"{where}.containers.{name}"
        if not isinstance(c, Mapping):
            raise AnnotationError(f"{w} must be an object")
        mem_raw = c.get("memory") or {}
        if not isinstance(mem_raw, Mapping):
            raise AnnotationError(f"{w}.memory must be an object")
        memory = _bytes_per_zone(mem_raw, f"{w}.memory")
        hp_raw = c.get("hugepages") or {}
        if not isinstance(hp_raw, Mapping):
            raise AnnotationError(f"{w}.hugepages must be an object")
        hugepages = {str(k): _bytes_per_zone(v, f"{w}.hugepages.{k}") for k, v in hp_raw.items()}
        numa_raw = c.get("numaNodes")
        mem_numa_raw = c.get("memoryNumaNodes")
        containers[str(name)] = ContainerAllocation(
            cpus=_int_list(c.get("cpus") or [], f"{w}.cpus"), memory=memory,
            devices=_str_lists(c.get("devices"), f"{w}.devices"),
            numa_nodes=None if numa_raw is None else _int_list(numa_raw, f"{w}.numaNodes"),
            hugepages=hugepages,
            memory_numa_nodes=None if mem_numa_raw is None
            else _int_list(mem_numa_raw, f"{w}.memoryNumaNodes"))
    return Allocation(numa_nodes=numa, containers=containers,
                      gpus=_str_lists(doc.get("gpus"), f"{where}.gpus"))


def parse_allocation(value: str) -> Allocation:
    try:
        doc = json.loads(value)
    except ValueError as e:
        raise AnnotationError(f"annotation {ALLOCATION} is not valid JSON: {e}") from None
    return allocation_from_json(doc)
