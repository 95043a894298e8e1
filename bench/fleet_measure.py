"""What the fleet bench (bench/bench_fleet.py) reads besides the pods: the API server's
audit log (requests by component), the processes' memory and CPU, kube-scheduler's
metrics, and a no-op scheduler extender (HTTP only: every node passes, scores 0, binds
as asked) that isolates what the extender's HTTP round trips cost a scheduling cycle."""

from __future__ import annotations

import json
import os
import ssl
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# -------------------------------------------------------------------- audit log

AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
  - level: Metadata
"""
READS = {"get", "list", "watch"}


def audit_flags(workdir: Path) -> tuple[list[str], Path]:
    """kube-apiserver flags for an audit log at Metadata level (one line per request,
    written when it completes) and the log's path."""
    workdir.mkdir(parents=True, exist_ok=True)
    policy = workdir / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    log = workdir / "audit.log"
    return [f"--audit-policy-file={policy}", f"--audit-log-path={log}",
            "--audit-log-format=json", "--audit-log-maxsize=0", "--audit-log-maxbackup=0"], log


def component(user_agent: str) -> str:
    """Who made a request, by its User-Agent: numalign's components by name, Kopf's
    (the operator's watches and its own patches) as the operator's."""
    if user_agent.startswith("kopf/"):
        return "numalign-operator"
    head = user_agent.split("/", 1)[0].split(" ", 1)[0]
    return head or "unknown"


def log_offset(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


@dataclass
class Requests:
    """Requests by component, read from the audit log between two offsets."""

    by_component: Counter[str] = field(default_factory=Counter)
    reads: Counter[str] = field(default_factory=Counter)
    writes: Counter[str] = field(default_factory=Counter)
    what: dict[str, Counter[str]] = field(default_factory=dict)  # component -> verb resource

    def summary(self, pods: int, top: int = 6) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for comp, n in self.by_component.most_common():
            out[comp] = {"requests": n, "per_pod": round(n / max(pods, 1), 2),
                         "reads": self.reads[comp], "writes": self.writes[comp],
                         "top": dict(self.what[comp].most_common(top))}
        return out


def read_audit(path: Path, start: int, end: int | None = None) -> Requests:
    out = Requests()
    with path.open("rb") as f:
        f.seek(start)
        data = f.read() if end is None else f.read(max(0, end - start))
    for line in data.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("stage") != "ResponseComplete":
            continue
        comp = component(str(ev.get("userAgent") or ""))
        verb = str(ev.get("verb") or "")
        ref = ev.get("objectRef") or {}
        res = str(ref.get("resource") or ev.get("requestURI", "?").split("?")[0])
        if ref.get("subresource"):
            res += "/" + str(ref["subresource"])
        out.by_component[comp] += 1
        (out.reads if verb in READS else out.writes)[comp] += 1
        out.what.setdefault(comp, Counter())[f"{verb} {res}"] += 1
    return out


# -------------------------------------------------------------------- processes

TICKS = os.sysconf("SC_CLK_TCK")


def proc_stats(pid: int | None) -> dict[str, float]:
    """RSS and peak RSS (MiB), CPU seconds (user + system) of a process so far."""
    if pid is None:
        return {}
    out: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss_mib"] = round(int(line.split()[1]) / 1024, 1)
            elif line.startswith("VmHWM:"):
                out["peak_rss_mib"] = round(int(line.split()[1]) / 1024, 1)
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out["cpu_s"] = round((int(fields[11]) + int(fields[12])) / TICKS, 1)
    except (OSError, IndexError, ValueError):
        pass
    return out


# -------------------------------------------------------------------- kube-scheduler


def get_metrics(url: str, cert: Path, key: Path) -> str:
    """A component's /metrics over HTTPS with the admin's client certificate (its
    self-signed serving certificate not verified)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(str(cert), str(key))
    with urllib.request.urlopen(url, timeout=10, context=ctx) as resp:
        return str(resp.read().decode())


def _quantile(buckets: list[tuple[float, float]], p: float) -> float | None:
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = p / 100 * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = le, count
    return lower


def histogram_stats(text: str, metric: str, **labels: str) -> dict[str, Any]:
    """count, mean, p50, p99 (ms) of a histogram over the series matching ``labels``."""
    acc: dict[float, float] = {}
    total = count = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.startswith(metric) or any(s.labels.get(k) != v
                                                    for k, v in labels.items()):
                continue
            if s.name == f"{metric}_bucket":
                le = float(s.labels["le"])
                acc[le] = acc.get(le, 0.0) + s.value
            elif s.name == f"{metric}_sum":
                total += s.value
            elif s.name == f"{metric}_count":
                count += s.value
    buckets = sorted(acc.items())
    ms = {p: _quantile(buckets, p) for p in (50, 99)}
    return {"count": int(count), "mean_ms": round(1000 * total / count, 2) if count else None,
            **{f"p{p}_ms": None if v is None else round(1000 * v, 2) for p, v in ms.items()}}


def scheduler_summary(text: str) -> dict[str, Any]:
    """A pod's scheduling algorithm (filter, the extender's filter and prioritize, score)
    and attempt (scheduled ones: to the end of binding, the extender's bind included), the
    framework's extension points (the extender is none of them), attempts by result."""
    out: dict[str, Any] = {
        # the serial part of a pod's cycle: filter, the extenders' filter and prioritize,
        # score (binding runs beside the next pods' cycles)
        "algorithm": histogram_stats(text, "scheduler_scheduling_algorithm_duration_seconds"),
        "attempt_scheduled": histogram_stats(
            text, "scheduler_scheduling_attempt_duration_seconds", result="scheduled"),
        "attempt_unschedulable": histogram_stats(
            text, "scheduler_scheduling_attempt_duration_seconds", result="unschedulable"),
        "pod_sli": histogram_stats(text, "scheduler_pod_scheduling_sli_duration_seconds"),
    }
    for point in ("PreFilter", "Filter", "PreScore", "Score", "Reserve", "Permit", "PreBind",
                  "Bind"):
        st = histogram_stats(text, "scheduler_framework_extension_point_duration_seconds",
                             extension_point=point, status="Success")
        if st["count"]:
            out[f"point_{point}"] = st
    attempts: Counter[str] = Counter()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "scheduler_schedule_attempts_total":
                attempts[s.labels.get("result", "?")] += int(s.value)
    out["attempts"] = dict(attempts)
    return out
