"""The agent's view of its node's DRA devices: it lists and watches the node's
ResourceSlices (resource.k8s.io/v1, ``spec.nodeName=<node>``, any driver), maps each
device to NUMA nodes (:mod:`numalign.api.dra`: standard attributes, the node's sysfs PCI
devices, a few drivers' own attributes) and has the NodeTopology status republished when
they change (``status.draDevices``, counted in ``status.summary.draDevices``)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from numalign.api.dra import PCI_BUS_ID_RE, NodeDraDevices, PciTopology, node_devices
from numalign.api.draclaims import DRA_API
from numalign.api.kube import JSON, Kube
from numalign.api.kube.listwatch import list_watch

log = logging.getLogger(__name__)

SLICES_PATH = f"{DRA_API}/resourceslices"
PCI_DEVICES = "sys/bus/pci/devices"
MAX_PCI_DEVICES = 65536


def pci_topology(root: str | os.PathLike[str] = "/") -> PciTopology | None:
    """The PCI devices under ``root``'s sysfs: each one's ``numa_node`` (-1: None) and its
    root complex (the ``pciDDDD:BB`` directory its ``sys/bus/pci/devices`` link leads
    through). None when there is no such directory."""
    base = Path(root) / PCI_DEVICES
    try:
        names = sorted(os.listdir(base))[:MAX_PCI_DEVICES]
    except OSError:
        return None
    numa: dict[str, int | None] = {}
    roots: dict[str, str] = {}
    for name in names:
        addr = name.lower()
        if not PCI_BUS_ID_RE.match(addr):
            continue
        try:
            with open(base / name / "numa_node", encoding="ascii", errors="replace") as f:
                value = int(f.read(64).strip())
        except (OSError, ValueError):
            continue
        numa[addr] = value if value >= 0 else None
        try:
            target = os.readlink(base / name)
        except OSError:
            continue
        for part in target.split("/"):
            if part.startswith("pci") and ":" in part:
                roots[addr] = part.lower()
                break
    return PciTopology(numa, roots)


class DraDevices:
    """The node's ResourceSlices, read by :meth:`run` (list, then watch); ``on_change``
    is called whenever what they say of the node's devices changes (:attr:`current`)."""

    def __init__(self, kube: Kube, node: str, machine_numa: Collection[int],
                 pci: PciTopology | None, on_change: Callable[[NodeDraDevices], None]) -> None:
        self.kube = kube
        self.node = node
        self.machine_numa = frozenset(machine_numa)
        self.pci = pci
        self.on_change = on_change
        self.slices: dict[str, JSON] = {}
        self.current: NodeDraDevices | None = None

    def _update(self) -> None:
        found = node_devices(self.slices.values(), self.node, self.pci, self.machine_numa)
        if found == self.current:
            return
        self.current = found
        if found.omitted:
            log.warning("node %s: %d DRA devices, %d listed in NodeTopology status",
                        self.node, found.total, len(found.devices))
        for d in found.devices:
            if d.problem:
                log.warning("DRA: %s", d.problem)
        self.on_change(found)

    def on_list(self, items: list[JSON]) -> None:
        self.slices = {_key(s): s for s in items if isinstance(s, Mapping)}
        self._update()

    def on_event(self, typ: str, obj: Mapping[str, Any]) -> None:
        key = _key(obj)
        if typ == "DELETED":
            self.slices.pop(key, None)
        else:
            self.slices[key] = dict(obj)
        self._update()

    async def run(self) -> None:
        """Until cancelled. Without the DRA API (or the right to read it) the listing is
        retried with backoff, and the status lists no DRA devices."""
        await list_watch(self.kube, SLICES_PATH, self.on_list, self.on_event,
                         params={"fieldSelector": f"spec.nodeName={self.node}"},
                         retry=1.0, max_retry=60.0)


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    return str(name or "")


class FleetDraDevices:
    """The ResourceSlices of many emulated nodes (one watch for them all): each node's
    devices mapped to its machine file's NUMA nodes (no sysfs: pcieRoot and pciBusID stay
    unresolved). A node is given its devices once it has slices (``on_change(node,
    devices)``) and keeps them, emptied, when they go."""

    def __init__(self, kube: Kube, machine_numa: Mapping[str, Collection[int]],
                 on_change: Callable[[str, NodeDraDevices], None]) -> None:
        self.kube = kube
        self.numa = {n: frozenset(ids) for n, ids in machine_numa.items()}
        self.on_change = on_change
        self.slices: dict[str, dict[str, JSON]] = {}  # node -> slice name -> slice
        self.where: dict[str, str] = {}  # slice name -> node
        self.current: dict[str, NodeDraDevices] = {}

    def _update(self, node: str) -> None:
        found = node_devices(self.slices.get(node, {}).values(), node, None, self.numa[node])
        if found == self.current.get(node) or (node not in self.current and not found.total):
            return
        self.current[node] = found
        self.on_change(node, found)

    def _put(self, obj: Mapping[str, Any]) -> set[str]:
        """Store a slice under its node; the nodes whose slices changed."""
        key = _key(obj)
        spec = obj.get("spec")
        node = spec.get("nodeName") if isinstance(spec, Mapping) else None
        touched = self._drop(key)
        if isinstance(node, str) and node in self.numa:
            self.slices.setdefault(node, {})[key] = dict(obj)
            self.where[key] = node
            touched.add(node)
        return touched

    def _drop(self, key: str) -> set[str]:
        node = self.where.pop(key, None)
        if node is None:
            return set()
        self.slices.get(node, {}).pop(key, None)
        return {node}

    def on_list(self, items: list[JSON]) -> None:
        self.slices.clear()
        self.where.clear()
        for s in items:
            if isinstance(s, Mapping):
                self._put(s)
        for node in sorted(set(self.slices) | set(self.current)):
            self._update(node)

    def on_event(self, typ: str, obj: Mapping[str, Any]) -> None:
        touched = self._drop(_key(obj)) if typ == "DELETED" else self._put(obj)
        for node in sorted(touched):
            self._update(node)

    async def run(self) -> None:
        await list_watch(self.kube, SLICES_PATH, self.on_list, self.on_event,
                         retry=1.0, max_retry=60.0)
