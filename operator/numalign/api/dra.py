"""DRA devices (resource.k8s.io/v1 ResourceSlices) mapped to the node's NUMA nodes (pure).

A driver publishes its devices in ResourceSlices; numalign reads those of its node and
finds each device's NUMA nodes by the first rule that applies:

1. ``resource.kubernetes.io/numaNode`` (KEP-6072): an integer, or a list of equally close
   NUMA nodes (``ints``, behind the ``DRAListTypeAttributes`` gate), physical node first;
2. ``resource.kubernetes.io/pcieRoot`` (``pci<domain>:<bus>``): the NUMA node of the PCI
   devices under that root complex, from the node's sysfs;
3. ``resource.kubernetes.io/pciBusID`` (``DDDD:BB:DD.F``): that PCI device's
   ``numa_node`` in the node's sysfs;
4. a known driver's own attribute (:data:`DRIVER_NUMA_ATTRIBUTES`);
5. else unknown: shown as such, never guessed.

An attribute present but malformed (a numaNode that is no integer, a NUMA node the
machine lacks) stops there: the device is unknown, with a problem naming the slice, the
device and the attribute. An attribute that cannot be resolved (a PCI address sysfs does
not know) goes on to the next rule and is only reported when no rule applies.

Reading is lenient and bounded: a malformed slice or device gives a problem entry and
spoils nothing else; at most :data:`MAX_DRA_DEVICES` devices are kept per node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

STANDARD_PREFIX = "resource.kubernetes.io/"
NUMA_NODE = STANDARD_PREFIX + "numaNode"
PCIE_ROOT = STANDARD_PREFIX + "pcieRoot"
PCI_BUS_ID = STANDARD_PREFIX + "pciBusID"

# Drivers' own NUMA attributes (fully qualified), used when no standard attribute says it.
# Each publishes an integer NUMA node id:
#   dra.net/numaNode     DraNet (driver dra.net); also published for alignment by
#                        dra-driver-cpu (dra.cpu) and dra-driver-nvidia-gpu (gpu.nvidia.com)
#   dra.cpu/numaNodeID   dra-driver-cpu (driver dra.cpu)
DRIVER_NUMA_ATTRIBUTES: tuple[str, ...] = ("dra.net/numaNode", "dra.cpu/numaNodeID")

MAX_DRA_DEVICES = 1024  # per node (the status list); more are counted, not listed
MAX_SLICES = 4096  # slices read per node
MAX_VALUE_CHARS = 64  # an attribute value as shown (the API's own string limit)
MAX_PROBLEM_CHARS = 512
MAX_NUMA_ID = 1023  # Linux: MAX_NUMNODES is at most 1 << 10

Source = Literal["numaNode", "pcieRoot", "pciBusID", "driverAttribute", "unknown"]

PCI_ROOT_RE = re.compile(r"^pci[0-9a-f]{4,8}:[0-9a-f]{2}$")
PCI_BUS_ID_RE = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")

JSON = dict[str, Any]


@dataclass(frozen=True)
class PciTopology:
    """The node's PCI devices as sysfs shows them: each bus id's NUMA node (None: no
    affinity) and its root complex (``pci0000:00``)."""

    numa: Mapping[str, int | None] = field(default_factory=dict)
    root: Mapping[str, str] = field(default_factory=dict)

    def root_numa(self, root: str) -> set[int | None] | None:
        """The NUMA nodes of the devices under ``root``; None if sysfs has no such root."""
        found = [self.numa.get(a) for a, r in self.root.items() if r == root]
        return set(found) if found else None


@dataclass(frozen=True)
class DraDevice:
    """One device of a ResourceSlice (or, with ``device`` None, a slice that could not
    be read), with its NUMA nodes when known."""

    slice: str
    driver: str
    pool: str
    device: str | None
    numa_nodes: tuple[int, ...] | None
    source: Source
    attributes: Mapping[str, str] = field(default_factory=dict)
    problem: str | None = None

    def to_json(self) -> JSON:
        """The ``status.draDevices`` entry."""
        out: JSON = {"slice": self.slice, "driver": self.driver, "pool": self.pool}
        if self.device is not None:
            out["device"] = self.device
        if self.numa_nodes is not None:
            out["numaNodes"] = list(self.numa_nodes)
        out["source"] = self.source
        if self.attributes:
            out["attributes"] = dict(self.attributes)
        if self.problem:
            out["problem"] = self.problem
        return out


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _show(value: Any) -> str:
    """A value as JSON, short."""
    try:
        text = json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):  # pragma: no cover - default=str takes anything
        text = repr(value)
    return _clip(text, MAX_VALUE_CHARS)


def _attr_value(attr: Any) -> Any:
    """The value of an attribute object ({int|bool|string|version|ints|...}); the object
    itself when it holds none of them."""
    if isinstance(attr, Mapping):
        for key in ("int", "ints", "string", "strings", "version", "versions", "bool", "bools"):
            if key in attr:
                return attr[key]
    return attr


def _lookup(attrs: Mapping[str, Any], driver: str, name: str) -> tuple[bool, Any]:
    """(present, attribute object) for a fully qualified name: the key itself, or the
    unqualified key when the name is in the driver's own domain."""
    if name in attrs:
        return True, attrs[name]
    domain, _, short = name.partition("/")
    if domain == driver and short in attrs:
        return True, attrs[short]
    return False, None


