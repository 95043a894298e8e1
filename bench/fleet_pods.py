"""What the fleet bench (bench/bench_fleet.py) sees of its pods on the watch: when each
was first seen, bound and Running, which were rejected with TopologyAffinityError, and
why the ones left Pending are."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench_agent import pct
from fleet_workload import LABEL, VALUE
from numalign.api.kube import Kube
from numalign.api.names import REJECT_REASON


@dataclass
class Pod:
    unit: str
    seen: float
    bound: float | None = None
    running: float | None = None
    phase: str = "Pending"
    why: str = ""  # a Pending pod's reason, a Failed pod's
    gone: bool = False


def pending_reason(obj: dict[str, Any]) -> str:
    spec = obj.get("spec") or {}
    if spec.get("schedulingGates"):
        return "SchedulingGated: " + ",".join(str(g.get("name"))
                                                for g in spec["schedulingGates"])
    if spec.get("nodeName"):
        return "bound, not admitted yet"
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            message = str(c.get("message") or "").split(" preemption:", 1)[0]
            return f"{c.get('reason')}: {message[:160]}"
    return "not scheduled yet"


@dataclass
class Pods:
    pods: dict[str, Pod] = field(default_factory=dict)  # uid -> what was seen
    rejected: set[str] = field(default_factory=set)  # uids Failed with TopologyAffinityError
    first_create: float = 0.0
    last_event: float = field(default_factory=time.monotonic)

    def on_event(self, kind: str, obj: dict[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL) != VALUE:
            return
        self.last_event = now
        uid = str(meta.get("uid"))
        labels = meta.get("labels") or {}
        pod = self.pods.setdefault(uid, Pod(str(labels.get("unit") or meta.get("name")), now))
        if kind == "DELETED":
            pod.gone = True
            return
        if (obj.get("spec") or {}).get("nodeName") and pod.bound is None:
            pod.bound = now
        status = obj.get("status") or {}
        pod.phase = str(status.get("phase") or "Pending")
        if pod.phase == "Running" and pod.running is None:
            pod.running = now
        if pod.phase == "Failed":
            pod.why = str(status.get("reason") or "")
            if pod.why == REJECT_REASON:
                self.rejected.add(uid)
        elif pod.phase == "Pending":
            pod.why = pending_reason(obj)

    def live(self) -> list[Pod]:
        return [p for p in self.pods.values() if not p.gone]

    def running(self) -> int:
        return sum(1 for p in self.live() if p.phase == "Running")

    def summary(self, expected: int) -> dict[str, Any]:
        bound = sorted(p.bound for p in self.pods.values() if p.bound is not None)
        span = (bound[-1] - self.first_create) if bound else 0.0
        lat = [p.running - p.seen for p in self.pods.values() if p.running is not None]
        bind_lat = [p.bound - p.seen for p in self.pods.values() if p.bound is not None]
        live = self.live()
        pending = Counter(p.why for p in live if p.phase == "Pending")
        failed = Counter(p.why for p in live if p.phase == "Failed")
        return {
            "pods_seen": len(self.pods), "pods_expected": expected,
            "running": sum(1 for p in live if p.phase == "Running"),
            "pending": sum(pending.values()), "failed_live": sum(failed.values()),
            "pending_reasons": dict(pending.most_common(8)),
            "failed_reasons": dict(failed.most_common(4)),
            "topology_affinity_errors": len(self.rejected),
            "tae_per_1000_pods": round(1000 * len(self.rejected) / max(expected, 1), 2),
            "bound": len(bound),
            "pods_per_s_scheduled": round(len(bound) / span, 1) if span > 0 else None,
            "create_to_running_p50_s": round(pct(lat, 50), 3),
            "create_to_running_p99_s": round(pct(lat, 99), 3),
            "create_to_bound_p50_s": round(pct(bind_lat, 50), 3),
            "create_to_bound_p99_s": round(pct(bind_lat, 99), 3),
        }


async def watch_pods(kube: Kube, rv: str, on_event: Callable[[str, dict[str, Any], float],
                                                               None],
                     done: Callable[[], bool]) -> None:
    """Every bench pod's event (deletions included) from ``rv`` until ``done()``."""
    while not done():
        async for ev in kube.watch("/api/v1/pods", {"resourceVersion": rv,
                                                    "labelSelector": f"{LABEL}={VALUE}"}):
            obj = ev.get("object") or {}
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
            if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                on_event(str(ev["type"]), obj, time.monotonic())
            if done():
                return
        await asyncio.sleep(0)
