"""What the kubelet's Topology, CPU and memory managers count, counted for the pods a node's
agent decides (pure: no I/O; ``agent/metrics.py`` exports it).

The kubelet (pkg/kubelet/metrics, v1.37) counts, per admission of a pod:

- ``topology_manager_admission_requests_total``: every admission;
- ``topology_manager_admission_errors_total``: an admission the Topology Manager fails:
  the merged hint does not admit a container (scope container) or the pod (scope pod),
  or a manager cannot allocate inside it (``UnexpectedAdmissionError``); a pod the later
  resource-fit check refuses (``OutOfcpu``) is not a Topology Manager error;
- ``container_aligned_compute_resources_count{scope,boundary="numa_node"}``: under
  ``single-numa-node`` only, each container admitted and allocated (scope container), or
  the pod once all its containers are (scope pod);
  ``container_aligned_compute_resources_failure_count`` the same for a refused hint;
- ``cpu_manager_pinning_requests_total``: each container the static CPU manager pins
  (Guaranteed pod, integer CPU request) when its allocation is attempted;
  ``..._errors_total`` those whose allocation fails;
- ``memory_manager_pinning_requests_total``: each container of a Guaranteed pod asking
  memory or hugepages when the static memory manager allocates it; ``..._errors_total``
  those it fails.

Managers allocate a container in the kubelet's order (devices, CPUs, memory), and only
up to the container whose hint or allocation fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from numalign.topology.admit import AdmitResult
from numalign.topology.demands import guaranteed_cpus, memory_request
from numalign.topology.pod import Container, Pod
from numalign.topology.policies import get_policy
from numalign.topology.policyconfig import SCOPE_CONTAINER, SCOPE_POD

BOUNDARY_NUMA_NODE = "numa_node"
SCOPES = (SCOPE_CONTAINER, SCOPE_POD)

# The kubelet's topology_manager_admission_duration_ms buckets (exponential from 0.05 ms,
# factor 2, 15 buckets), in seconds.
DURATION_BUCKETS: tuple[float, ...] = tuple(0.05 * 2 ** k / 1000 for k in range(15))


@dataclass
class ManagerCounts:
    """The managers' counters under one Topology Manager policy on one node."""

    admission_requests: int = 0
    admission_errors: int = 0
    aligned: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SCOPES, 0))
    aligned_failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SCOPES, 0))
    cpu_pinning_requests: int = 0
    cpu_pinning_errors: int = 0
    memory_pinning_requests: int = 0
    memory_pinning_errors: int = 0
    # admission duration: per-bucket (not cumulative) counts, the last for +Inf
    duration_buckets: list[int] = field(
        default_factory=lambda: [0] * (len(DURATION_BUCKETS) + 1))
    duration_sum: float = 0.0

    @property
    def duration_count(self) -> int:
        return sum(self.duration_buckets)

    def observe(self, seconds: float) -> None:
        i = next((k for k, le in enumerate(DURATION_BUCKETS) if seconds <= le),
                 len(DURATION_BUCKETS))
        self.duration_buckets[i] += 1
        self.duration_sum += seconds


@dataclass(frozen=True)
class Managers:
    """Which managers the node's agent stands for: the static CPU manager pins CPUs, the
    static memory manager pins memory (both on emulated and numalign-managed nodes)."""

    pins_cpus: bool = True
    pins_memory: bool = True


class _Counter:
    def __init__(self, counts: ManagerCounts, pod: Pod, managers: Managers) -> None:
        self.c, self.pod, self.managers = counts, pod, managers

    def allocate(self, container: Container, failed: str | None) -> None:
        """One container through the providers (devices, CPUs, memory) up to ``failed``."""
        if failed == "devices":
            return
        if self.managers.pins_cpus and guaranteed_cpus(self.pod, container):
            self.c.cpu_pinning_requests += 1
            if failed == "cpu":
                self.c.cpu_pinning_errors += 1
        if failed == "cpu":
            return
        if self.managers.pins_memory and memory_request(self.pod, container):
            self.c.memory_pinning_requests += 1
            if failed == "memory":
                self.c.memory_pinning_errors += 1


def record_admission(counts: ManagerCounts, pod: Pod | None, outcome: AdmitResult | None,
                     seconds: float, managers: Managers = Managers()) -> None:
    """Count one admission of ``pod`` that ended with ``outcome`` (None: the pod was
    refused before the Topology Manager allocated anything, e.g. an unreadable GPU
    request, or the engine could not read it: an admission error)."""
    counts.admission_requests += 1
    counts.observe(seconds)
    if pod is None or outcome is None:
        counts.admission_errors += 1
        return
    # the kubelet counts these under single-numa-node: here any policy whose hints that
    # win are one NUMA node wide (the outcome's policy is a registered one)
    aligned = get_policy(outcome.policy).single_numa
    failed_name, failed_manager = outcome.failed or (None, None)
    run = _Counter(counts, pod, managers)
    decisions = outcome.decisions
    pod_scope = outcome.scope == SCOPE_POD

    def refused(scope: str) -> None:
        if aligned:
            counts.aligned_failures[scope] += 1
        counts.admission_errors += 1

    if pod_scope and (not decisions or not decisions[0].admit):
        refused(SCOPE_POD)
        return
    for i, c in enumerate(pod.all_containers):
        if not pod_scope:  # one decision per container, in order
            if i >= len(decisions):
                return
            if not decisions[i].admit:
                refused(SCOPE_CONTAINER)
                return
        if c.name == failed_name:
            run.allocate(c, failed_manager)
            counts.admission_errors += 1
            return
        run.allocate(c, None)
        if aligned and not pod_scope:
            counts.aligned[SCOPE_CONTAINER] += 1
    if aligned and pod_scope:
        counts.aligned[SCOPE_POD] += 1