class _Bad(Exception):
    """A malformed attribute: the device is unknown, with this message."""


def _numa_ids(attr: Any, name: str, machine: Collection[int] | None) -> tuple[int, ...]:
    """The NUMA nodes of an integer or integer-list attribute; :class:`_Bad` otherwise."""
    value = attr.get("int", attr.get("ints")) if isinstance(attr, Mapping) else None
    ids: list[Any] = value if isinstance(value, list) else [value]
    if value is None or not ids or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise _Bad(f"attribute {name}: want an integer or a list of integers, "
                   f"got {_show(_attr_value(attr))}")
    out: list[int] = []
    for i in ids:
        if i < 0 or i > MAX_NUMA_ID:
            raise _Bad(f"attribute {name}: NUMA node {i} is out of range (0-{MAX_NUMA_ID})")
        if machine is not None and i not in machine:
            have = ",".join(str(n) for n in sorted(machine)) or "none"
            raise _Bad(f"attribute {name}: NUMA node {i} is not on this machine "
                       f"(its NUMA nodes: {have})")
        if i not in out:
            out.append(i)
    return tuple(out)


def _string(attr: Any, name: str) -> str:
    value = attr.get("string") if isinstance(attr, Mapping) else None
    if not isinstance(value, str):
        raise _Bad(f"attribute {name}: want a string, got {_show(_attr_value(attr))}")
    return value


def _check_machine(ids: Iterable[int], name: str, machine: Collection[int] | None) -> None:
    for i in ids:
        if machine is not None and i not in machine:
            raise _Bad(f"{name}: sysfs says NUMA node {i}, which is not on this machine")


def map_device(driver: str, attrs: Mapping[str, Any], pci: PciTopology | None,
               machine: Collection[int] | None
               ) -> tuple[tuple[int, ...] | None, Source, dict[str, str], str | None]:
    """(NUMA nodes or None, the rule that gave them, the attributes used, problem) of a
    device with attributes ``attrs`` of driver ``driver``; ``pci``: the node's sysfs PCI
    devices (None: not known here); ``machine``: its NUMA node ids (None: not checked)."""
    used: dict[str, str] = {}
    notes: list[str] = []
    try:
        present, attr = _lookup(attrs, driver, NUMA_NODE)
        if present:
            used[NUMA_NODE] = _show(_attr_value(attr))
            return _numa_ids(attr, NUMA_NODE, machine), "numaNode", used, None
        present, attr = _lookup(attrs, driver, PCIE_ROOT)
        if present:
            root = _string(attr, PCIE_ROOT).strip().lower()
            used[PCIE_ROOT] = _show(root)
            if not PCI_ROOT_RE.match(root):
                raise _Bad(f"attribute {PCIE_ROOT}: want pci<domain>:<bus>, got {_show(root)}")
            nodes = pci.root_numa(root) if pci is not None else None
            known = sorted(n for n in nodes or () if n is not None)
            if pci is None:
                notes.append(f"{PCIE_ROOT} {root}: no sysfs PCI view on this node")
            elif nodes is None:
                notes.append(f"{PCIE_ROOT} {root}: no such PCIe root in this node's sysfs")
            elif len(known) == 1 and None not in nodes:
                _check_machine(known, f"{PCIE_ROOT} {root}", machine)
                return tuple(known), "pcieRoot", used, None
            elif not known:
                notes.append(f"{PCIE_ROOT} {root}: its devices have no NUMA affinity")
            else:
                notes.append(f"{PCIE_ROOT} {root}: its devices are on different NUMA "
                             f"nodes in sysfs")
        present, attr = _lookup(attrs, driver, PCI_BUS_ID)
        if present:
            bus = _string(attr, PCI_BUS_ID).strip().lower()
            used[PCI_BUS_ID] = _show(bus)
            if not PCI_BUS_ID_RE.match(bus):
                raise _Bad(f"attribute {PCI_BUS_ID}: want DDDD:BB:DD.F, got {_show(bus)}")
            if pci is None:
                notes.append(f"{PCI_BUS_ID} {bus}: no sysfs PCI view on this node")
            elif bus not in pci.numa:
                notes.append(f"{PCI_BUS_ID} {bus}: no such PCI device in this node's sysfs")
            else:
                node = pci.numa[bus]
                if node is None:
                    notes.append(f"{PCI_BUS_ID} {bus}: no NUMA affinity in sysfs")
                else:
                    _check_machine([node], f"{PCI_BUS_ID} {bus}", machine)
                    return (node,), "pciBusID", used, None
        for name in DRIVER_NUMA_ATTRIBUTES:
            present, attr = _lookup(attrs, driver, name)
            if present:
                used[name] = _show(_attr_value(attr))
                return _numa_ids(attr, name, machine), "driverAttribute", used, None
    except _Bad as e:
        return None, "unknown", used, str(e)
    return None, "unknown", used, "; ".join(notes) or None


