"""Prometheus metrics on ``/metrics``.

- ``numalign_pods_admitted{node,policy}`` / ``numalign_pods_rejected{node}``: from the
  NodeTopology statuses (admitted list and rejected count), refreshed by a timer;
- ``numalign_rejections_observed_total{node}``: TopologyAffinityError pods the operator saw;
- ``numalign_redeploys_total{outcome}``: deleted | recreated | gave_up;
- ``numalign_fit_check_seconds``: latency of the operator's fit computations;
- ``numalign_node_free{node,zone,resource}`` / ``numalign_node_allocatable{...}``: per
  NUMA zone, from NodeTopology status.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import start_http_server as _start

from numalign.topology.quantity import parse_quantity

ADMITTED = Gauge("numalign_pods_admitted", "Pods admitted, from NodeTopology status",
                 ["node", "policy", "source"])
REJECTED = Gauge("numalign_pods_rejected", "Pods rejected with TopologyAffinityError, "
                 "from NodeTopology status", ["node"])
REJECTIONS = Counter("numalign_rejections_observed", "TopologyAffinityError pods seen by the "
                     "operator", ["node"])
REDEPLOYS = Counter("numalign_redeploys", "Redeploys of rejected pods by outcome", ["outcome"])
FIT_LATENCY = Histogram("numalign_fit_check_seconds", "Time the operator spends computing "
                        "which nodes can fit a pod",
                        buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0))
FREE = Gauge("numalign_node_free", "Available resource per node and NUMA zone",
             ["node", "zone", "resource"])
ALLOCATABLE = Gauge("numalign_node_allocatable", "Allocatable resource per node and NUMA zone",
                    ["node", "zone", "resource"])


def start_http_server(port: int, addr: str = "0.0.0.0",
                      registry: CollectorRegistry = REGISTRY) -> None:
    _start(port, addr=addr, registry=registry)


def _num(v: Any) -> float | None:
    try:
        return float(parse_quantity(v))
    except (ValueError, ArithmeticError, TypeError):
        return None


def refresh_from_node_topologies(items: Iterable[Mapping[str, Any]]) -> None:
    """Replace the per-node gauges with what the NodeTopology statuses say now."""
    for g in (ADMITTED, REJECTED, FREE, ALLOCATABLE):
        g.clear()
    for nt in items:
        node = str((nt.get("metadata") or {}).get("name", ""))
        status = nt.get("status") or {}
        if not isinstance(status, Mapping):
            continue
        counts: dict[tuple[str, str], int] = {}
        for a in status.get("admitted") or []:
            if isinstance(a, Mapping):
                k = (str(a.get("policy", "none")), str(a.get("source", "none")))
                counts[k] = counts.get(k, 0) + 1
        for (policy, source), n in counts.items():
            ADMITTED.labels(node=node, policy=policy, source=source).set(n)
        rej = status.get("rejected")
        if isinstance(rej, int):
            REJECTED.labels(node=node).set(rej)
        for z in status.get("zones") or []:
            if not isinstance(z, Mapping):
                continue
            zone = str(z.get("id"))
            for gauge, key in ((FREE, "available"), (ALLOCATABLE, "allocatable")):
                for res, q in (z.get(key) or {}).items():
                    v = _num(q)
                    if v is not None:
                        gauge.labels(node=node, zone=zone, resource=str(res)).set(v)
