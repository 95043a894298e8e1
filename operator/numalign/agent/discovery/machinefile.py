"""A discovered machine as a machine file document (``tests/fixtures/machines``) and as the
engine's machine model."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from numalign.topology.errors import MachineError
from numalign.topology.machine import CPU, Machine, machine_from_dict
from numalign.topology.quantity import format_bytes, format_cpulist

from .model import GPU_RESOURCE, DiscoveredMachine, hex4
from .sysfs import PCI_ADDR


def _parse_pci_resources(pci_resources: Mapping[str, str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, res in (pci_resources or {}).items():
        if "/" not in res:
            raise MachineError(f"pci resource {key}", f"{res!r} is not an extended resource "
                                                      f"name like 'example.com/nic'")
        k = key.strip().lower()
        if ":" in k and not PCI_ADDR.match(k):
            v, _, d = k.partition(":")
            k = f"{hex4(v)}:{hex4(d)}"
        out[k] = res
    return out


def machine_dict(dm: DiscoveredMachine, name: str, *, description: str = "",
                 pci_resources: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The discovered machine as a machine file document (``tests/fixtures/machines``).

    Devices: GPUs found by nvidia-smi as ``nvidia.com/gpu`` (id = UUID, memory, groups);
    PCI devices whose ``vendor:device`` (e.g. ``15b3:101b``) or address is a key of
    ``pci_resources`` as that resource. Distances only when every node has a full row."""
    ids = dm.numa_ids
    doc: dict[str, Any] = {"name": name}
    doc["description"] = description or f"discovered from {dm.root}"
    nodes: list[dict[str, Any]] = []
    for n in dm.nodes:
        entry: dict[str, Any] = {"id": n.id, "cpus": _cpulist_str(n.cpus),
                                 "memory": format_bytes(n.memory_bytes)}
        hp = {size: format_bytes(h.total_bytes) for size, h in n.hugepages.items()
              if h.pages > 0}
        if hp:
            entry["hugepages"] = hp
        nodes.append(entry)
    doc["numaNodes"] = nodes
    if all(i in dm.distances and all(j in dm.distances[i] for j in ids) for i in ids):
        doc["distances"] = [[dm.distances[i][j] for j in ids] for i in ids]

    cpus = [dm.cpus[c] for c in sorted(dm.cpus)]
    if cpus:
        topo: dict[str, Any] = {}
        threads = max(len(c.threads) for c in cpus)
        topo["threadsPerCore"] = min(max(threads, 1), 8)
        socket_of_numa: dict[int, int] = {}
        for nid in ids:
            socks = Counter(c.socket for c in cpus if c.numa == nid and c.socket is not None)
            if socks:
                socket_of_numa[nid] = socks.most_common(1)[0][0]
            elif any(c.numa == nid for c in cpus):
                socket_of_numa[nid] = -1  # unknown: filled in below
        next_free = max([s for s in socket_of_numa.values()] + [-1]) + 1
        for nid, s in sorted(socket_of_numa.items()):
            if s == -1:
                socket_of_numa[nid] = next_free
                next_free += 1
        by_socket: dict[int, list[int]] = {}
        for nid, s in socket_of_numa.items():
            by_socket.setdefault(s, []).append(nid)
        topo["sockets"] = [{"id": s, "numaNodes": sorted(ns)} for s, ns in
                           sorted(by_socket.items())]
        cores: dict[int, list[int]] = {}
        for c in cpus:
            cores.setdefault(c.core, []).append(c.id)
        topo["siblings"] = [_cpulist_str(m) for _, m in sorted(cores.items())]
        doc["cpuTopology"] = topo

    devices: list[dict[str, Any]] = []
    for g in dm.gpus:
        d: dict[str, Any] = {"resource": GPU_RESOURCE, "id": g.device_id,
                             "numaNode": g.numa_node if g.numa_node in ids else None}
        if g.memory_bytes is not None:
            d["memory"] = format_bytes(g.memory_bytes)
        if g.groups:
            d["groups"] = dict(g.groups)
        devices.append(d)
    resources = _parse_pci_resources(pci_resources)
    if resources:
        gpu_addrs = {g.pci_bus_id for g in dm.gpus}
        counts: Counter[str] = Counter()
        for p in sorted(dm.pci, key=lambda p: p.address):
            res = resources.get(p.address) or resources.get(p.vendor_device or "")
            if res is None or p.address in gpu_addrs:
                continue
            devices.append({"resource": res, "id": p.address,
                            "numaNode": p.numa_node if p.numa_node in ids else None})
            counts[res] += 1
    if devices:
        doc["devices"] = devices
    return doc


def to_machine(dm: DiscoveredMachine, name: str, *, description: str = "",
               pci_resources: Mapping[str, str] | None = None) -> Machine:
    """The engine's machine model of a discovered machine, checked exactly as a machine
    file is (:func:`machine_from_dict`; raises ``MachineError``). Cores are numbered as the
    machine file numbers them; each CPU keeps its exact socket, which the file format can
    only give per NUMA node."""
    doc = machine_dict(dm, name, description=description, pci_resources=pci_resources)
    m = machine_from_dict(doc, source=f"discovered machine {name}")
    numa_of = {c: n.id for n in m.numa_nodes for c in n.cpus}
    sockets = {cpu.numa: cpu.socket for cpu in m.cpus.values()}
    exact = {
        c: CPU(id=c, core=m.cpus[c].core,  # the machine file's numbering of the same cores
               socket=info.socket if info.socket is not None else sockets.get(numa_of[c], 0),
               numa=numa_of[c])
        for c, info in dm.cpus.items() if c in numa_of and c in m.cpus
    }
    return replace(m, cpus=exact)


def _cpulist_str(cpus: Iterable[int]) -> str:
    return format_cpulist(set(cpus))
