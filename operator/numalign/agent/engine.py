"""The agent's one seam to the alignment engine (``numalign.topology``): admit a pod on a
node's ledger, release it, and put a known allocation back after a restart."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from numalign.api.admission import INVALID_GPU_REASON, InvalidGpuRequest, admit_resolved
from numalign.api.allocation import Allocation, ContainerRecord
from numalign.api.names import REJECT_REASON, REJECTED_PREFIX, TOPOLOGY_MESSAGE
from numalign.api.nodestatus import ledger_container, wire_container
from numalign.api.resolved import Resolved
from numalign.topology.admit import AdmitResult, ProviderKind
from numalign.topology.errors import TopologyError
from numalign.topology.hints import mask_ids
from numalign.topology.ledger import Ledger, LedgerError
from numalign.topology.machine import Machine
from numalign.topology.managers.dra import NAME as DRA
from numalign.topology.pod import Pod, pod_from_dict
from numalign.topology.resourcefit import fit_requests


class RestoreConflict(Exception):
    """A published allocation that the ledger cannot take (it would double-allocate)."""


@dataclass
class EngineResult:
    admit: bool
    reason: str | None = None
    message: str | None = None
    allocation: Allocation | None = None
    # what the managers did (for their metrics): the pod as read and the engine's result;
    # None when the pod was refused before the Topology Manager saw it
    pod: Pod | None = None
    outcome: AdmitResult | None = None


def new_ledger(machine: Machine) -> Ledger:
    return Ledger(machine)


def admit(machine: Machine, ledger: Ledger, pod: Mapping[str, Any], resolved: Resolved,
          uid: str, devices: Sequence[ProviderKind] = ()) -> EngineResult:
    """Admit ``pod`` with ``resolved``; on success the ledger holds its allocation.
    ``devices``: providers of device resources someone else already assigned (a real
    node's device manager), besides the registry's."""
    model = pod_from_dict(pod)
    try:
        result = admit_resolved(machine, ledger, model, resolved, devices=devices)
    except InvalidGpuRequest as e:
        return EngineResult(False, reason=INVALID_GPU_REASON,
                            message=f"{REJECTED_PREFIX}{e}", pod=model)
    if not result.admit:
        return EngineResult(False, reason=result.reason or REJECT_REASON,
                            message=result.message or TOPOLOGY_MESSAGE, pod=model,
                            outcome=result)
    return EngineResult(True, allocation=_allocation_of(ledger, uid, result), pod=model,
                        outcome=result)


def _allocation_of(ledger: Ledger, uid: str, result: AdmitResult) -> Allocation:
    """The pod's allocation as the ledger now holds it (after CPU/device reuse between
    init and app containers), with each container's NUMA affinity from the decision."""
    rec = ledger.pods.get(uid)
    numa_of = {name: list(c.numa_nodes) for name, c in result.containers.items()}
    containers: dict[str, ContainerRecord] = {}
    if rec is not None:
        for name, held in rec.containers.items():
            containers[name] = wire_container(held, numa_of.get(name))
    if result.hint.mask is not None:
        pod_numa = mask_ids(result.hint.mask)
    else:
        pod_numa = sorted({n for v in numa_of.values() for n in v})
    dra: dict[str, dict[str, list[str]]] = result.reports.get(DRA) or {}
    for name, per in dra.items():
        if name in containers:
            containers[name].dra_devices = {k: list(v) for k, v in per.items()}
    gpus = {str(k): [str(i) for i in v] for k, v in result.gpus.items()}
    return Allocation(numa_nodes=pod_numa, containers=containers, gpus=gpus)


def commit(machine: Machine, ledger: Ledger, uid: str, pod: Mapping[str, Any],
           alloc: Allocation) -> None:
    """Put a known allocation back in the ledger (after a restart)."""
    spec = pod.get("spec") or {}
    plain_init = {str(c.get("name")) for c in spec.get("initContainers") or []
                  if c.get("restartPolicy") != "Always"}
    meta = pod.get("metadata") or {}
    items = [(name, ledger_container(a, name in plain_init))
             for name, a in alloc.containers.items()]
    try:
        requests = fit_requests(pod_from_dict(pod))
    except TopologyError:  # admitted before: what it asks is counted as far as readable
        requests = {}
    try:
        ledger.allocate_many(uid, items, pod_name=str(meta.get("name") or uid),
                             namespace=str(meta.get("namespace") or "default"),
                             requests=requests)
    except LedgerError as e:
        raise RestoreConflict(str(e)) from None


def release(ledger: Ledger, uid: str) -> None:
    ledger.release(uid)
