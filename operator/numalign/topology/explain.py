"""Why a pod got its NUMA affinity: the data behind ``numalign explain`` (pure, no I/O).

``explain_pod`` replays the Topology Manager decision(s) of one pod with the engine
(``admit.admit_pod`` on a trial copy of the ledger, nothing committed) and turns what
the engine exposes (``admit.Decision``: each provider's hints; ``merge.MergeResult``: the
filtered per-resource hint lists, the best merged candidates, the best non-preferred
affinity count) into an :class:`Explanation`:

* each hint provider's hints per resource (CPU, memory and each hugepage size, each
  device resource, GPU groups from ``numalign.io/gpus``), with the kubelet's meaning of
  "no preference" (nil) and "cannot satisfy" (empty list);
* the merged candidates that took part in the final comparison, best first (never the
  cross product: the merge works from the structure of the problem and keeps the top
  ``merge.EXPLAIN_CANDIDATES``);
* the winner and why it won: preferred by every resource or not, narrowest, lowest
  average distance under ``prefer-closest-numa-nodes``, lowest node ids, or the
  kubelet's non-preferred rule around B (the best non-preferred affinity count);
* whether the policy admits it, and the allocation (CPUs, memory per zone, hugepages,
  devices, GPU requests).

It also rebuilds a :class:`~numalign.topology.machine.Machine` and a
:class:`~numalign.topology.ledger.Ledger` from the plain data a node's NodeTopology
status holds (``machine_from_status``, ``ledger_from_admitted``) so that the live mode of
``numalign explain`` can replay a decision on a node: those take mappings, not API
objects, and import nothing from Kubernetes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .admit import AdmitResult, DeviceOverride, admit_pod, default_overrides
from .cputopo import cpus_from_topology
from .errors import MachineError, TopologyError
from .hints import NumaMask, TopologyHint, mask_ids, mask_of
from .ledger import MEMORY, ContainerAllocation, Ledger, LedgerError
from .machine import Machine, machine_from_dict
from .merge import REJECT_REASON, Candidate, MergeResult
from .pod import HUGEPAGES_PREFIX, Pod
from .policy import (
    POLICY_BEST_EFFORT,
    POLICY_NONE,
    POLICY_SINGLE_NUMA_NODE,
    PolicyOptions,
)
from .quantity import format_bytes, format_cpulist, parse_cpulist, quantity_bytes

GPU_PROVIDER = "gpu-groups"
# How many hints per resource the text view shows (JSON has them all).
TEXT_HINTS = 8

JSON = dict[str, Any]


# ---------------------------------------------------------------- the explanation


@dataclass
class ResourceView:
    """One resource's hints as one provider gave them."""

    provider: str  # cpu | memory | devices | gpu-groups
    resource: str | None  # None: the provider gave no output at all
    hints: list[TopologyHint] | None  # None: no preference; []: cannot satisfy
    prefers_winner: str = ""  # "yes" | "any" | "no" | "" (no winner)

    @property
    def state(self) -> str:
        if self.hints is None:
            return "no preference"
        if not self.hints:
            return "cannot satisfy"
        return f"{len(self.hints)} hint" + ("" if len(self.hints) == 1 else "s")

    def to_json(self) -> JSON:
        return {"provider": self.provider, "resource": self.resource, "state": self.state,
                "hints": None if self.hints is None else [h.to_json() for h in self.hints],
                "prefersWinner": self.prefers_winner or None}


@dataclass
class DecisionView:
    """One Topology Manager decision (a container, or the pod under the pod scope)."""

    unit: str
    resources: list[ResourceView]
    candidates: list[Candidate]
    preferred_candidates: int | None  # how many preferred merged masks there were
    best_non_preferred: int
    hint: TopologyHint
    admit: bool
    why: str
    admit_why: str
    engine_reason: str = ""
    hint_generation: JSON = field(default_factory=dict)

    def to_json(self) -> JSON:
        return {
            "unit": self.unit,
            "providers": [r.to_json() for r in self.resources],
            "candidates": [c.to_json() for c in self.candidates],
            "preferredCandidates": self.preferred_candidates,
            "bestNonPreferredAffinityCount": self.best_non_preferred,
            "winner": self.hint.to_json(),
            "why": self.why,
            "admit": self.admit,
            "admitWhy": self.admit_why,
            "engineReason": self.engine_reason,
            "hintGeneration": self.hint_generation,
        }


