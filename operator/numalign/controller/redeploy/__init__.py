"""Redeploy of pods rejected with ``TopologyAffinityError``; the rules (attempt budget,
backoff, scheduling gate, node avoidance, release, durable decisions) are written down
once, in the README (section "TopologyPolicy"). :mod:`.record` is the pure logic,
:mod:`.store` the ConfigMap records, :mod:`.rejected` one rejected pod's decision,
:mod:`.gating` the held pods, :mod:`.handlers` the Kopf handlers."""

from numalign.api.names import (
    ANN_REDEPLOY_BASE,
    ANN_REDEPLOY_OF,
    ANN_REDEPLOY_RESET,
    ANN_WORKLOAD,
    REDEPLOY_GATE,
)

from . import handlers
from .gating import (
    Workload,
    backoff_message,
    gate_message,
    periodic_release,
    release_budgets,
    release_held,
    ungate,
    workload_of,
)
from .handlers import stop_workers
from .record import (
    AVOID_FOR_S,
    RESET_AFTER_S,
    WorkloadState,
    backoff_delay,
    base_name,
    build_replacement,
    controller_ref,
    has_gate,
    is_topology_rejected,
    replacement_name,
    with_node_avoidance,
    workload_key,
)
from .rejected import step

__all__ = [
    "ANN_REDEPLOY_BASE", "ANN_REDEPLOY_OF", "ANN_REDEPLOY_RESET", "ANN_WORKLOAD", "AVOID_FOR_S",
    "REDEPLOY_GATE",
    "RESET_AFTER_S", "Workload", "WorkloadState", "backoff_delay", "backoff_message",
    "base_name", "build_replacement", "controller_ref", "gate_message", "handlers",
    "has_gate", "is_topology_rejected", "periodic_release", "release_budgets",
    "release_held", "replacement_name", "step", "stop_workers", "ungate",
    "with_node_avoidance", "workload_key", "workload_of",
]
