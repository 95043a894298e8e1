"""``numalign explain POD`` for a pod not bound yet: which nodes numalign's scheduler
extender refuses it on and why, decided as the extender decides (every NodeTopology,
the pods bound but not yet published held as reservations), beside what the scheduler
last said (its ``FailedScheduling`` event, whose message carries the extender's refusals
counted by reason)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from numalign.extender.decide import Verdict
from numalign.extender.fleet import Fleet
from numalign.topology.text import printable_doc

JSON = dict[str, Any]


def pending_verdicts(pod: Mapping[str, Any], nodetopologies: Sequence[Mapping[str, Any]],
                     bound_pods: Sequence[Mapping[str, Any]]) -> list[Verdict]:
    """The extender's verdict for ``pod`` on every node that has a NodeTopology."""
    fleet = Fleet()
    fleet.load_nodetopologies(nodetopologies)
    fleet.load_pods(bound_pods)
    names = sorted(fleet.decider.views)
    return fleet.filter(pod, names, approve=False)


# The reason of the scheduler's event for a pod it cannot place (its message counts the
# extender's refusals).
FAILED_SCHEDULING = "FailedScheduling"


def event_time(ev: Mapping[str, Any]) -> str:
    """When an Event last happened (RFC 3339; its creation when it says nothing else)."""
    return str(ev.get("lastTimestamp") or ev.get("eventTime")
               or (ev.get("metadata") or {}).get("creationTimestamp") or "")


def last_failed_scheduling(events: Sequence[Mapping[str, Any]]) -> str | None:
    """The message of the newest ``FailedScheduling`` event among ``events``."""
    found = [(event_time(e), str(e.get("message")))
             for e in events if e.get("reason") == FAILED_SCHEDULING]
    return max(found)[1] if found else None


def pending_json(name: str, namespace: str, verdicts: Sequence[Verdict],
                 scheduler: str | None) -> JSON:
    return {"pod": name, "namespace": namespace, "bound": False,
            "nodes": [v.to_json() for v in verdicts],
            "fits": sorted(v.node for v in verdicts if v.fits),
            "refused": {v.node: v.failure for v in verdicts if not v.fits},
            "scheduler": scheduler}


def render_pending(doc: Mapping[str, Any]) -> str:
    """The text view (every string from the cluster escaped: the scheduler's message,
    node names, the extender's reasons)."""
    doc = printable_doc(dict(doc))
    lines = [f"Pod {doc['namespace']}/{doc['pod']}: not bound to a node yet"]
    if doc.get("scheduler"):
        lines.append(f"The scheduler said: {doc['scheduler']}")
    nodes = doc.get("nodes") or []
    if not nodes:
        lines.append("No node has a NodeTopology: numalign decides nothing here (is the "
                     "agent running? kubectl get nodetopology)")
        return "\n".join(lines)
    refused = doc.get("refused") or {}
    lines += ["", f"numalign's scheduler extender, node by node "
                  f"({len(nodes) - len(refused)} fit, {len(refused)} refused):"]
    width = max(len(str(n["node"])) for n in nodes)
    for n in nodes:
        policy = n.get("policy") or {}
        how = f"policy {policy.get('policy')}, scope {policy.get('scope')}" if policy else ""
        if n["fits"]:
            where = f"NUMA nodes {n['numaNodes']}" if n.get("numaNodes") else "no NUMA affinity"
            text = f"fits: {where}, score {n['score']}/10" + (f" ({how})" if how else "")
            if not n.get("covered", True):
                text = f"passes: {n.get('note')}"
        else:
            text = f"refused: {refused.get(n['node'])}"
        lines.append(f"  {n['node']!s:<{width}}  {text}")
    lines += ["", "Nodes without a NodeTopology pass the extender (fail open); the "
                  "scheduler's own filters (resources, affinity, taints) are in its "
                  "message above."]
    return "\n".join(lines)
