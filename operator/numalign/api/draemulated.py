"""An emulated node's machine-file devices as a DRA driver's objects (pure).

The emulated driver (:data:`DRIVER`) publishes one pool per node, named after the node,
in as many ResourceSlices (resource.k8s.io/v1) as its devices need (at most
:data:`MAX_DEVICES_PER_SLICE` each). Each device carries:

- ``resource.kubernetes.io/numaNode`` (int) when the machine file gives its NUMA node;
- ``emulated.numalign.io/resource`` (string): the device's extended-resource name, the
  device kind a DeviceClass selects on;
- one string attribute per GPU group level of the machine file
  (``emulated.numalign.io/nvswitch``, ``.../pcie``, ``.../nvlink``...), the group id;
- capacity ``emulated.numalign.io/memory`` (a quantity) when the device has memory.

A DeviceClass per device kind (:func:`device_classes`) selects the driver's devices of
that kind by CEL. Names and values are kept within the API's bounds: a device name is a
DNS label derived from the device id (a short hash keeps it unique), a value longer than
the API allows is cut and hashed, a group level that is no valid attribute name is
renamed to one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

from numalign.topology.machine import Device, Machine

DRIVER = "emulated.numalign.io"
NUMA_NODE = "resource.kubernetes.io/numaNode"
KIND = "resource"  # the device-kind attribute (in the driver's domain)
MEMORY = "memory"  # the memory capacity (in the driver's domain)

MAX_DEVICES_PER_SLICE = 128  # ResourceSliceMaxDevices
MAX_ATTRIBUTES = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
MAX_ID_CHARS = 32  # DeviceMaxIDLength: the part of an attribute name after the domain
MAX_VALUE_CHARS = 64  # DeviceAttributeMaxValueLength
MAX_LABEL_CHARS = 63  # a device name: a DNS label
MAX_NAME_CHARS = 253  # a slice or class name: a DNS subdomain

JSON = dict[str, Any]

_NOT_LABEL = re.compile(r"[^a-z0-9-]+")
_NOT_SUBDOMAIN = re.compile(r"[^a-z0-9.-]+")
_NOT_IDENT = re.compile(r"[^A-Za-z0-9_]+")


def _hash(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _bounded(text: str, limit: int, key: str) -> str:
    """``text`` if it fits, else its head with a hash of ``key`` (unique and stable)."""
    if len(text) <= limit:
        return text
    return text[: limit - 9].rstrip("-.") + "-" + _hash(key)


def _label(text: str, key: str) -> str:
    """A DNS label (``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, at most 63) made from ``text``."""
    base = _NOT_LABEL.sub("-", text.lower()).strip("-")
    if not base:
        return "d-" + _hash(key)
    return _bounded(base, MAX_LABEL_CHARS, key)


def _subdomain(text: str, key: str) -> str:
    """A DNS subdomain (lower-case labels joined by dots, at most 253) made from ``text``."""
    labels = [p.strip("-") for p in _NOT_SUBDOMAIN.sub("-", text.lower()).split(".")]
    base = ".".join(p for p in labels if p)
    if not base:
        return "x-" + _hash(key)
    return _bounded(base, MAX_NAME_CHARS, key)


def kind_value(resource: str) -> str:
    """The device-kind attribute's value for an extended resource: its name (cut and
    hashed in the rare case it is longer than an attribute value may be)."""
    return _bounded(resource, MAX_VALUE_CHARS, resource)


def group_attribute(level: str) -> str:
    """The attribute name (in the driver's domain) of a GPU group level: the level when it
    is a C identifier of at most 32 characters, else one made from it."""
    ident = _NOT_IDENT.sub("_", level).strip("_") or "group"
    if ident[0].isdigit():
        ident = "g_" + ident
    if ident in (KIND, MEMORY):
        ident = "group_" + ident
    if len(ident) > MAX_ID_CHARS:
        ident = ident[: MAX_ID_CHARS - 9] + "_" + _hash(level)
    return ident


def quantity(n: int) -> str:
    """Bytes as a Kubernetes quantity, in the largest binary unit that divides them."""
    for suffix, size in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if n and n % size == 0:
            return f"{n // size}{suffix}"
    return str(n)


def device_names(devices: Iterable[Device]) -> list[str]:
    """Each device's name in the slices, in order: a DNS label from its id; a device
    whose label another device already has gets a hash of its resource and id."""
    out: list[str] = []
    taken: set[str] = set()
    for d in devices:
        key = f"{d.resource}/{d.id}"
        name = _label(d.id, key)
        if name in taken:
            name = _bounded(name, MAX_LABEL_CHARS - 9, key) + "-" + _hash(key)
        taken.add(name)
        out.append(name)
    return out


def device_json(device: Device, name: str, driver: str = DRIVER) -> JSON:
    """One device of a ResourceSlice (resource.k8s.io/v1 Device); its own attributes in
    ``driver``'s domain."""
    attrs: JSON = {f"{driver}/{KIND}": {"string": kind_value(device.resource)}}
    if device.numa_node is not None:
        attrs[NUMA_NODE] = {"int": device.numa_node}
    capacity: JSON = {}
    if device.memory is not None:
        capacity[f"{driver}/{MEMORY}"] = {"value": quantity(device.memory)}
    room = MAX_ATTRIBUTES - len(attrs) - len(capacity)
    for level, gid in device.groups:
        key = f"{driver}/{group_attribute(level)}"
        if key in attrs:
            continue
        if room <= 0:
            break
        attrs[key] = {"string": _bounded(gid, MAX_VALUE_CHARS, gid)}
        room -= 1
    out: JSON = {"name": name, "attributes": attrs}
    if capacity:
        out["capacity"] = capacity
    return out


def slice_name(node: str, index: int, driver: str = DRIVER) -> str:
    """The name of the node's ``index``-th slice."""
    return _subdomain(f"{node}-{driver}-{index}", f"{node}/{index}")


def resource_slices(machine: Machine, node: str, generation: int = 1,
                    driver: str = DRIVER) -> list[JSON]:
    """The node's ResourceSlices for the machine's devices; none for a machine without
    devices. One pool (named after the node), split in slices of at most 128 devices.
    ``driver``: another driver publishing the same devices (the real node's kubelet
    plugin, :mod:`numalign.devcluster.draplugin`)."""
    devices = list(machine.devices)
    if not devices:
        return []
    named = [device_json(d, n, driver) for d, n in zip(devices, device_names(devices), strict=True)]
    chunks = [named[i: i + MAX_DEVICES_PER_SLICE]
              for i in range(0, len(named), MAX_DEVICES_PER_SLICE)]
    return [{
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, i, driver),
                     "labels": {"numalign.io/emulated-driver": "true"}},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": generation,
                          "resourceSliceCount": len(chunks)},
                 "devices": chunk},
    } for i, chunk in enumerate(chunks)]


def device_class_name(resource: str, driver: str = DRIVER) -> str:
    """The DeviceClass of an emulated device kind: ``nvidia.com/gpu`` gives
    ``gpu.nvidia.com.emulated.numalign.io``."""
    domain, _, short = resource.rpartition("/")
    text = f"{short}.{domain}.{driver}" if domain else f"{short}.{driver}"
    return _subdomain(text, resource)


def _cel_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def device_classes(resources: Iterable[str], driver: str = DRIVER) -> list[JSON]:
    """One DeviceClass per device kind, selecting the (emulated) driver's devices of it."""
    out: list[JSON] = []
    for res in sorted(set(resources)):
        cel = (f"device.driver == {_cel_string(driver)} && "
               f"device.attributes[{_cel_string(driver)}].{KIND} == "
               f"{_cel_string(kind_value(res))}")
        out.append({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": device_class_name(res, driver),
                         "labels": {"numalign.io/emulated-driver": "true"}},
            "spec": {"selectors": [{"cel": {"expression": cel}}]},
        })
    return out
