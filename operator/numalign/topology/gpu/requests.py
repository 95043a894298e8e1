"""The ``numalign.io/gpus`` pod annotation: a JSON list of GPU requests.

Each request is an object with:

- ``count`` (integer >= 1, required): how many devices.
- ``minMemory`` (quantity, default 0): every device has at least this much memory.
- ``sameGroup`` (default ``any``): a group level (1-63 letters, digits, '.', '_' or '-');
  all devices of the request share one group of that level. ``numa`` (the device's NUMA
  node) is always available.
- ``withResource``: other devices allocated with the GPUs, in the same group as all of
  them: ``"nvidia.com/hca"`` (one device) or ``{"resource": "nvidia.com/hca", "count": 1,
  "sameGroup": "pcie"}``. The default level is ``pcie`` when both resources have it, else
  the request's ``sameGroup`` when both have it, else ``numa``.
- ``name`` (default ``gpu-<index>``): the request's key in the allocation.
- ``resource`` (default: the machine's GPU resource, the one resource named ``*/gpu``,
  else the one resource whose devices report memory).

Resource names (``resource``, ``withResource``) are Kubernetes extended resource names,
``domain/name``. A message that shows a refused value shows it escaped and cut short
(:mod:`numalign.topology.text`): the messages become Events and pod status.

Several requests are satisfied together and never share a device.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from .. import jsontext
from ..errors import TopologyError
from ..machine import Machine
from ..quantity import format_bytes, quantity_bytes
from ..text import clip, quote_json
from .groups import ANY_LEVEL, NUMA_LEVEL, group_of, level_order

ANNOTATION = "numalign.io/gpus"
MAX_GPUS_BYTES = 16 * 1024
_KEYS = ("count", "minMemory", "sameGroup", "withResource", "name", "resource")
_WITH_KEYS = ("resource", "count", "sameGroup")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
# A group level (``nvlink``, ``pcie``, ``numa``): what a machine file's device groups name.
_LEVEL = _NAME
# An extended resource name: a Kubernetes qualified name with its domain prefix
# (``nvidia.com/gpu``): a DNS-1123 subdomain of at most 253 characters, "/", a name of at
# most 63 characters.
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_RESOURCE = re.compile(rf"(?=[^/]{{1,253}}/){_DNS_LABEL}(\.{_DNS_LABEL})*"
                       r"/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def is_resource_name(v: object) -> TypeGuard[str]:
    """An extended resource name Kubernetes accepts (``vendor.com/thing``)."""
    return isinstance(v, str) and _RESOURCE.fullmatch(v) is not None


@dataclass(frozen=True)
class WithResource:
    """Devices of another resource in the same group (at ``level``) as the request's GPUs."""

    resource: str
    count: int = 1
    level: str | None = None  # None: the default (see the module docstring)


@dataclass(frozen=True)
class GpuRequest:
    """One entry of ``numalign.io/gpus``. ``resource`` None means the machine's GPU resource."""

    name: str
    count: int
    min_memory: int = 0
    min_memory_text: str = ""
    same_group: str = ANY_LEVEL
    resource: str | None = None
    with_resource: WithResource | None = None


def gpu_resource(machine: Machine) -> str:
    """The machine's GPU resource: the one ``*/gpu`` resource, else the one with memory."""
    names = [r for r in machine.device_resources if r.endswith("/gpu")]
    if not names:
        names = sorted({d.resource for d in machine.devices if d.memory is not None})
    if len(names) == 1:
        return names[0]
    if not names:
        raise TopologyError("resource", f"machine {machine.name} has no GPU resource "
                            "(no */gpu resource and no device with memory)")
    raise TopologyError("resource", f"machine {machine.name} has several GPU resources "
                        f"({', '.join(names)}); name one")


def _levels(machine: Machine, resource: str) -> list[str]:
    return level_order(machine.devices_of(resource))


