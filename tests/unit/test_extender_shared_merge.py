"""A filter over many nodes shares the engine's work between them, and stays exact.

Nodes of one machine with as much free per NUMA node (counted up to what the pod asks)
share the hint lists and the merge of a decision (``numalign.topology.admit``, keyed by
``Demand.key``). For random fleets with many nodes per machine, some in the very same
state, others filled from a small pool of pods (alike free counts, other CPUs), every
verdict of the extender's filter (caches warm, shared across the nodes) must equal the
plain per-node decision made afresh (nothing shared: no merge or hint list kept from
another node): fits, reason, message, score, NUMA nodes and what the pod would hold.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_extender_differential import Node, bound_to, scheduler_fits

from numalign.extender.decide import CANDIDATE_UID, Decider, decide
from numalign.topology import admit as engine
from numalign.topology import demands
from numalign.topology.demands import Demand, full_hints
from random_fleet import FULL, fixture_machine, random_pod, random_spec, synthetic_machine


@pytest.fixture(autouse=True)
def _fresh_caches() -> Iterator[None]:
    engine._DECISIONS.clear()
    demands._hint_cache.clear()
    yield
    engine.SHARE_DEMAND_MERGES = True


def _afresh(pod: dict[str, object], decider: Decider, name: str) -> object:
    """The per-node decision with nothing shared from another node."""
    engine._DECISIONS.clear()
    demands._hint_cache.clear()
    engine.SHARE_DEMAND_MERGES = False
    try:
        return decide(pod, decider.view(name))
    finally:
        engine.SHARE_DEMAND_MERGES = True


def run_fleet(seed: int) -> int:
    """Filter random pods over a random fleet; returns how many verdicts were compared."""
    rng = random.Random(seed)
    nodes: list[Node] = []
    for m in range(rng.randint(1, 3)):
        machine = fixture_machine(rng) if rng.random() < 0.6 else synthetic_machine(rng, m)
        spec = random_spec(rng, m + 1, FULL)
        devices = sorted({d.resource for d in machine.devices})
        pool = [random_pod(rng, 1000 * m + i, devices, [], False) for i in range(6)]
        for i in range(rng.randint(4, 10)):
            node = Node(f"m{m}-n{i}", machine, spec)
            twin = nodes[-1] if i and rng.random() < 0.3 else None
            for k, pod in enumerate(rng.sample(pool, rng.randint(0, len(pool)))
                                    if twin is None else []):
                pod = {**pod, "metadata": {**pod["metadata"],  # type: ignore[dict-item]
                                           "uid": f"{node.name}-{k}"}}
                pod = bound_to(pod, node.name)
                if scheduler_fits(machine, pod, node.requests()):
                    node.bind(pod)
            if twin is not None:
                node.state = twin.state  # the very same state (published under its name)
            nodes.append(node)
    decider = Decider()
    for node in nodes:
        nt = node.published()
        nt["metadata"]["name"] = node.name
        decider.update(nt)
    devices = sorted({d.resource for n in nodes for d in n.machine.devices})
    levels = sorted({lvl for n in nodes for d in n.machine.devices for lvl, _ in d.groups})
    compared = 0
    for p in range(rng.randint(3, 8)):
        pod = random_pod(rng, 10_000 + p, devices, levels, False)
        names = [n.name for n in nodes]
        verdicts = decider.filter(pod, names)
        for name, got in zip(names, verdicts, strict=True):
            want = _afresh(pod, decider, name)
            assert got == want, f"seed {seed}, node {name}: shared {got}, afresh {want}"
            compared += 1
    return compared


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_shared_decisions_equal_the_per_node_decision(seed: int) -> None:
    run_fleet(seed)


def test_nodes_alike_share_the_merge() -> None:
    """Over fleets of many alike nodes, the filter runs fewer merges than the per-node
    decisions made afresh do (the sharing is there), with the same verdicts."""
    merges = {True: 0, False: 0}  # shared, afresh
    merge = engine._Run._merge

    def counting(self: engine._Run, asks: object) -> object:
        if self.pod.uid == CANDIDATE_UID:  # the filter's, not the nodes' own
            merges[engine.SHARE_DEMAND_MERGES] += 1
        return merge(self, asks)  # type: ignore[arg-type]

    engine._Run._merge = counting  # type: ignore[method-assign,assignment]
    try:
        engine.SHARE_DEMAND_MERGES = True
        compared = sum(run_fleet(seed) for seed in range(3))
    finally:
        engine._Run._merge = merge  # type: ignore[method-assign]
    assert compared and merges[True] < merges[False]


def test_a_capped_key_gives_the_hint_list_of_its_own_demand() -> None:
    """Demands whose free amounts differ only above the request share one kept hint list,
    and it is the one a walk of each gives (one kind, as CPUs, and several, as memory
    with hugepages)."""
    def demand(request: tuple[int, ...], free: dict[int, tuple[int, ...]],
               bonus: dict[int, tuple[int, ...]]) -> Demand:
        return Demand("memory", ("memory",), request, (0, 1, 2), free=free,
                      capacity={n: (8,) * len(request) for n in (0, 1, 2)}, bonus=bonus)

    rng = random.Random(5)
    for request in ((4,), (4, 2)):
        for _ in range(200):
            free = {n: tuple(rng.randint(0, 2 * r - 1) for r in request) for n in (0, 1, 2)}
            more = {n: tuple(x + rng.randint(0, 3) if x >= r else x
                             for x, r in zip(v, request, strict=True))
                    for n, v in free.items()}
            bonus = {0b011: (1,) * len(request)} if rng.random() < 0.3 else {}
            first, second = demand(request, free, bonus), demand(request, more, bonus)
            assert first.key() == second.key()
            demands._hint_cache.clear()
            walked = full_hints(second)
            demands._hint_cache.clear()
            assert full_hints(first) == walked == full_hints(second)
        # a negative amount (more held than the node has) is kept as it is
        negative = demand(request, {0: (-1,) * len(request), 1: (9,) * len(request),
                                    2: (0,) * len(request)}, {})
        assert negative.key() != demand(request, {0: (-1,) * len(request), 1: request,
                                                  2: (0,) * len(request)}, {}).key()
