"""What the filter's fast verdict (:mod:`.feasible`) reads of a node and of a pod: a
node's free amounts per NUMA node (:class:`NodeFree`, made once per state of its
ledger) and a simple pod's request (:class:`PodAsk`)."""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field

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
    holds and their requests summed (the resource fit's view).

    Read by every filter: the NUMA nodes (bit ``i``: the ``i``-th of ``numa_ids``)
    holding at least so much of each are kept too, see :meth:`cpus_at_least`,
    :meth:`memory_at_least`, :meth:`devices_at_least`; ``alone``: those the grouping
    rule lets hold memory alone."""

    numa_ids: tuple[int, ...]
    cpus: tuple[int, ...]
    memory: Mapping[str, tuple[int, ...]]
    devices: Mapping[str, tuple[tuple[int, ...], int]]
    rule: GroupRule
    pods: int
    used: Mapping[str, int]
    alone: int = 0
    overcommitted: frozenset[str] = frozenset()  # memory kinds used past a NUMA node's
    device_totals: Mapping[str, int] = field(default_factory=dict)  # free, per resource
    _cpus_ge: tuple[int, ...] = ()  # [t]: NUMA nodes with t CPUs free or more
    _devices_ge: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # per memory kind: the amounts sorted, and [i]: NUMA nodes holding the i-th or more
    _memory_ge: Mapping[str, tuple[tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=dict)

    def cpus_at_least(self, count: int) -> int:
        ge = self._cpus_ge
        return ge[count] if count < len(ge) else 0

    def devices_at_least(self, resource: str, count: int) -> int:
        ge = self._devices_ge[resource]
        return ge[count] if count < len(ge) else 0

    def memory_at_least(self, kind: str, size: int) -> int:
        amounts, masks = self._memory_ge[kind]
        return masks[bisect_left(amounts, size)]

    def holding(self, among: int, cpus: int, memory: tuple[tuple[str, int], ...],
                devices: tuple[tuple[str, int], ...]) -> int:
        """The NUMA nodes of ``among`` each holding ``cpus`` CPUs, and the bytes of each
        memory kind (where the grouping rule lets them hold memory alone) and the
        devices of each resource asked: :meth:`cpus_at_least` and the others, at once
        (a filter asks it of every node)."""
        found = among
        if cpus:
            ge = self._cpus_ge
            found &= ge[cpus] if cpus < len(ge) else 0
        if found and memory:
            found &= self.alone
            kept = self._memory_ge
            for kind, size in memory:
                amounts, masks = kept[kind]
                found &= masks[bisect_left(amounts, size)]
        if found and devices:
            kept_devices = self._devices_ge
            for res, count in devices:
                ge = kept_devices[res]
                found &= ge[count] if count < len(ge) else 0
        return found


def _at_least(values: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sum(1 << i for i, v in enumerate(values) if v >= t)
                 for t in range(max(values, default=0) + 1))


def _sorted_masks(values: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    masks = [0] * (len(order) + 1)
    for j in range(len(order) - 1, -1, -1):
        masks[j] = masks[j + 1] | 1 << order[j]
    return tuple(values[i] for i in order), tuple(masks)


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
    rule = GroupRule.of(ledger)
    return NodeFree(tuple(ids), tuple(cpus), memory, devices, rule, pods, used,
                    sum(1 << i for i, n in enumerate(ids) if rule.valid(1 << n)),
                    frozenset(k for k, v in memory.items() if min(v, default=0) < 0),
                    {r: sum(per) + loose for r, (per, loose) in devices.items()},
                    _at_least(tuple(cpus)),
                    {r: _at_least(per) for r, (per, _) in devices.items()},
                    {k: _sorted_masks(v) for k, v in memory.items()})


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
