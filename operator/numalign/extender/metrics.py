"""The extender's Prometheus metrics (on its own registry, served at ``/metrics``):

- ``numalign_extender_filter_duration_seconds``: filter latency (histogram);
- ``numalign_extender_prioritize_duration_seconds``: prioritize latency (histogram);
- ``numalign_extender_decide_duration_seconds{verb}``: of a filter or prioritize call,
  the decision alone (the rest of the call: reading the body, finding the pod, waiting
  for the event loop);
- ``numalign_extender_decide_cpu_seconds{verb}``: the same decision's CPU time (its
  thread's): where it is well below the decision's duration, the process waited for a
  core (other processes on the node);
- ``numalign_extender_pod_reads``: pods a call named that the pod watch had not shown
  yet, read from the API server since the start (gauge, rising);
- ``numalign_extender_bind_duration_seconds``: bind latency, the API call included
  (histogram);
- ``numalign_extender_binds_total{outcome}``: bind calls: ``bound``, ``not-approved``
  (a pod this process did not approve for that node: left to the scheduler's binder),
  ``error`` (the API server refused or did not answer);
- ``numalign_extender_bind_turns_missed_total``: bindings posted without waiting for
  the one before them on their node, or for the pods approved there before them (not
  landed, or still in flight, within a second): the node may see them in another order
  than they were counted (:mod:`.bindorder`);
- ``numalign_extender_refusals_total{reason}``: nodes refused, by the kubelet's reason;
- ``numalign_extender_reservations``: in-flight reservations held now (gauge);
- ``numalign_extender_pending_pods``: unbound pods of the schedulers served, as watched
  (gauge);
- ``numalign_extender_requests_refused_total{verb,why}``: requests answered without a
  decision: ``400`` malformed, ``408`` too slow, ``413`` too large, ``not-pending`` (the
  pod named is not an unbound pod of our schedulers in the API server).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025,
           0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5)
CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.filter_seconds = Histogram(
            "numalign_extender_filter_duration_seconds",
            "Time the extender takes to answer a filter call", buckets=BUCKETS,
            registry=self.registry)
        self.prioritize_seconds = Histogram(
            "numalign_extender_prioritize_duration_seconds",
            "Time the extender takes to answer a prioritize call", buckets=BUCKETS,
            registry=self.registry)
        self.decide_seconds = Histogram(
            "numalign_extender_decide_duration_seconds",
            "Of a filter or prioritize call, the time the decision alone takes", ["verb"],
            buckets=BUCKETS, registry=self.registry)
        self.decide_cpu_seconds = Histogram(
            "numalign_extender_decide_cpu_seconds",
            "Of a filter or prioritize call, the CPU time the decision alone takes", ["verb"],
            buckets=BUCKETS, registry=self.registry)
        self.pod_reads = Gauge(
            "numalign_extender_pod_reads", "Pods a call named that the pod watch had not "
            "shown yet, read from the API server since the start", registry=self.registry)
        self.bind_seconds = Histogram(
            "numalign_extender_bind_duration_seconds",
            "Time the extender takes to answer a bind call (the binding created)",
            buckets=BUCKETS, registry=self.registry)
        self.binds = Counter(
            "numalign_extender_binds", "Bind calls, by outcome (bound, not-approved, error)",
            ["outcome"], registry=self.registry)
        self.bind_turns_missed = Counter(
            "numalign_extender_bind_turns_missed", "Bindings posted without waiting for the "
            "one before them on their node, or for the pods approved there before them (not "
            "landed, or still in flight, within a second)",
            registry=self.registry)
        self.refusals = Counter(
            "numalign_extender_refusals", "Nodes the extender refused for a pod, by the "
            "kubelet's reason", ["reason"], registry=self.registry)
        self.reservations = Gauge(
            "numalign_extender_reservations", "In-flight reservations: pods bound whose "
            "node has not published them yet", registry=self.registry)

        self.pending = Gauge(
            "numalign_extender_pending_pods", "Unbound pods of the schedulers served, as "
            "watched", registry=self.registry)
        self.requests_refused = Counter(
            "numalign_extender_requests_refused", "Requests answered without a decision, "
            "by verb and why (400, 408, 413, not-pending)", ["verb", "why"],
            registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