@dataclass
class Explanation:
    pod: str
    namespace: str
    uid: str
    qos: str
    machine: str
    numa_nodes: list[int]
    policy: str
    scope: str
    options: PolicyOptions
    source: str
    admit: bool
    reason: str | None
    message: str | None
    hint: TopologyHint
    decisions: list[DecisionView]
    allocation: JSON  # {"numaNodes", "containers": {...}, "gpus": {...}}
    summary: str
    node: str | None = None
    notes: list[str] = field(default_factory=list)
    recorded: JSON | None = None  # live mode: the pod's numalign.io/allocation

    def to_json(self) -> JSON:
        out: JSON = {
            "pod": self.pod, "namespace": self.namespace, "uid": self.uid, "qos": self.qos,
            "node": self.node, "machine": self.machine, "numaNodes": self.numa_nodes,
            "policy": self.policy, "scope": self.scope, "options": self.options.to_json(),
            "source": self.source, "admit": self.admit, "reason": self.reason,
            "message": self.message, "hint": self.hint.to_json(), "summary": self.summary,
            "decisions": [d.to_json() for d in self.decisions],
            "allocation": self.allocation, "notes": list(self.notes),
        }
        if self.recorded is not None:
            out["recorded"] = self.recorded
        return out


# ---------------------------------------------------------------- building it


def nodes_text(mask: NumaMask | None) -> str:
    """``{0,1}`` for a mask, ``any`` for nil."""
    if mask is None:
        return "any"
    return "{" + ",".join(str(i) for i in mask_ids(mask)) + "}"


def hint_text(mask: NumaMask | None) -> str:
    """``NUMA nodes {0,1}``, or ``no NUMA affinity`` for nil."""
    return "no NUMA affinity" if mask is None else f"NUMA nodes {nodes_text(mask)}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _resource_views(result: AdmitResult, index: int,
                    gpu_resources: set[str]) -> list[ResourceView]:
    d = result.decisions[index]
    views: list[ResourceView] = []
    for name, prov in zip(d.provider_names, d.providers, strict=True):
        if prov is None:
            continue  # no output: nothing the pod asks for concerns this provider
        for res, hints in prov.items():
            label = GPU_PROVIDER if name == "devices" and res in gpu_resources else name
            views.append(ResourceView(label, res, None if hints is None else list(hints)))
    return views


def _prefers(hints: Sequence[TopologyHint], mask: NumaMask) -> str:
    if any(h.preferred and h.mask == mask for h in hints):
        return "yes"
    if any(h.preferred and h.mask is None for h in hints):
        return "any"
    return "no"


def _mark_winner(views: list[ResourceView], merge: MergeResult, winner: NumaMask | None,
                 all_nodes: NumaMask) -> None:
    target = all_nodes if winner is None else winner
    by_res = {r.resource: r for r in merge.resources if r.resource is not None}
    for v in views:
        filtered = by_res.get(v.resource) if v.resource is not None else None
        hints = list(filtered.hints) if filtered is not None else (v.hints or [])
        if v.hints is None:
            v.prefers_winner = "any"
        else:
            v.prefers_winner = _prefers(hints, target)


def _avg(c: Candidate) -> float | None:
    if c.distance_sum is None or not c.width:
        return None
    return c.distance_sum / (c.width * c.width)


def _why_preferred(win: Candidate, others: Sequence[Candidate], n_pref: int | None,
                   closest: bool) -> str:
    head = (f"{nodes_text(win.mask)} is preferred by every resource that has hints "
            f"(each offers it as a preferred hint, or has no preference)")
    if not others:
        if n_pref is not None and n_pref > 1:
            return head + f", and it ranks first of {n_pref} preferred candidates."
        return head + "; it is the only mask they all prefer."
    nxt = others[0]
    if win.width < nxt.width:
        return (head + f"; it is the narrowest preferred candidate "
                f"({_plural(win.width, 'NUMA node')}; the next, {nodes_text(nxt.mask)}, "
                f"spans {nxt.width}).")
    a, b = _avg(win), _avg(nxt)
    if closest and a is not None and b is not None and a < b:
        return (head + f"; among the preferred candidates {win.width} wide it has the "
                f"lowest average distance ({a:g}, against {b:g} for {nodes_text(nxt.mask)}; "
                f"prefer-closest-numa-nodes).")
    if closest and a is not None:
        return (head + f"; among the preferred candidates {win.width} wide it is one of the "
                f"closest (average distance {a:g}, prefer-closest-numa-nodes) and has the "
                f"lowest NUMA node ids of those (ahead of {nodes_text(nxt.mask)}).")
    return (head + f"; among the preferred candidates {win.width} wide it has the lowest "
            f"NUMA node ids (ahead of {nodes_text(nxt.mask)}).")


