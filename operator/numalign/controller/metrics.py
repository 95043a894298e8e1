"""Prometheus metrics on ``/metrics``.

- ``numalign_pods_admitted{node,policy}`` / ``numalign_pods_rejected{node}``: from the
  NodeTopology statuses (admitted list and rejected count), refreshed by a timer;
- ``numalign_rejections_observed_total{node}``: TopologyAffinityError pods the operator saw;
- ``numalign_redeploys_total{outcome}``: deleted | recreated | gave_up;
- ``numalign_fit_check_seconds``: latency of the operator's fit computations;
- ``numalign_node_free{node,zone,resource}`` / ``numalign_node_allocatable{...}``: per
  NUMA zone, from NodeTopology status.

The per-node families are computed at each scrape from the NodeTopologies the last
refresh was given (:class:`NodeTopologyCollector`): a gauge child per node, zone and
resource held between scrapes cost ~19 KiB a node.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client import start_http_server as _start
from prometheus_client.core import GaugeMetricFamily, Metric

from numalign.topology.quantity import parse_quantity

REJECTIONS = Counter("numalign_rejections_observed", "TopologyAffinityError pods seen by the "
                     "operator", ["node"])
REDEPLOYS = Counter("numalign_redeploys", "Redeploys of rejected pods by outcome", ["outcome"])
FIT_LATENCY = Histogram("numalign_fit_check_seconds", "Time the operator spends computing "
                        "which nodes can fit a pod",
                        buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0))
# name, help, label names: the families computed from NodeTopology status
ADMITTED = ("numalign_pods_admitted", "Pods admitted, from NodeTopology status",
            ("node", "policy", "source"))
REJECTED = ("numalign_pods_rejected", "Pods rejected with TopologyAffinityError, "
            "from NodeTopology status", ("node",))
FREE = ("numalign_node_free", "Available resource per node and NUMA zone",
        ("node", "zone", "resource"))
ALLOCATABLE = ("numalign_node_allocatable", "Allocatable resource per node and NUMA zone",
               ("node", "zone", "resource"))
FAMILIES = (ADMITTED, REJECTED, FREE, ALLOCATABLE)


def start_http_server(port: int, addr: str = "0.0.0.0",
                      registry: CollectorRegistry = REGISTRY) -> None:
    _start(port, addr=addr, registry=registry)


def _num(v: Any) -> float | None:
    try:
        return float(parse_quantity(v))
    except (ValueError, ArithmeticError, TypeError):
        return None


def node_samples(items: Iterable[Mapping[str, Any]]
                 ) -> dict[str, dict[tuple[str, ...], float]]:
    """Each per-node family's samples (label values -> value; a label set given twice
    keeps its first place and its last value) from the NodeTopologies ``items``."""
    out: dict[str, dict[tuple[str, ...], float]] = {f[0]: {} for f in FAMILIES}
    admitted, rejected = out[ADMITTED[0]], out[REJECTED[0]]
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
            admitted[(node, policy, source)] = float(n)
        rej = status.get("rejected")
        if isinstance(rej, int):
            rejected[(node,)] = float(rej)
        for z in status.get("zones") or []:
            if not isinstance(z, Mapping):
                continue
            zone = str(z.get("id"))
            for family, key in ((FREE, "available"), (ALLOCATABLE, "allocatable")):
                for res, q in (z.get(key) or {}).items():
                    v = _num(q)
                    if v is not None:
                        out[family[0]][(node, zone, str(res))] = v
    return out


class NodeTopologyCollector:
    """The per-node families, computed at each scrape (on the metrics server's thread)
    from the NodeTopologies last given to :meth:`refresh` (the operator's cached copies,
    which are replaced, never changed in place)."""

    def __init__(self) -> None:
        self._items: Sequence[Mapping[str, Any]] = ()

    def refresh(self, items: Iterable[Mapping[str, Any]]) -> None:
        self._items = list(items)

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily(name, doc, labels=labels) for name, doc, labels in FAMILIES]

    def collect(self) -> Iterator[Metric]:
        samples = node_samples(self._items)
        for name, doc, labels in FAMILIES:
            fam = GaugeMetricFamily(name, doc, labels=labels)
            for values, v in samples[name].items():
                fam.add_metric(list(values), v)
            yield fam


NODES = NodeTopologyCollector()
REGISTRY.register(NODES)


def refresh_from_node_topologies(items: Iterable[Mapping[str, Any]]) -> None:
    """Replace the per-node families with what the NodeTopology statuses say now."""
    NODES.refresh(items)
