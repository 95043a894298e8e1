"""The human view of an :class:`~numalign.topology.explain.Explanation`: aligned tables
and a short "why" per decision."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from numalign.commands.explain_claims import claims_text
from numalign.topology.explain import Explanation, avg_distance, hint_text, nodes_text
from numalign.topology.hints import TopologyHint, mask_of
from numalign.topology.policies import get_policy
from numalign.topology.quantity import format_bytes, format_cpulist
from numalign.topology.text import printable

# How many hints per resource the text view shows (JSON has them all).
TEXT_HINTS = 8


def _hints_text(hints: list[TopologyHint] | None, limit: int = TEXT_HINTS) -> str:
    if hints is None:
        return "no preference"
    if not hints:
        return "cannot satisfy (no hint)"
    parts = [nodes_text(h.mask) + ("*" if h.preferred else "") for h in hints[:limit]]
    if len(hints) > limit:
        parts.append(f"... {len(hints) - limit} more")
    return " ".join(parts)


def _table(rows: Sequence[Sequence[str]], indent: str = "    ") -> list[str]:
    if not rows:
        return []
    rows = [[printable(c) for c in r] for r in rows]  # names and ids from the cluster
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=True)]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def _bytes_per_zone(per: Mapping[str, int]) -> str:
    return ", ".join(f"{format_bytes(b)} on {z}" for z, b in per.items()) or "-"


def render_text(e: Explanation) -> str:
    """The human view: aligned tables and a short "why" per decision. Every string from
    the cluster or the pod in it is escaped (control characters, line breaks and bidi
    overrides shown as escapes): one value cannot break a line or steer the terminal."""
    lines: list[str] = []
    where = f"node {e.node} (machine {e.machine})" if e.node else f"machine {e.machine}"
    lines.append(f"Pod:      {e.namespace}/{e.pod}  (QoS {e.qos})")
    lines.append(f"Node:     {where}, NUMA nodes {', '.join(map(str, e.numa_nodes))}")
    opts = []
    if e.options.prefer_closest_numa_nodes:
        opts.append("prefer-closest-numa-nodes")
    opt_text = f", options: {', '.join(opts)}" if opts else ""
    lines.append(f"Policy:   {e.policy}, scope {e.scope}{opt_text}  "
                 f"(from {printable(e.source)})")
    lines.append(f"Result:   {'ADMITTED' if e.admit else 'REJECTED'}"
                 + (f" ({printable(e.reason)})" if e.reason else ""))
    lines.append("")
    lines.append(e.summary)
    for d in e.decisions:
        lines.append("")
        title = "Pod-scope decision" if d.unit == "pod" else f"Container {d.unit}"
        lines.append(f"{title}:")
        if not get_policy(e.policy).aligns:
            lines.append(f"  Why: {d.why}")
            continue
        lines.append("  Hints (* = preferred):")
        rows = [["PROVIDER", "RESOURCE", "PREFERS WINNER", "HINTS"]]
        for r in d.resources:
            rows.append([r.provider, r.resource or "-", r.prefers_winner or "-",
                         _hints_text(r.hints)])
        if len(rows) == 1:
            lines.append("    (no provider has hints for this unit)")
        else:
            lines += _table(rows)
        if d.candidates:
            lines.append("  Merged candidates, best first:")
            crow = [["#", "NUMA NODES", "PREFERRED", "WIDTH", "AVG DISTANCE"]]
            for i, c in enumerate(d.candidates, 1):
                a = avg_distance(c)
                crow.append([str(i), nodes_text(c.mask), "yes" if c.preferred else "no",
                             str(c.width), "-" if a is None else f"{a:g}"])
            lines += _table(crow)
            if d.preferred_candidates and d.preferred_candidates > len(d.candidates):
                lines.append(f"    ({d.preferred_candidates} preferred candidates in all)")
        win = hint_text(d.hint.mask)
        lines.append(f"  Winner: {win}, {'preferred' if d.hint.preferred else 'not preferred'}")
        lines.append(f"  Why:    {d.why}")
        lines.append(f"  Admit:  {d.admit_why}")
    if e.admit and e.allocation.get("containers"):
        lines.append("")
        lines.append("Allocation:")
        rows = [["CONTAINER", "NUMA", "CPUS", "MEMORY", "DEVICES"]]
        for name, c in e.allocation["containers"].items():
            mem = _bytes_per_zone(c.get("memory") or {})
            for size, per in (c.get("hugepages") or {}).items():
                mem += f"; hugepages-{size}: {_bytes_per_zone(per)}"
            devs = "; ".join(f"{r}: {','.join(ids)}" for r, ids in (c.get("devices") or {}).items())
            rows.append([name, nodes_text(mask_of(c["numaNodes"])) if c.get("numaNodes")
                         else "-", format_cpulist(c.get("cpus") or []) or "-", mem, devs or "-"])
        lines += _table(rows, "  ")
        for req, ids in (e.allocation.get("gpus") or {}).items():
            lines.append(f"  GPU request {req}: {', '.join(ids)}")
    if e.claims is not None:
        lines.append("")
        lines += claims_text(e.claims)
    if e.kubelet is not None:
        lines.append("")
        lines += _kubelet_text(e.kubelet)
    if e.recorded is not None:
        lines.append("")
        lines.append("Recorded by the agent (numalign.io/allocation): "
                     + json.dumps(e.recorded, sort_keys=True, separators=(",", ":")))
    for n in e.notes:
        lines.append(f"Note: {printable(n)}")
    return printable("\n".join(lines), keep_newlines=True)


def _kubelet_text(k: Mapping[str, Any]) -> list[str]:
    """A real node's kubelet decision beside the replay above
    (:mod:`numalign.commands.explain_realnode`)."""
    if k.get("admit") is None:
        return ["Kubelet's decision: not reported yet"]
    if not k["admit"]:
        return [f"Kubelet's decision: REJECTED ({printable(k.get('reason'))}): "
                f"{printable(k.get('message') or '')}"]
    lines = [f"Kubelet's decision: ADMITTED, NUMA nodes {k.get('numaNodes')}"]
    rows = [["CONTAINER", "NUMA", "CPUS", "DEVICES"]]
    for name, c in (k.get("containers") or {}).items():
        devs = "; ".join(f"{r}: {','.join(ids)}" for r, ids in c["devices"].items())
        rows.append([name, nodes_text(mask_of(c["numaNodes"])) if c.get("numaNodes") else "-",
                     format_cpulist(c.get("cpus") or []) or "-", devs or "-"])
    return lines + _table(rows, "  ")