def _why_non_preferred(win: Candidate, others: Sequence[Candidate],
                       views: Sequence[ResourceView], bnp: int, closest: bool) -> str:
    refusing = [str(v.resource) for v in views if v.prefers_winner == "no"]
    who = (f" ({', '.join(refusing)} do{'es' if len(refusing) == 1 else ''} not prefer it)"
           if refusing else "")
    c = win.width
    if c == bnp:
        rule = f"it is {c} wide, equal to B, which ranks first"
    elif c < bnp:
        rule = f"no merged mask is {bnp} wide; it is the widest below B ({c})"
    else:
        rule = f"nothing {bnp} wide or narrower can be merged; it is the narrowest above B ({c})"
    tie = ""
    if others and others[0].width == win.width:
        nxt = others[0]
        a, b = _avg(win), _avg(nxt)
        if closest and a is not None and b is not None and a < b:
            tie = (f"; of the masks {c} wide it has the lowest average distance ({a:g}, "
                   f"against {b:g} for {nodes_text(nxt.mask)})")
        else:
            tie = f"; of the masks {c} wide it has the lowest node ids (ahead of " \
                  f"{nodes_text(nxt.mask)})"
    return (f"No NUMA mask is preferred by every resource, so the best non-preferred merged "
            f"hint wins: {nodes_text(win.mask)}{who}. The kubelet ranks non-preferred hints "
            f"around B = {bnp} (the widest of the resources' narrowest hints): {rule}{tie}.")


def _decision_view(result: AdmitResult, index: int, machine: Machine,
                   options: PolicyOptions, gpu_resources: set[str]) -> DecisionView:
    d = result.decisions[index]
    policy = result.policy
    views = _resource_views(result, index, gpu_resources)
    m = d.merge
    all_nodes = mask_of(machine.numa_ids)
    gen: JSON = {}
    if d.plan is not None:
        gen = {"method": d.plan.method, "exact": d.plan.exact, "notes": list(d.plan.notes)}
    if m is None:
        return DecisionView(d.unit, views, [], None, 0, d.hint, d.admit,
                            "Policy none: the Topology Manager does not align resources; "
                            "CPUs, memory and devices come from any NUMA node.",
                            "none admits every pod.", "policy none", gen)
    winner_mask = d.hint.mask
    cands = list(m.candidates)
    if cands:
        _mark_winner(views, m, winner_mask, all_nodes)
    closest = options.prefer_closest_numa_nodes and policy != POLICY_SINGLE_NUMA_NODE
    n_pref = m.stats.get("preferred_candidates")
    if not views:
        why = ("No provider has a preference (the container asks for no exclusive CPUs, "
               "no Guaranteed memory and no NUMA-local devices), so the merged hint is "
               "every NUMA node, preferred.")
    elif cands and (winner_mask == cands[0].mask or
                    (winner_mask is None and cands[0].mask == all_nodes)):
        win = cands[0]
        if win.preferred:
            why = _why_preferred(win, cands[1:], n_pref, closest)
        else:
            why = _why_non_preferred(win, cands[1:], views,
                                     m.best_non_preferred_affinity_count, closest)
    else:
        why = m.reason[:1].upper() + m.reason[1:] + "."
    if policy == POLICY_SINGLE_NUMA_NODE:
        why += (" Under single-numa-node only preferred hints one NUMA node wide (or with no "
                "preference) take part.")
        if winner_mask is None and views:
            why += " The merge gave every NUMA node, which single-numa-node reports as no " \
                   "affinity."
    if policy == POLICY_BEST_EFFORT:
        admit_why = "best-effort admits whatever hint wins."
    elif d.hint.preferred:
        admit_why = f"{policy} admits preferred hints: admitted."
    else:
        admit_why = (f"{policy} admits only preferred hints and this one is not: rejected "
                     f"with {REJECT_REASON}.")
    return DecisionView(d.unit, views, cands, n_pref, m.best_non_preferred_affinity_count,
                        d.hint, d.admit, why, admit_why, m.reason, gen)


