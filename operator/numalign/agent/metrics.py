"""The agent's Prometheus metrics: the kubelet's Topology, CPU and memory manager metrics for
the nodes numalign decides (emulated and numalign-managed nodes), named as the kubelet names
them with ``numalign_`` for ``kubelet_``, with ``node`` and ``policy`` labels added.

Counters (``agent/managerstats.py`` says when each counts), per node and Topology Manager
policy (the policy a pod was admitted under: numalign resolves one per pod):

- ``numalign_topology_manager_admission_requests_total`` / ``..._errors_total``;
- ``numalign_topology_manager_admission_duration_seconds``: a histogram, the kubelet's
  ``topology_manager_admission_duration_ms`` buckets in seconds;
- ``numalign_container_aligned_compute_resources_count`` /
  ``..._failure_count{scope,boundary}`` (boundary ``numa_node``);
- ``numalign_cpu_manager_pinning_requests_total`` / ``..._errors_total``;
- ``numalign_memory_manager_pinning_requests_total`` / ``..._errors_total``.

Gauges, read from the node's allocations at each scrape:

- ``numalign_agent_node_info{node,mode}``: 1 for every node this agent publishes (mode
  ``emulated``, ``nri`` or ``kubelet``), kubelet-managed ones included: an alert compares
  it with the nodes the operator sees; ``numalign_agent_node_ready{node}``: its Ready
  condition (0 while the agent cannot read the kubelet's allocations);

- ``numalign_cpu_manager_exclusive_cpu_allocation_count{node,policy}``: CPUs held
  exclusively by pods admitted under ``policy``;
- ``numalign_cpu_manager_allocation_per_numa{node,policy,numa_node}``: the same per NUMA
  node (every NUMA node, zeros included);
- ``numalign_cpu_manager_shared_pool_size_millicores{node}``: CPUs no container holds
  exclusively, less reserved ones, in millicores.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from numalign.topology.policyconfig import POLICY_NONE

from .managerstats import BOUNDARY_NUMA_NODE, DURATION_BUCKETS, SCOPES, ManagerCounts
from .state import NodeState

PREFIX = "numalign_"
NODE, POLICY = "node", "policy"


def exported(state: NodeState) -> bool:
    """A node numalign decides pods for (emulated, or numalign-managed through NRI); on a
    kubelet-managed node the kubelet exports these metrics itself."""
    return state.admits or state.placement is not None


def mode(state: NodeState) -> str:
    if state.admits:
        return "emulated"
    return "nri" if state.placement is not None else "kubelet"


def _policies(state: NodeState) -> dict[str, ManagerCounts]:
    """The node's counters per policy, the node default's present from the start (as the
    kubelet sets its series to zero when its managers start)."""
    out = dict(state.counts)
    out.setdefault(state.default.policy or POLICY_NONE, ManagerCounts())
    return out


# The per-node, per-policy counters: (name after the prefix, help, ManagerCounts field).
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("topology_manager_admission_requests", "Pod admissions the Topology Manager served",
     "admission_requests"),
    ("topology_manager_admission_errors", "Pod admissions the Topology Manager failed "
     "(hint refused or a manager could not allocate)", "admission_errors"),
    ("cpu_manager_pinning_requests", "Containers the CPU manager was asked to pin",
     "cpu_pinning_requests"),
    ("cpu_manager_pinning_errors", "Containers the CPU manager failed to pin",
     "cpu_pinning_errors"),
    ("memory_manager_pinning_requests", "Containers the memory manager was asked to pin",
     "memory_pinning_requests"),
    ("memory_manager_pinning_errors", "Containers the memory manager failed to pin",
     "memory_pinning_errors"),
)
# The aligned-allocation counters, per scope: (name after the prefix, help, field).
ALIGNED: tuple[tuple[str, str, str], ...] = (
    ("container_aligned_compute_resources_count",
     "Allocations granted aligned resources, per alignment boundary", "aligned"),
    ("container_aligned_compute_resources_failure_count",
     "Allocations that failed to align resources, per alignment boundary",
     "aligned_failures"),
)


class ManagerCollector(Collector):
    """The metrics above for the states ``states()`` returns at each scrape."""

    def __init__(self, states: Callable[[], Iterable[NodeState]]) -> None:
        self.states = states

    def collect(self) -> Iterator[Metric]:
        np = [NODE, POLICY]
        counters = [(CounterMetricFamily(PREFIX + name, doc, labels=np), attr)
                    for name, doc, attr in COUNTERS]
        # named exactly as the kubelet names them (no _total): exposed untyped, as
        # Prometheus text has no counter without that suffix
        aligned = [(Metric(PREFIX + name, doc + " (a counter)", "unknown"), attr)
                   for name, doc, attr in ALIGNED]
        duration = HistogramMetricFamily(
            PREFIX + "topology_manager_admission_duration_seconds",
            "Seconds to serve a pod admission (the kubelet's "
            "topology_manager_admission_duration_ms, in seconds)", labels=np)
        exclusive = GaugeMetricFamily(PREFIX + "cpu_manager_exclusive_cpu_allocation_count",
                                      "CPUs allocated exclusively to containers", labels=np)
        per_numa = GaugeMetricFamily(PREFIX + "cpu_manager_allocation_per_numa",
                                     "CPUs allocated exclusively, per NUMA node",
                                     labels=[*np, "numa_node"])
        shared = GaugeMetricFamily(PREFIX + "cpu_manager_shared_pool_size_millicores",
                                   "Size of the shared CPU pool, in millicores",
                                   labels=[NODE])
        info = GaugeMetricFamily(PREFIX + "agent_node_info",
                                 "Nodes this agent publishes (1), by who admits their pods",
                                 labels=[NODE, "mode"])
        ready = GaugeMetricFamily(PREFIX + "agent_node_ready",
                                  "Whether the node's agent reports it Ready (1) or not (0)",
                                  labels=[NODE])
        for st in self.states():
            info.add_metric([st.name, mode(st)], 1)
            ready.add_metric([st.name], 1 if st.ready else 0)
            if not exported(st):
                continue
            policies = _policies(st)
            for policy, c in sorted(policies.items()):
                lv = [st.name, policy]
                for fam, attr in counters:
                    fam.add_metric(lv, getattr(c, attr))
                for m, attr in aligned:
                    for scope in SCOPES:
                        m.add_sample(m.name, {NODE: st.name, POLICY: policy, "scope": scope,
                                              "boundary": BOUNDARY_NUMA_NODE},
                                     getattr(c, attr)[scope])
                cumulative, acc = [], 0
                for le, n in zip((*DURATION_BUCKETS, float("inf")), c.duration_buckets,
                                 strict=True):
                    acc += n
                    cumulative.append((_le(le), float(acc)))
                duration.add_metric(lv, cumulative, c.duration_sum)
            held = exclusive_cpus(st)
            for policy in sorted(set(policies) | set(held)):
                per = held.get(policy, {})
                exclusive.add_metric([st.name, policy], sum(per.values()))
                for numa in st.machine.numa_ids:
                    per_numa.add_metric([st.name, policy, str(numa)], per.get(numa, 0))
            shared.add_metric([st.name], len(st.ledger.free_cpus()) * 1000)
        yield from (info, ready)
        yield from (fam for fam, _ in counters)
        yield from (m for m, _ in aligned)
        yield from (duration, exclusive, per_numa, shared)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def exclusive_cpus(state: NodeState) -> dict[str, dict[int, int]]:
    """CPUs held exclusively by admitted pods, per policy of the holding pod and NUMA node
    (not CPUs the ledger holds for no pod, e.g. the kubelet's reserved ones)."""
    out: dict[str, dict[int, int]] = {}
    cpus = state.machine.cpus
    for cpu, (uid, _container) in state.ledger.cpu_owner.items():
        held = state.admitted.get(uid)
        if held is None:
            continue
        policy = held.resolved.policy or POLICY_NONE
        per = out.setdefault(policy, {})
        numa = cpus[cpu].numa
        per[numa] = per.get(numa, 0) + 1
    return out


def register(states: Callable[[], Iterable[NodeState]],
             registry: CollectorRegistry = REGISTRY) -> ManagerCollector:
    collector = ManagerCollector(states)
    registry.register(collector)
    return collector


def serve(port: int, addr: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> None:
    """``/metrics`` on ``addr:port`` (a thread of this process)."""
    start_http_server(port, addr=addr, registry=registry)
