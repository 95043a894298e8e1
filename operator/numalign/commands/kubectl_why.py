"""``kubectl numalign why``: what numalign knows about a Pending or Failed pod.

From objects already read (pure: the caller lists them): the pod's resolved policy
(``numalign.io/resolved``), its rejection (``numalign.io/rejection``, else its status),
the redeploy record of its workload (the ``numalign-redeploy`` ConfigMap of its
namespace), its events (the scheduler's ``FailedScheduling`` messages, extender refusals
included; the agents' and the operator's), and the nodes whose NodeTopology shows they
cannot fit it now (:func:`numalign.api.zonefit.unfit_among`, the operator's own judgement).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from numalign.api.names import ANN_REJECTION, ANN_RESOLVED, REJECTED_PREFIX
from numalign.api.resolved import resolved_or_none
from numalign.api.zonefit import unfit_among
from numalign.commands.explain_pending import FAILED_SCHEDULING, event_time
from numalign.controller.redeploy.record import WorkloadState, workload_key
from numalign.topology.text import printable_doc

JSON = dict[str, Any]

# how many events of a pod the report keeps (the newest)
MAX_EVENTS = 20


def pod_events(events: Iterable[Mapping[str, Any]], pod: Mapping[str, Any]) -> list[JSON]:
    """The pod's events, oldest first (at most :data:`MAX_EVENTS`, the newest)."""
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    out: list[JSON] = []
    for ev in events:
        inv = ev.get("involvedObject") or ev.get("regarding") or {}
        if not isinstance(inv, Mapping):
            continue
        if inv.get("kind", "Pod") != "Pod" or inv.get("name") != meta.get("name"):
            continue
        if uid and inv.get("uid") and inv.get("uid") != uid:
            continue  # an earlier pod of the same name
        source = ev.get("reportingComponent") or (ev.get("source") or {}).get("component") \
            or ev.get("reportingController") or ""
        count = ev.get("count")
        out.append({"type": str(ev.get("type") or ""), "reason": str(ev.get("reason") or ""),
                    "message": str(ev.get("message") or ev.get("note") or ""),
                    "count": count if isinstance(count, int) and count > 0 else 1,
                    "source": str(source), "last": event_time(ev)})
    out.sort(key=lambda e: e["last"])
    return out[-MAX_EVENTS:]


def redeploy_record(pod: Mapping[str, Any], configmap: Mapping[str, Any] | None
                    ) -> JSON | None:
    """The redeploy record of the pod's workload, None when it has none."""
    key = workload_key(pod)
    text = ((configmap or {}).get("data") or {}).get(key)
    if not text:
        return None
    st = WorkloadState.parse(str(text))
    out: JSON = {"workload": key, "attempts": st.attempts,
                 "rejectedBy": dict(sorted((st.rejections or {}).items(),
                                           key=lambda kv: kv[1], reverse=True))}
    for name, value in (("budget", st.budget), ("policy", st.policy), ("last", st.last),
                        ("exhausted", st.exhausted)):
        if value is not None:
            out[name] = value
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    if uid and uid in (st.gave_up or {}):
        out["gaveUpOnThisPod"] = (st.gave_up or {})[uid]
    decision = (st.handled or {}).get(uid)
    if decision:
        out["decision"] = decision
    return out