def default_with_level(machine: Machine, gpu_res: str, other: str, same_group: str) -> str:
    """The group level a ``withResource`` shares with the GPUs when it names none."""
    a, b = machine.devices_of(gpu_res), machine.devices_of(other)
    for lvl in ("pcie", same_group):
        if lvl != ANY_LEVEL and any(group_of(d, lvl) for d in a) and any(
                group_of(d, lvl) for d in b):
            return lvl
    return NUMA_LEVEL


def _count(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise TopologyError(where, f"must be an integer >= 1, got {quote_json(v)}")
    return v


def _level(v: Any, where: str, machine: Machine | None, resources: list[str],
           qualify: bool = False) -> str:
    if not isinstance(v, str) or not _LEVEL.fullmatch(v):
        raise TopologyError(where, f"must be a group level name or 'any', got {quote_json(v)}")
    if machine is None or v in (ANY_LEVEL, NUMA_LEVEL):
        return v
    for res in resources:
        if not any(group_of(d, v) for d in machine.devices_of(res)):
            have = _levels(machine, res)
            listed = ", ".join(have) if have else "none"
            who = f"no {res} device" if qualify else "no device"
            raise TopologyError(where, f"{who} has group level {v!r}; levels on this "
                                f"machine: {listed}")
    return v


def _with(v: Any, where: str, machine: Machine | None, gpu_res: str | None,
          same_group: str, count: int) -> WithResource:
    if isinstance(v, str):
        v = {"resource": v}
    if not isinstance(v, Mapping):
        raise TopologyError(where, "must be a resource name or an object with resource, "
                            "count and sameGroup")
    for k in v:
        if k not in _WITH_KEYS:
            raise TopologyError(f"{where}.{clip(k)}",
                                f"unknown key; allowed: {', '.join(_WITH_KEYS)}")
    res = v.get("resource")
    if not is_resource_name(res):
        raise TopologyError(f"{where}.resource", "must be an extended resource name like "
                            f"'nvidia.com/hca', got {quote_json(res)}")
    n = _count(v.get("count", 1), f"{where}.count")
    level: str | None = None
    if "sameGroup" in v:
        level = _level(v["sameGroup"], f"{where}.sameGroup", machine,
                       [res, *([gpu_res] if gpu_res else [])], qualify=True)
        if level == ANY_LEVEL:
            raise TopologyError(f"{where}.sameGroup", "must name a group level, not 'any'")
    if machine is not None:
        if res == gpu_res:
            raise TopologyError(f"{where}.resource", f"is the GPU resource {res} itself")
        have = len(machine.devices_of(res))
        if have < n:
            raise TopologyError(f"{where}.count" if have else f"{where}.resource",
                                f"{n} {res} devices asked, this machine has {have}")
        if level is None and gpu_res is not None:
            level = default_with_level(machine, gpu_res, res, same_group)
    return WithResource(resource=res, count=n, level=level)


def parse_gpu_requests(text: str, machine: Machine | None = None) -> list[GpuRequest]:
    """Parse and validate a ``numalign.io/gpus`` value.

    With ``machine``, requests are also checked against it (group levels, memory, counts)
    and the default resource and ``withResource`` level are filled in. Any problem raises
    a :class:`TopologyError` naming the field (``[0].count``), so a pod is refused rather
    than half-allocated.
    """
    try:
        doc = jsontext.loads(text, "the value", max_bytes=MAX_GPUS_BYTES)
    except ValueError as e:
        raise TopologyError(ANNOTATION, str(e).removeprefix("the value ")) from None
    if not isinstance(doc, list):
        raise TopologyError(ANNOTATION, "must be a JSON list of requests like "
                            '[{"count": 2, "sameGroup": "nvlink"}]')
    if not doc:
        raise TopologyError(ANNOTATION, "must list at least one request")
    default_res: str | None = None
    out: list[GpuRequest] = []
    names: set[str] = set()
    for i, raw in enumerate(doc):
        w = f"[{i}]"
        if not isinstance(raw, Mapping):
            raise TopologyError(w, "must be an object with count and optional minMemory, "
                                "sameGroup, withResource, name, resource")
        for k in raw:
            if k not in _KEYS:
                raise TopologyError(f"{w}.{clip(k)}",
                                    f"unknown key; allowed: {', '.join(_KEYS)}")
        if "count" not in raw:
            raise TopologyError(f"{w}.count", "is required")
        count = _count(raw["count"], f"{w}.count")
        name = raw.get("name", f"gpu-{i}")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise TopologyError(f"{w}.name", "must be 1-63 letters, digits, '.', '_' or '-', "
                                f"got {quote_json(name)}")
        if name in names:
            raise TopologyError(f"{w}.name", f"{name!r} is used by another request")
        names.add(name)
        res = raw.get("resource")
        if res is not None and not is_resource_name(res):
            raise TopologyError(f"{w}.resource", "must be an extended resource name like "
                                f"'nvidia.com/gpu', got {quote_json(res)}")
        if machine is not None:
            if res is None:
                if default_res is None:
                    try:
                        default_res = gpu_resource(machine)
                    except TopologyError as e:
                        raise TopologyError(f"{w}.resource", e.problem) from None
                res = default_res
            elif not machine.devices_of(res):
                raise TopologyError(f"{w}.resource", f"no {res} device on this machine")
        mem_raw = raw.get("minMemory", 0)
        try:
            mem = quantity_bytes(mem_raw)
        except ValueError as e:
            raise TopologyError(f"{w}.minMemory", str(e)) from None
        # as parsed: the quantity without the whitespace around it
        mem_text = mem_raw.strip() if isinstance(mem_raw, str) else str(mem_raw)
        same = _level(raw.get("sameGroup", ANY_LEVEL), f"{w}.sameGroup", machine,
                      [res] if res else [])
        if machine is not None and res is not None:
            devs = machine.devices_of(res)
            if mem > 0:
                best = max((d.memory or 0 for d in devs), default=0)
                if mem > best:
                    raise TopologyError(f"{w}.minMemory", f"{mem_text} is more than any {res} "
                                        f"device has ({format_bytes(best)})")
                big = sum(1 for d in devs if (d.memory or 0) >= mem)
                if big < count:
                    raise TopologyError(f"{w}.count", f"{count} devices with minMemory "
                                        f"{mem_text} asked, this machine has {big}")
            if count > len(devs):
                raise TopologyError(f"{w}.count", f"{count} {res} devices asked, this "
                                    f"machine has {len(devs)}")
        with_res = None
        if raw.get("withResource") is not None:
            with_res = _with(raw["withResource"], f"{w}.withResource", machine, res, same,
                             count)
        out.append(GpuRequest(name=name, count=count, min_memory=mem, min_memory_text=mem_text,
                              same_group=same, resource=res, with_resource=with_res))
    if machine is not None:
        totals: dict[str, int] = {}
        for i, r in enumerate(out):
            for res, n in ((r.resource, r.count),
                           *(((r.with_resource.resource, r.with_resource.count),)
                             if r.with_resource else ())):
                assert res is not None
                totals[res] = totals.get(res, 0) + n
                have = len(machine.devices_of(res))
                if totals[res] > have:
                    raise TopologyError(f"[{i}].count", f"the requests ask {totals[res]} {res} "
                                        f"devices in all, this machine has {have}")
    return out


def resolve_requests(machine: Machine, requests: list[GpuRequest]) -> list[GpuRequest]:
    """Fill in what parsing without a machine left open (resource, withResource level)."""
    out: list[GpuRequest] = []
    default_res: str | None = None
    for r in requests:
        res = r.resource
        if res is None:
            if default_res is None:
                default_res = gpu_resource(machine)
            res = default_res
        wr = r.with_resource
        if wr is not None and wr.level is None:
            wr = WithResource(wr.resource, wr.count,
                              default_with_level(machine, res, wr.resource, r.same_group))
        if res != r.resource or wr is not r.with_resource:
            r = GpuRequest(name=r.name, count=r.count, min_memory=r.min_memory,
                           min_memory_text=r.min_memory_text, same_group=r.same_group,
                           resource=res, with_resource=wr)
        out.append(r)
    return out
