"""What the filter's fast verdict (:mod:`.feasible`) reads of a node and of a pod: a
node's free amounts per NUMA node (:class:`NodeFree`, made once per state of its
ledger) and a simple pod's request (:class:`PodAsk`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from numalign.api.names import ANN_GPUS
from numalign.topology.demands import GroupRule, guaranteed_cpus
from numalign.topology.ledger import MEMORY, Ledger
from numalign.topology.pod import HUGEPAGES_PREFIX, QOS_GUARANTEED, Pod
from numalign.topology.resourcefit import CPU, fit_requests

__all__ = ["NodeFree", "PodAsk", "node_free", "pod_ask"]


@dataclass(frozen=True)
class NodeFree:
    """What one node's ledger has free, per NUMA node of its machine (in
    ``machine.numa_ids`` order): CPUs, bytes of each memory kind, devices of each
    resource (those without a NUMA node apart); its memory grouping rule; the pods it
    holds and their requests summed (the resource fit's view)."""

    numa_ids: tuple[int, ...]
    cpus: tuple[int, ...]
    memory: Mapping[str, tuple[int, ...]]
    devices: Mapping[str, tuple[tuple[int, ...], int]]
    rule: GroupRule
    pods: int
    used: Mapping[str, int]


def node_free(ledger: Ledger) -> NodeFree:
    """:class:`NodeFree` of ``ledger``, made once per state of the ledger."""
    return ledger.derived("extender-node-free", lambda: _node_free(ledger))


def _node_free(ledger: Ledger) -> NodeFree:
    machine = ledger.machine
    ids = machine.numa_ids
    at = {n: i for i, n in enumerate(ids)}
    cpus = [0] * len(ids)
    for c in ledger.free_cpus():
        cpus[at[machine.cpus[c].numa]] += 1
    kinds = [MEMORY, *(HUGEPAGES_PREFIX + s for s in machine.hugepage_sizes)]
    memory = {k: tuple(ledger.free_memory(n, k) for n in ids) for k in kinds}
    devices: dict[str, tuple[tuple[int, ...], int]] = {}
    for res in machine.device_resources:
        per = [0] * len(ids)
        loose = 0
        for d in machine.devices_of(res):
            if (res, d.id) in ledger.device_owner:
                continue
            if d.numa_node is None or d.numa_node not in at:
                loose += 1
            else:
                per[at[d.numa_node]] += 1
        devices[res] = (tuple(per), loose)
    pods, used = ledger.requested()
    return NodeFree(tuple(ids), tuple(cpus), memory, devices, GroupRule.of(ledger), pods,
                    used)


@dataclass(frozen=True)
class PodAsk:
    """What a simple pod asks, as the caps of :func:`group_key`: whole CPUs, bytes per
    memory kind, devices per resource (all containers summed), and its resource-fit
    requests. ``simple`` False: the pod takes the full decision."""

    simple: bool
    single: bool = False  # one container: one decision under either scope
    cpus: int = 0
    memory: tuple[tuple[str, int], ...] = ()
    devices: tuple[tuple[str, int], ...] = ()
    fit: tuple[tuple[str, int], ...] = ()


def pod_ask(model: Pod | None) -> PodAsk:
    """The caps of ``model`` (exclusive CPUs and NUMA-bound memory only for a
    Guaranteed pod, as the CPU and memory managers give them)."""
    if model is None or model.init_containers or ANN_GPUS in model.annotations:
        return PodAsk(False)
    want = model.effective_requests()
    guaranteed = model.qos == QOS_GUARANTEED
    cpus = sum(guaranteed_cpus(model, c) for c in model.containers)
    memory = tuple((k, math.ceil(q)) for k, q in sorted(want.items())
                   if guaranteed and (k == MEMORY or k.startswith(HUGEPAGES_PREFIX)))
    devices = tuple((k, math.ceil(q)) for k, q in sorted(want.items())
                    if k not in (CPU, MEMORY) and not k.startswith(HUGEPAGES_PREFIX))
    return PodAsk(True, len(model.containers) == 1, cpus, memory, devices,
                  tuple(sorted(fit_requests(model).items())))