def _name(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return name if isinstance(name, str) and name else "?"


def slice_devices(obj: Any, node: str, pci: PciTopology | None,
                  machine: Collection[int] | None, *, limit: int = MAX_DRA_DEVICES
                  ) -> list[DraDevice]:
    """The devices of one ResourceSlice that are on ``node`` (at most ``limit``), or one
    entry saying why the slice cannot be read."""
    sname = _clip(_name(obj), 253)
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    driver = spec.get("driver") if isinstance(spec, Mapping) else None
    pool = spec.get("pool") if isinstance(spec, Mapping) else None
    pool_name = pool.get("name") if isinstance(pool, Mapping) else None
    drv = _clip(driver, 253) if isinstance(driver, str) else ""
    pname = _clip(pool_name, 253) if isinstance(pool_name, str) else ""

    def bad(device: str | None, problem: str) -> DraDevice:
        text = f"ResourceSlice {sname}: " + (f"device {device}: " if device else "") + problem
        return DraDevice(sname, drv, pname, device, None, "unknown",
                         problem=_clip(text, MAX_PROBLEM_CHARS))

    if not isinstance(spec, Mapping) or not drv:
        return [bad(None, "spec.driver: missing")]
    if not pname:
        return [bad(None, "spec.pool.name: missing")]
    per_device = spec.get("perDeviceNodeSelection") is True
    if not per_device and spec.get("nodeName") != node:
        return []
    devices = spec.get("devices")
    if devices is None:
        return []
    if not isinstance(devices, list):
        return [bad(None, f"spec.devices: want a list, got {_show(devices)}")]
    out: list[DraDevice] = []
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        if len(out) >= limit:
            break
        if not isinstance(dev, Mapping) or not isinstance(dev.get("name"), str) \
                or not dev.get("name"):
            out.append(bad(None, f"spec.devices[{i}]: no name"))
            continue
        dname = _clip(dev["name"], 253)
        if per_device and dev.get("nodeName") != node:
            continue
        if dname in seen:
            out.append(bad(dname, "listed twice in the slice; the first is kept"))
            continue
        seen.add(dname)
        attrs = dev.get("attributes")
        attrs = {} if attrs is None else attrs
        if not isinstance(attrs, Mapping):
            out.append(bad(dname, f"attributes: want a map, got {_show(attrs)}"))
            continue
        numa, source, used, problem = map_device(drv, attrs, pci, machine)
        if problem:
            problem = _clip(f"ResourceSlice {sname}: device {dname}: {problem}",
                            MAX_PROBLEM_CHARS)
        out.append(DraDevice(sname, drv, pname, dname, numa, source, used, problem))
    return out


def _generation(obj: Any) -> int:
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    pool = spec.get("pool") if isinstance(spec, Mapping) else None
    gen = pool.get("generation") if isinstance(pool, Mapping) else None
    return gen if isinstance(gen, int) and not isinstance(gen, bool) else 0


def _pool_key(obj: Any) -> tuple[str, str]:
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    pool = spec.get("pool") if isinstance(spec, Mapping) else None
    driver = spec.get("driver") if isinstance(spec, Mapping) else None
    name = pool.get("name") if isinstance(pool, Mapping) else None
    return (driver if isinstance(driver, str) else "", name if isinstance(name, str) else "")


@dataclass(frozen=True)
class NodeDraDevices:
    """A node's DRA devices as published: at most :data:`MAX_DRA_DEVICES` entries, and how
    many there are in all."""

    devices: tuple[DraDevice, ...]
    total: int

    @property
    def omitted(self) -> int:
        return self.total - len(self.devices)

    def entries(self) -> list[JSON]:
        return [d.to_json() for d in self.devices]


def node_devices(slices: Iterable[Any], node: str, pci: PciTopology | None,
                 machine: Collection[int] | None, *, limit: int = MAX_DRA_DEVICES
                 ) -> NodeDraDevices:
    """Every device of ``node`` in ``slices``, sorted by driver, pool, device. Of a pool,
    only the slices of its newest generation count (older ones are being replaced)."""
    items = [s for _, s in zip(range(MAX_SLICES), slices, strict=False)]
    newest: dict[tuple[str, str], int] = {}
    for s in items:
        key = _pool_key(s)
        newest[key] = max(newest.get(key, 0), _generation(s))
    found: list[DraDevice] = []
    total = 0
    for s in sorted(items, key=_name):
        if _generation(s) < newest[_pool_key(s)]:
            continue
        devs = slice_devices(s, node, pci, machine, limit=limit)
        total += len(devs)
        found.extend(devs)
        if len(found) > 2 * limit:  # keep memory bounded; the count goes on
            found.sort(key=_order)
            del found[limit:]
    found.sort(key=_order)
    return NodeDraDevices(tuple(found[:limit]), total)


def _order(d: DraDevice) -> tuple[str, str, str, str]:
    return (d.driver, d.pool, d.device or "", d.slice)