def _allocation_json(result: AdmitResult) -> JSON:
    containers: JSON = {}
    for name, c in result.containers.items():
        a = c.allocation
        entry: JSON = {"numaNodes": list(c.numa_nodes), "cpus": list(a.cpus),
                       "memory": {str(n): b for n, b in sorted(a.memory.get(MEMORY, {}).items())
                                  if b},
                       "devices": {r: list(ids) for r, ids in sorted(a.devices.items()) if ids}}
        huge = {k.removeprefix(HUGEPAGES_PREFIX): {str(n): b for n, b in sorted(per.items()) if b}
                for k, per in sorted(a.memory.items()) if k.startswith(HUGEPAGES_PREFIX)}
        huge = {k: v for k, v in huge.items() if v}
        if huge:
            entry["hugepages"] = huge
        containers[name] = entry
    numa = (mask_ids(result.hint.mask) if result.hint.mask is not None
            else sorted({n for c in result.containers.values() for n in c.numa_nodes}))
    return {"numaNodes": numa if result.admit else [], "containers": containers,
            "gpus": {k: list(v) for k, v in result.gpus.items()}}


def _summary(result: AdmitResult, views: Sequence[DecisionView]) -> str:
    pod = f"{result.pod.namespace}/{result.pod.name}"
    if result.policy == POLICY_NONE:
        return f"{pod} is admitted under policy none: no NUMA alignment."
    if not result.admit:
        failed = views[-1] if views else None
        unit = f" (decision for {failed.unit})" if failed and failed.unit != "pod" else ""
        if result.reason == REJECT_REASON and failed is not None:
            return (f"{pod} is rejected{unit}: the best merged hint "
                    f"({hint_text(failed.hint.mask)}) is not preferred and {result.policy} "
                    f"admits only preferred hints ({REJECT_REASON}).")
        return f"{pod} is rejected{unit}: {result.reason}: {result.message}"
    pref = "preferred" if result.hint.preferred else "not preferred"
    return (f"{pod} is admitted under {result.policy} ({result.scope} scope) with "
            f"{hint_text(result.hint.mask)}, {pref}.")


def explain_pod(machine: Machine, pod: Pod, policy: str, scope: str,
                options: PolicyOptions | None = None, ledger: Ledger | None = None, *,
                source: str = "command line",
                overrides: Sequence[DeviceOverride] | None = None) -> Explanation:
    """Replay the admission of ``pod`` on ``machine`` (against ``ledger``, which is left
    unchanged) and explain it. Raises TopologyError for bad input (unknown policy or
    scope, a pod asking for more than the machine has, a bad ``numalign.io/gpus``)."""
    opts = options if options is not None else PolicyOptions()
    base = ledger if ledger is not None else Ledger(machine)
    ovs = list(overrides) if overrides is not None else default_overrides(machine, pod)
    gpu_resources = {r for o in ovs for r in o.resources}
    result = admit_pod(machine, base, pod, policy, scope, opts, overrides=ovs, commit=False)
    views = [_decision_view(result, i, machine, opts, gpu_resources)
             for i in range(len(result.decisions))]
    notes: list[str] = []
    for v in views:
        gen = v.hint_generation
        if gen.get("method") == "reduced":
            notes.append(f"{v.unit}: {len(machine.numa_ids)} NUMA nodes: hint lists are "
                         "reduced to the masks that can win (the full lists have up to "
                         "2^N entries); the merge answer is the kubelet's"
                         + ("" if gen.get("exact", True) else ", but this search was not "
                            "exhaustive"))
    return Explanation(
        pod=pod.name, namespace=pod.namespace, uid=pod.uid, qos=pod.qos, machine=machine.name,
        numa_nodes=machine.numa_ids, policy=policy, scope=scope, options=opts, source=source,
        admit=result.admit, reason=result.reason, message=result.message, hint=result.hint,
        decisions=views, allocation=_allocation_json(result) if result.admit else
        {"numaNodes": [], "containers": {}, "gpus": {}},
        summary=_summary(result, views), notes=notes)


