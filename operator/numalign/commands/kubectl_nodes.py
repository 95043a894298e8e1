"""``kubectl numalign nodes``: what is free in each NUMA zone of each node, from the
NodeTopologies the agents publish (pure: objects in, rows and text out)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from numalign.api.effective import NodePolicy
from numalign.api.nodetopology import READY
from numalign.api.reads import NodeTopologyRead, NodeTopologyStatusRead
from numalign.topology.quantity import format_bytes, parse_quantity
from numalign.topology.text import printable

JSON = dict[str, Any]

# The zone resources shown in their own columns; the rest are devices.
_OWN = ("cpu", "memory")


def _amount(value: Any) -> Decimal | None:
    try:
        return parse_quantity(value)
    except (ValueError, ArithmeticError):
        return None


def _pair(free: Any, total: Any) -> JSON:
    """``{"free", "total"}`` as numbers (bytes for memory and hugepages)."""
    f, t = _amount(free), _amount(total)
    return {"free": int(f) if f is not None else None, "total": int(t) if t is not None else None}


def _ready(status: NodeTopologyStatusRead) -> str:
    cond = status.condition(READY)
    return (cond.status or "Unknown") if cond is not None else "Unknown"


def node_row(nt: NodeTopologyRead | Mapping[str, Any]) -> JSON:
    """One node: its policy and scope, readiness, pods, and per NUMA zone the free and
    total CPUs, memory, hugepages and devices."""
    read = NodeTopologyRead.of(nt)
    status = read.status
    node = NodePolicy.from_nodetopology(read)
    applied = node.applied
    policy = applied.policy or "none"
    scope = applied.scope if node.kubelet is not None or (read.spec or {}).get("scope") else None
    zones: list[JSON] = []
    for z in status.zones:
        if z is None or z.total is None or z.free is None:
            continue
        alloc, avail = z.total, z.free
        zone: JSON = {"id": z.id,
                      "cpu": _pair(avail.get("cpu"), alloc.get("cpu")),
                      "memory": _pair(avail.get("memory"), alloc.get("memory")),
                      "hugepages": {}, "devices": {}}
        for res in sorted(alloc):
            name = str(res)
            if name in _OWN:
                continue
            kind = "hugepages" if name.startswith("hugepages-") else "devices"
            key = name.removeprefix("hugepages-") if kind == "hugepages" else name
            zone[kind][key] = _pair(avail.get(res), alloc.get(res))
        zones.append(zone)
    pods = status.summary.pods if status.summary is not None else None
    return {"name": read.metadata.name or "", "policy": policy,
            "scope": str(scope or "container"), "ready": _ready(status),
            "pods": len(status.admitted) if pods is None else pods,
            "zones": zones}


def nodes_report(nts: Iterable[Mapping[str, Any]], names: Iterable[str] = ()) -> list[JSON]:
    """The rows of ``nts`` (only ``names`` when given), sorted by node name."""
    wanted = set(names)
    rows = [node_row(nt) for nt in nts]
    return sorted((r for r in rows if not wanted or r["name"] in wanted),
                  key=lambda r: r["name"])


def _fmt(pair: Mapping[str, Any], size: bool = False) -> str:
    free, total = pair.get("free"), pair.get("total")
    if free is None and total is None:
        return "-"

    def one(v: Any) -> str:
        if v is None:
            return "?"
        return format_bytes(int(v)) if size else str(v)

    return f"{one(free)}/{one(total)}"


def _many(pairs: Mapping[str, Mapping[str, Any]], size: bool = False) -> str:
    return ",".join(f"{k}={_fmt(v, size)}" for k, v in sorted(pairs.items())) or "-"


def render_nodes(rows: list[JSON], wide: bool = False) -> str:
    """The table: one line per node and NUMA zone, free/total in each column."""
    head = ["NODE", "POLICY", "NUMA", "CPU", "MEMORY", "DEVICES"]
    if wide:
        head += ["HUGEPAGES", "SCOPE", "PODS", "READY"]
    lines: list[list[str]] = [head]
    for r in rows:
        zones = r["zones"] or [{"id": "-", "cpu": {}, "memory": {}, "hugepages": {},
                                "devices": {}}]
        for i, z in enumerate(zones):
            first = i == 0
            line = [r["name"] if first else "", r["policy"] if first else "", str(z["id"]),
                    _fmt(z["cpu"]), _fmt(z["memory"], size=True), _many(z["devices"])]
            if wide:
                line += [_many(z["hugepages"], size=True), r["scope"] if first else "",
                         str(r["pods"]) if first else "", r["ready"] if first else ""]
            lines.append([printable(c) for c in line])  # names and ids from the cluster
    if len(lines) == 1:
        return "No NodeTopologies found (is the numalign agent running on the nodes?)"
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)
