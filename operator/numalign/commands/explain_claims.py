"""``numalign explain`` for a pod with ResourceClaims (live mode): its claims, each one's
allocated devices (driver, pool, device) with their NUMA nodes from the node's
NodeTopology ``status.draDevices``, and the replay made with them as the ``dra`` kind's
fixed hints (:mod:`numalign.topology.managers.dra`), as the emulated node admits it;
the text view's "Claims" section says which NUMA nodes the devices gave each container
and where its CPUs went."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from numalign.api.draclaims import (
    REJECTED_DEVICES_REASON,
    PodDraDevices,
    claim_path,
    emulated_kind_of,
    pod_claims,
    pod_dra_devices,
    status_devices,
    uses_claims,
)
from numalign.topology.explain import Explanation
from numalign.topology.machine import Machine
from numalign.topology.managers.dra import DraDevices
from numalign.topology.quantity import format_cpulist
from numalign.topology.text import printable

JSON = dict[str, Any]

# Reads one object: (API path, what it is for errors) -> the object, or None (404).
Read = Callable[[str, str], "dict[str, Any] | None"]


def pod_devices(read: Read, pod: Mapping[str, Any], nt: Mapping[str, Any],
                machine: Machine) -> PodDraDevices | None:
    """The pod's claims and devices on its node; None for a pod without claims."""
    if not uses_claims(pod):
        return None
    ns = str((pod.get("metadata") or {}).get("namespace") or "default")
    claims: dict[str, Mapping[str, Any] | None] = {}
    for ref in pod_claims(pod)[0]:
        if ref.claim and ref.claim not in claims:
            claims[ref.claim] = read(claim_path(ns, ref.claim),
                                     f"ResourceClaim {ns}/{ref.claim}")
    status = nt.get("status") or {}
    entries = status.get("draDevices")
    devices = None if entries is None else status_devices(entries)
    return pod_dra_devices(pod, claims, devices, machine.numa_ids, emulated_kind_of(machine))


def kinds(got: PodDraDevices | None) -> list[DraDevices]:
    """The replay's ``dra`` kind (none without claims)."""
    return [] if got is None else [DraDevices(got.requests())]


def claims_json(got: PodDraDevices, ex: Explanation, pod: Mapping[str, Any]) -> JSON:
    """The ``claims`` part of the explanation: the claims as read, and per container the
    NUMA nodes its claim devices give and those its CPUs got."""
    out = got.to_json()
    per: JSON = {}
    for name, c in ex.allocation.get("containers", {}).items():
        devs = got.devices_of(name)
        if not devs:
            continue
        numa = sorted({n for _, d in devs for n in d.numa_nodes or ()})
        per[name] = {"deviceNumaNodes": numa, "numaNodes": c.get("numaNodes") or [],
                     "cpus": c.get("cpus") or []}
    out["aligned"] = per
    phase = (pod.get("status") or {}).get("phase")
    if phase in ("Failed", "Succeeded") and not got.ready:
        out["problems"].append(
            f"the pod is {phase}: its claims are released (one from a template is deleted), "
            f"so the replay has none of their devices; the pod's {REJECTED_DEVICES_REASON} "
            "event names those it was decided with")
    return out


def _nodes(ids: list[int]) -> str:
    return "NUMA " + ",".join(map(str, ids)) if ids else "NUMA unknown"


def claims_text(claims: Mapping[str, Any]) -> list[str]:
    """The text view's "Claims" section."""
    lines = ["Claims:"]
    rows = [["CLAIM", "RESOURCECLAIM", "REQUEST", "DEVICE", "NUMA"]]
    notes: list[str] = []
    for c in claims.get("claims") or []:
        obj = c.get("resourceClaim") or "-"
        if c.get("template"):
            obj += f" (from template {c['template']})"
        if not c.get("allocated"):
            rows.append([c["name"], obj, "-", "not allocated", "-"])
        for d in c.get("devices") or []:
            rows.append([c["name"], obj, d["request"],
                         f"{d['driver']}/{d['pool']}/{d['device']}",
                         ",".join(map(str, d["numaNodes"])) if d.get("numaNodes")
                         else "unknown"])
            if d.get("problem"):
                notes.append(f"{c['name']}: {d['device']}: no NUMA hint: {d['problem']}")
        if c.get("problem"):
            notes.append(f"{c['name']}: {c['problem']}")
    lines += _rows(rows)
    for name, a in (claims.get("aligned") or {}).items():
        cpus = format_cpulist(a.get("cpus") or []) or "none exclusive"
        lines.append(f"  Container {name}: its claim devices are on "
                     f"{_nodes(a['deviceNumaNodes'])}; the merged hint gave it "
                     f"{_nodes(a['numaNodes'])}, CPUs {cpus}")
    for p in claims.get("problems") or []:
        notes.append(p)
    lines += [f"  Problem: {printable(n)}" for n in notes]
    return lines


def _rows(rows: list[list[str]]) -> list[str]:
    rows = [[printable(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [("    " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()
            for r in rows]


__all__ = ["claims_json", "claims_text", "kinds", "pod_devices"]
