"""The extender's prioritize score: 0-10 for a pod a node admits, by alignment quality
(fewest NUMA nodes, then their distance, GPU island fit, the room left whole)."""

from __future__ import annotations

from itertools import combinations

from numalign.topology.admit import AdmitResult
from numalign.topology.hints import mask_ids
from numalign.topology.ledger import Ledger
from numalign.topology.machine import Machine

MIN_SCORE = 0
MAX_SCORE = 10  # k8s.io/kube-scheduler/extender/v1 MaxExtenderPriority
NEUTRAL_SCORE = 5  # no opinion: the pod asks for no alignment, or the node is not covered
# The score's parts (each 0..1), in the order they rank: fewest NUMA nodes, then their
# distance, then GPU island fit, then the room left whole.
SCORE_WEIGHTS = {"numa": 0.55, "distance": 0.2, "gpu": 0.15, "room": 0.1}


def pod_numa(result: AdmitResult) -> list[int]:
    """The NUMA nodes an admitted pod gets (its hint, else its containers')."""
    if result.hint.mask is not None:
        return mask_ids(result.hint.mask)
    return sorted({n for c in result.containers.values() for n in c.numa_nodes})


def score_admission(machine: Machine, ledger: Ledger, result: AdmitResult) -> int:
    """0-10 for an admitted pod: a weighted sum (:data:`SCORE_WEIGHTS`) of

    - ``numa``: 1 on one NUMA node, 0 across all of them;
    - ``distance``: 1 when the NUMA nodes are all local to each other, 0 at the
      machine's largest distance (mean over pairs);
    - ``gpu``: for each device resource with two or more devices, the share of the
      machine's group levels (outermost first) all of them share: 1 in one island;
    - ``room``: the free exclusive CPUs left on the emptiest NUMA node, over the
      largest NUMA node's CPUs (the room left whole for the next aligned pod).

    A pod with no NUMA affinity (policy none, nothing to align) gets
    :data:`NEUTRAL_SCORE` on every node: the extender has no opinion about it."""
    if result.hint.mask is None:
        return NEUTRAL_SCORE
    numa = pod_numa(result)
    total = len(machine.numa_nodes)
    parts = {
        "numa": 1.0 if len(numa) <= 1 or total <= 1 else (total - len(numa)) / (total - 1),
        "distance": _distance_part(machine, numa),
        "gpu": _gpu_part(machine, result),
        "room": _room_part(machine, ledger, result),
    }
    value = sum(SCORE_WEIGHTS[k] * v for k, v in parts.items())
    return max(MIN_SCORE, min(MAX_SCORE, round(MAX_SCORE * value)))


def _distance_part(machine: Machine, numa: list[int]) -> float:
    d = machine.distances
    if len(numa) <= 1 or not d:
        return 1.0
    values = [v for row in d.values() for v in row.values()]
    local, far = min(values), max(values)
    if far <= local:
        return 1.0
    pairs = [d[a][b] for a, b in combinations(numa, 2) if a in d and b in d[a]]
    if not pairs:
        return 1.0
    mean = sum(pairs) / len(pairs)
    return max(0.0, 1.0 - (mean - local) / (far - local))


def _gpu_part(machine: Machine, result: AdmitResult) -> float:
    by_id = {(d.resource, d.id): d for d in machine.devices}
    taken: dict[str, set[str]] = {}
    for c in result.containers.values():
        for r, ids in c.allocation.devices.items():
            taken.setdefault(r, set()).update(ids)
    parts: list[float] = []
    for r, got in taken.items():
        devs = [by_id[(r, i)] for i in sorted(got) if (r, i) in by_id]
        levels = [lvl for lvl, _ in devs[0].groups] if devs else []
        if len(devs) < 2 or not levels:
            continue
        shared = 0
        for lvl in levels:
            if len({d.group(lvl) for d in devs}) != 1:
                break
            shared += 1
        parts.append(shared / len(levels))
    return sum(parts) / len(parts) if parts else 1.0


def _room_part(machine: Machine, ledger: Ledger, result: AdmitResult) -> float:
    taken = {c for r in result.containers.values() for c in r.allocation.cpus}
    free = ledger.free_cpus() - taken
    biggest = max((len(n.cpus) for n in machine.numa_nodes), default=0)
    if biggest == 0:
        return 1.0
    return max(sum(1 for c in n.cpus if c in free) for n in machine.numa_nodes) / biggest