# ---------------------------------------------------------------- text view


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
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r, widths, strict=True)]
        out.append((indent + "  ".join(cells)).rstrip())
    return out


def _bytes_per_zone(per: Mapping[str, int]) -> str:
    return ", ".join(f"{format_bytes(b)} on {z}" for z, b in per.items()) or "-"


def render_text(e: Explanation) -> str:
    """The human view: aligned tables and a short "why" per decision."""
    lines: list[str] = []
    where = f"node {e.node} (machine {e.machine})" if e.node else f"machine {e.machine}"
    lines.append(f"Pod:      {e.namespace}/{e.pod}  (QoS {e.qos})")
    lines.append(f"Node:     {where}, NUMA nodes {', '.join(map(str, e.numa_nodes))}")
    opts = []
    if e.options.prefer_closest_numa_nodes:
        opts.append("prefer-closest-numa-nodes")
    opt_text = f", options: {', '.join(opts)}" if opts else ""
    lines.append(f"Policy:   {e.policy}, scope {e.scope}{opt_text}  (from {e.source})")
    lines.append(f"Result:   {'ADMITTED' if e.admit else 'REJECTED'}"
                 + (f" ({e.reason})" if e.reason else ""))
    lines.append("")
    lines.append(e.summary)
    for d in e.decisions:
        lines.append("")
        title = "Pod-scope decision" if d.unit == "pod" else f"Container {d.unit}"
        lines.append(f"{title}:")
        if e.policy == POLICY_NONE:
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
                a = _avg(c)
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
    if e.recorded is not None:
        lines.append("")
        lines.append("Recorded by the agent (numalign.io/allocation): "
                     + json.dumps(e.recorded, sort_keys=True, separators=(",", ":")))
    for n in e.notes:
        lines.append(f"Note: {n}")
    return "\n".join(lines)


# ---------------------------------------------------------------- from NodeTopology data