def why_report(pod: Mapping[str, Any], events: Iterable[Mapping[str, Any]],
               node_topologies: Sequence[Mapping[str, Any]],
               redeploy_configmap: Mapping[str, Any] | None) -> JSON:
    """Everything numalign knows about why ``pod`` is Pending or Failed."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    ann = meta.get("annotations") or {}
    report: JSON = {"namespace": str(meta.get("namespace") or ""),
                    "pod": str(meta.get("name") or ""),
                    "phase": str(status.get("phase") or "Pending"),
                    "node": (pod.get("spec") or {}).get("nodeName")}
    resolved = resolved_or_none(ann.get(ANN_RESOLVED))
    if resolved is not None:
        report["resolved"] = resolved.to_json()
    elif ann.get(ANN_RESOLVED):
        report["resolved"] = {"invalid": str(ann[ANN_RESOLVED])}
    reason, message = status.get("reason"), status.get("message")
    if ann.get(ANN_REJECTION) or (report["phase"] == "Failed" and reason):
        report["rejection"] = {"reason": str(ann.get(ANN_REJECTION) or reason or ""),
                               "message": str(message or "").removeprefix(REJECTED_PREFIX)}
    record = redeploy_record(pod, redeploy_configmap)
    if record is not None:
        report["redeploy"] = record
    evs = pod_events(events, pod)
    report["scheduler"] = [e["message"] for e in evs if e["reason"] == FAILED_SCHEDULING]
    report["events"] = evs
    report["unfit"] = unfit_among(pod, node_topologies)
    report["nodes"] = len(node_topologies)
    report["next"] = _next_steps(report)
    return report


def _next_steps(report: Mapping[str, Any]) -> list[str]:
    name = f"{report['pod']} -n {report['namespace']}"
    out: list[str] = []
    if report.get("node"):
        out.append(f"kubectl numalign explain {name}  (replay the node's decision)")
    if report["nodes"] and len(report["unfit"]) == report["nodes"]:
        out.append("no node can fit the pod now: free resources, or lower its request")
    if not report["nodes"]:
        out.append("no NodeTopology at all: is the numalign agent running on the nodes?")
    if (report.get("redeploy") or {}).get("exhausted"):
        out.append("the redeploy budget is spent: see the TopologyPolicy's redeploy "
                   "settings (README, TopologyPolicy)")
    return out


def _age(ts: str, now: datetime) -> str:
    try:
        t = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return ts or "?"
    s = max(0, int((now - t).total_seconds()))
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def render_why(report: Mapping[str, Any], now: datetime | None = None) -> str:
    """The text view; every string from the cluster in it escaped (a pod's annotations,
    event messages, node names: control characters and bidi overrides shown as escapes)."""
    now = now or datetime.now(UTC)
    report = printable_doc(dict(report))
    lines = [f"Pod {report['namespace']}/{report['pod']}: {report['phase']}"
             + (f" on node {report['node']}" if report.get("node") else " (not bound)")]
    res = report.get("resolved")
    if res is None:
        lines.append(f"Policy:     no {ANN_RESOLVED} (the operator did not resolve it)")
    elif "invalid" in res:
        lines.append(f"Policy:     {ANN_RESOLVED} is not valid: {res['invalid']}")
    else:
        opts = "".join(f", {k}={v}" for k, v in sorted((res.get("options") or {}).items()))
        lines.append(f"Policy:     {res.get('policy') or 'node default'}, scope "
                     f"{res.get('scope') or 'node default'}{opts} (from {res.get('source')})")
    rej = report.get("rejection")
    if rej:
        lines.append(f"Rejected:   {rej['reason']}" + (f": {rej['message']}" if rej["message"]
                                                      else ""))
    rec = report.get("redeploy")
    if rec:
        budget = f" of {rec['budget']}" if "budget" in rec else ""
        nodes = ", ".join(f"{n} ({_age(t, now)} ago)" for n, t in rec["rejectedBy"].items())
        lines.append(f"Redeploy:   {rec['attempts']}{budget} attempts"
                     + (f"; rejected by {nodes}" if nodes else "")
                     + ("; budget spent" if rec.get("exhausted") else "")
                     + ("; gave up on this pod" if rec.get("gaveUpOnThisPod") else ""))
    for msg in report["scheduler"][-3:]:
        lines.append(f"Scheduler:  {msg}")
    n, unfit = report["nodes"], report["unfit"]
    if unfit:
        lines.append(f"Cannot fit: {', '.join(unfit)} ({len(unfit)} of {n} nodes, by their "
                     "NodeTopology now)")
    elif n:
        lines.append(f"Cannot fit: none of {n} nodes is too full for it now")
    others = [e for e in report["events"] if e["reason"] != FAILED_SCHEDULING]
    if others:
        lines.append("Events:")
        for e in others[-8:]:
            count = f" (x{e['count']})" if e["count"] > 1 else ""
            lines.append(f"  {_age(e['last'], now):>4}  {e['type']:<7} {e['reason']}{count}"
                         f"  [{e['source']}] {e['message']}")
    for step in report["next"]:
        lines.append(f"Next:       {step}")
    return "\n".join(lines)


def summary_row(pod: Mapping[str, Any]) -> list[str]:
    """One line of ``why`` without a pod name: a Pending or Failed pod and its reason."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    reason = str(status.get("reason") or "")
    if not reason:
        for c in status.get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                reason = str(c.get("reason") or "Unschedulable")
        if (pod.get("spec") or {}).get("schedulingGates"):
            reason = reason or "SchedulingGated"
    return [str(meta.get("namespace") or ""), str(meta.get("name") or ""),
            str(status.get("phase") or "Pending"), reason or "-",
            str((pod.get("spec") or {}).get("nodeName") or "-")]


def stuck(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in (None, "Pending", "Failed")