def _mapping(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise TopologyError(where, "must be a mapping")
    return v


def machine_from_status(status: Mapping[str, Any], name: str = "node") -> Machine:
    """The machine a NodeTopology status describes (zones, CPU topology, distances,
    devices).

    ``status.cpuTopology`` gives the core and socket of every CPU exactly (see
    :mod:`.cputopo`); a status without it (an older agent) gets one thread per core and
    one socket per NUMA node, which can change which CPU ids are picked but not the NUMA
    hints. Raises MachineError naming the status field."""
    zones = status.get("zones")
    if not isinstance(zones, list) or not zones:
        raise MachineError("status.zones", "has no zones (the agent has not published yet)")
    nodes: list[JSON] = []
    ids: list[int] = []
    for i, z in enumerate(zones):
        z = _mapping(z, f"status.zones[{i}]")
        zid = z.get("id")
        if not isinstance(zid, int) or isinstance(zid, bool):
            raise MachineError(f"status.zones[{i}].id", "must be an integer")
        ids.append(zid)
        node: JSON = {"id": zid, "cpus": str(z.get("cpus") or ""),
                      "memory": z.get("memory") if z.get("memory") is not None else 0}
        if z.get("hugepages"):
            node["hugepages"] = dict(_mapping(z["hugepages"], f"status.zones[{i}].hugepages"))
        nodes.append(node)
    doc: JSON = {"name": name, "numaNodes": nodes}
    raw_d = status.get("distances")
    if raw_d:
        d = _mapping(raw_d, "status.distances")
        rows: list[list[int]] = []
        for a in ids:
            row = d.get(str(a))
            if not isinstance(row, Mapping):
                raise MachineError(f"status.distances.{a}", "is missing")
            vals: list[int] = []
            for b in ids:
                v = row.get(str(b))
                if not isinstance(v, int) or isinstance(v, bool):
                    raise MachineError(f"status.distances.{a}.{b}", "must be an integer")
                vals.append(v)
            rows.append(vals)
        doc["distances"] = rows
    devices: list[JSON] = []
    for i, dv in enumerate(status.get("devices") or []):
        dv = _mapping(dv, f"status.devices[{i}]")
        dev: JSON = {"resource": dv.get("resource"), "id": dv.get("id"),
                     "numaNode": dv.get("numaNode")}
        if dv.get("memory") is not None:
            dev["memory"] = dv["memory"]
        groups = dv.get("groups") or []
        if isinstance(groups, list):
            dev["groups"] = {str(g.get("level")): str(g.get("id")) for g in groups
                             if isinstance(g, Mapping)}
        devices.append(dev)
    doc["devices"] = devices
    machine = machine_from_dict(doc, source="NodeTopology status")
    topo = status.get("cpuTopology")
    if topo is None:
        return machine
    numa_of = {c: n.id for n in machine.numa_nodes for c in n.cpus}
    try:
        cpus = cpus_from_topology(numa_of, _mapping(topo, "status.cpuTopology"),
                                  "status.cpuTopology")
    except MachineError as e:
        raise MachineError(f"NodeTopology status: {e.field}", e.problem) from None
    return replace(machine, cpus=cpus)


def _cpus(v: Any, where: str) -> tuple[int, ...]:
    if v is None or v == "":
        return ()
    if isinstance(v, str):
        try:
            return tuple(parse_cpulist(v))
        except ValueError as e:
            raise LedgerError(where, str(e)) from None
    if isinstance(v, list) and all(isinstance(c, int) and not isinstance(c, bool) for c in v):
        return tuple(v)
    raise LedgerError(where, "must be a cpulist string or a list of CPU ids")


def _zone_bytes(v: Any, where: str) -> dict[int, int]:
    if not v:
        return {}
    if not isinstance(v, Mapping):
        raise LedgerError(where, "must map a NUMA node id to an amount")
    out: dict[int, int] = {}
    for z, b in v.items():
        try:
            out[int(z)] = quantity_bytes(b)
        except (TypeError, ValueError) as e:
            raise LedgerError(f"{where}.{z}", str(e)) from None
    return out


def container_allocation(entry: Mapping[str, Any], where: str) -> ContainerAllocation:
    """A container's holdings from published or annotated data: ``cpus`` (cpulist or
    ids), ``memory`` ({zone: bytes or quantity}), ``hugepages`` ({size: {zone: ...}}),
    ``devices`` ({resource: [ids]}), ``memoryNumaNodes`` (the memory affinity; else
    ``numaNodes``)."""
    memory: dict[str, dict[int, int]] = {}
    mem = _zone_bytes(entry.get("memory"), f"{where}.memory")
    if mem:
        memory[MEMORY] = mem
    huge = entry.get("hugepages") or {}
    if not isinstance(huge, Mapping):
        raise LedgerError(f"{where}.hugepages", "must map a page size to zones")
    for size, per in huge.items():
        got = _zone_bytes(per, f"{where}.hugepages.{size}")
        if got:
            memory[HUGEPAGES_PREFIX + str(size)] = got
    devices_raw = entry.get("devices") or {}
    if not isinstance(devices_raw, Mapping):
        raise LedgerError(f"{where}.devices", "must map a resource to device ids")
    devices = {str(r): tuple(str(i) for i in ids) for r, ids in devices_raw.items()
               if isinstance(ids, list) and ids}
    mask: NumaMask | None = None
    mem_numa = entry.get("memoryNumaNodes")
    if isinstance(mem_numa, list) and mem_numa:
        # the memory manager's block affinity (numalign admit, the allocation annotation);
        # a container reusing its init container's memory holds a block of no new bytes
        mask = mask_of([int(n) for n in mem_numa])
        memory.setdefault(MEMORY, {})
    elif memory:
        numa = entry.get("numaNodes")
        nodes = ([int(n) for n in numa] if isinstance(numa, list) and numa
                 else sorted({n for per in memory.values() for n in per}))
        mask = mask_of(nodes)
    return ContainerAllocation(cpus=_cpus(entry.get("cpus"), f"{where}.cpus"), memory=memory,
                               memory_mask=mask, devices=devices)


@dataclass(frozen=True)
class HeldPod:
    uid: str
    name: str
    namespace: str
    containers: tuple[tuple[str, ContainerAllocation], ...]


def held_from_admitted(entry: Mapping[str, Any], where: str) -> HeldPod:
    """One ``status.admitted`` entry of a NodeTopology (per-container detail when present,
    else the pod's totals as one container)."""
    uid = str(entry.get("uid") or "")
    name = str(entry.get("pod") or uid)
    ns = str(entry.get("namespace") or "default")
    items: list[tuple[str, ContainerAllocation]] = []
    raw = entry.get("containers")
    if isinstance(raw, list) and raw:
        for i, c in enumerate(raw):
            c = _mapping(c, f"{where}.containers[{i}]")
            items.append((str(c.get("name") or i),
                          container_allocation(c, f"{where}.containers[{i}]")))
    elif isinstance(raw, Mapping) and raw:  # `numalign admit` output / allocation annotation
        for cname, c in raw.items():
            items.append((str(cname),
                          container_allocation(_mapping(c, f"{where}.containers.{cname}"),
                                               f"{where}.containers.{cname}")))
    else:
        items.append(("", container_allocation(entry, where)))
    return HeldPod(uid or f"{ns}/{name}", name, ns, tuple(items))


def ledger_from_held(machine: Machine, pods: Iterable[HeldPod],
                     exclude: tuple[str, str, str] | None = None) -> tuple[Ledger, list[str]]:
    """A ledger holding ``pods`` except the one matching ``exclude`` (uid, namespace,
    name); also one note per pod that could not be put back (it would double-allocate)."""
    ledger = Ledger(machine)
    notes: list[str] = []
    for p in pods:
        if exclude is not None and (p.uid == exclude[0] or
                                    (p.namespace, p.name) == (exclude[1], exclude[2])):
            continue
        if p.uid in ledger.pods:
            notes.append(f"pod {p.namespace}/{p.name} is listed twice; the second is ignored")
            continue
        try:
            ledger.allocate_many(p.uid, list(p.containers), pod_name=p.name,
                                 namespace=p.namespace)
        except TopologyError as e:
            notes.append(f"allocation of {p.namespace}/{p.name} ignored: {e}")
    return ledger, notes


def held_from_document(doc: Any, source: str = "allocations") -> list[HeldPod]:
    """Allocations already on the machine, from any of: a NodeTopology object, its status,
    ``{"admitted": [...]}``, a list of ``status.admitted`` entries, a ledger dump
    (``{"pods": [{"uid", "containers": {NAME: {...}}}]}``), or a list of ``numalign admit``
    output lines (rejected pods are skipped)."""
    if isinstance(doc, Mapping):
        if isinstance(doc.get("status"), Mapping):
            doc = doc["status"]
        if isinstance(doc, Mapping) and "admitted" in doc:
            doc = doc.get("admitted") or []
        elif isinstance(doc, Mapping) and isinstance(doc.get("pods"), list):
            return [_held_from_ledger_pod(p, f"{source}: pods[{i}]")
                    for i, p in enumerate(doc["pods"])]
        elif isinstance(doc, Mapping) and "pod" in doc:
            doc = [doc]
    if not isinstance(doc, list):
        raise TopologyError(source, "must be a NodeTopology, its status, a list of admitted "
                                    "entries, a ledger or `numalign admit` output")
    out: list[HeldPod] = []
    for i, entry in enumerate(doc):
        where = f"{source}: [{i}]"
        entry = _mapping(entry, where)
        if "pod" not in entry and "uid" not in entry:
            raise TopologyError(where, "is not an admitted pod entry (no pod or uid)")
        if entry.get("admit") is False:
            continue
        out.append(held_from_admitted(entry, where))
    return out


def _held_from_ledger_pod(p: Any, where: str) -> HeldPod:
    p = _mapping(p, where)
    uid = p.get("uid")
    if not isinstance(uid, str) or not uid:
        raise TopologyError(f"{where}.uid", "is required")
    containers = _mapping(p.get("containers") or {}, f"{where}.containers")
    items = tuple((str(n), ContainerAllocation.from_json(a, f"{where}.containers.{n}"))
                  for n, a in containers.items())
    return HeldPod(uid, str(p.get("name") or uid), str(p.get("namespace") or "default"), items)
