"""Hint providers (kubelet semantics), CPU picking, and the reduced hint generation
(same merge answer as the kubelet's full lists)."""

from __future__ import annotations

import random
from typing import Any

import testdata
from numalign.topology.cpu_assign import allocate_cpus, take_by_topology
from numalign.topology.demands import (
    Demand,
    cpu_demand,
    device_hints_or_demand,
    full_hints,
    iterate_masks,
    memory_demand,
)
from numalign.topology.hintgen import FULL_LIMIT, plan_hints
from numalign.topology.hints import TopologyHint, mask_of
from numalign.topology.ledger import ContainerAllocation, Ledger
from numalign.topology.machine import Machine, load_machine, machine_from_dict
from numalign.topology.merge import merge
from numalign.topology.policyconfig import PolicyOptions

MACHINES = testdata.MACHINES
GI = 2**30


def _load(name: str) -> Machine:
    path = MACHINES / name
    return load_machine(path)


def _smt() -> Machine:
    # 2 NUMA nodes, 4 cores each, 2 threads per core: siblings N and N + 8
    return machine_from_dict({
        "name": "smt", "numaNodes": [{"id": 0, "cpus": "0-3,8-11", "memory": "8Gi"},
                                     {"id": 1, "cpus": "4-7,12-15", "memory": "8Gi"}],
        "cpuTopology": {"threadsPerCore": 2},
    })


def _hints(pairs: list[tuple[list[int], bool]]) -> list[TopologyHint]:
    return [TopologyHint(mask_of(ids), pref) for ids, pref in pairs]


# ------------------------------------------------------------------ CPU picking


def test_whole_cores_before_threads() -> None:
    m = _smt()
    assert take_by_topology(m, set(range(16)), 2) == [0, 8]
    assert take_by_topology(m, set(range(16)), 4) == [0, 1, 8, 9]
    # a half-used core is filled first when a single thread is asked for
    assert take_by_topology(m, set(range(16)) - {1}, 1) == [9]
    # 3 CPUs: one whole core, then the remaining thread packed next to it
    got = take_by_topology(m, set(range(16)), 3)
    assert got is not None and {0, 8} <= set(got) and len(got) == 3


def test_whole_numa_node_first_and_affinity() -> None:
    m = _smt()
    assert take_by_topology(m, set(range(16)), 8) == [0, 1, 2, 3, 8, 9, 10, 11]
    # packed: the NUMA node with fewer free CPUs is used first
    assert take_by_topology(m, set(range(16)) - {0, 8}, 2) == [1, 9]
    # inside the affinity first, then anywhere
    assert allocate_cpus(m, set(range(16)), 2, mask_of([1])) == [4, 12]
    got = allocate_cpus(m, {0, 4, 5, 12, 13}, 3, mask_of([0]))
    assert got is not None and 0 in got and len(got) == 3
    assert allocate_cpus(m, {0, 1}, 3, None) is None


# ------------------------------------------------------------------ providers


def test_cpu_hints_like_the_kubelet() -> None:
    m = _load("seed-figure1.yaml")
    led = Ledger(m)
    d = cpu_demand(m, led, "u", 2)
    assert full_hints(d) == _hints([([0], True), ([1], True), ([0, 1], False)])
    d = cpu_demand(m, led, "u", 6)
    assert full_hints(d) == _hints([([0, 1], True)])
    # all but CPUs 3 and 7 taken: 2 CPUs fit only across both nodes, still preferred
    # width 1 by capacity, so the only hint is not preferred
    led.allocate("x", "c", ContainerAllocation(cpus=(0, 1, 2, 4, 5, 6)))
    assert full_hints(cpu_demand(m, led, "u", 2)) == _hints([([0, 1], False)])
    # reusable CPUs (held by the pod's init container) must lie in every mask
    led.allocate("u", "init", ContainerAllocation(cpus=(3,), reusable=True))
    assert full_hints(cpu_demand(m, led, "u", 1)) == _hints([([0], True), ([0, 1], False)])


def test_cpu_hints_skip_cpu_less_nodes() -> None:
    m = _load("gb200-like-34numa.yaml")
    d = cpu_demand(m, Ledger(m), "u", 100)
    assert d.domain == (0, 1)
    assert full_hints(d) == _hints([([0, 1], True)])


def test_device_hints() -> None:
    m = machine_from_dict({
        "name": "d", "numaNodes": [{"id": 0, "cpus": "0", "memory": "1Gi"},
                                   {"id": 1, "cpus": "1", "memory": "1Gi"}],
        "devices": [{"resource": "a.com/x", "id": "x0", "numaNode": 0},
                    {"resource": "a.com/x", "id": "x1", "numaNode": None},
                    {"resource": "a.com/y", "id": "y0", "numaNode": None}],
    })
    led = Ledger(m)
    # no device of the resource has a NUMA node: no preference
    assert device_hints_or_demand(m, led, "u", "a.com/y", 1) is None
    # not enough devices at all: cannot satisfy
    assert device_hints_or_demand(m, led, "u", "a.com/x", 3) == []
    d = device_hints_or_demand(m, led, "u", "a.com/x", 1)
    assert isinstance(d, Demand)
    # masks range over the nodes with devices of the resource only (deviceNUMANodes)
    assert full_hints(d) == _hints([([0], True)])
    # 2 devices: the one without a NUMA node never counts in a mask
    d = device_hints_or_demand(m, led, "u", "a.com/x", 2)
    assert isinstance(d, Demand)
    assert full_hints(d) == []


def test_memory_group_rule() -> None:
    m = _load("seed-figure1.yaml")
    led = Ledger(m)
    d = memory_demand(m, led, {"memory": 40 * GI})
    assert full_hints(d) == _hints([([0, 1], True)])
    d = memory_demand(m, led, {"memory": GI})
    assert full_hints(d) == _hints([([0], True), ([1], True), ([0, 1], False)])
    # node 0 holds a single-node allocation: it can no longer join a group
    led.allocate("x", "c", ContainerAllocation(memory={"memory": {0: GI}}, memory_mask=1))
    assert full_hints(memory_demand(m, led, {"memory": GI})) == _hints(
        [([0], True), ([1], True)])
    assert full_hints(memory_demand(m, led, {"memory": 40 * GI})) == []


def test_same_free_amounts_other_hints() -> None:
    """Hint lists are kept by what they depend on: the same free amounts per node under
    another grouping of the node's memory, or with other nodes pinned, give other hints."""
    m = _load("seed-figure1.yaml")
    grouped, single = Ledger(m), Ledger(m)
    grouped.allocate("x", "c", ContainerAllocation(memory={"memory": {0: GI}},
                                                   memory_mask=mask_of([0, 1])))
    single.allocate("x", "c", ContainerAllocation(memory={"memory": {0: GI}}, memory_mask=1))
    assert grouped.free_view() == single.free_view()
    assert full_hints(memory_demand(m, grouped, {"memory": GI})) == _hints([([0, 1], False)])
    assert full_hints(memory_demand(m, single, {"memory": GI})) == _hints(
        [([0], True), ([1], True)])
    # the same usable CPUs per node, one of them the pod's own (reusable): it pins node 0
    reusing = Ledger(m)
    reusing.allocate("u", "init", ContainerAllocation(cpus=(min(m.node(0).cpus),),
                                                      reusable=True))
    assert full_hints(cpu_demand(m, Ledger(m), "u", 1)) == _hints(
        [([0], True), ([1], True), ([0, 1], False)])
    assert full_hints(cpu_demand(m, reusing, "u", 1)) == _hints([([0], True), ([0, 1], False)])


def test_a_ledger_keeps_one_demand_for_all_pods_it_does_not_hold() -> None:
    """Deciding many pods against one unchanged ledger (an agent refusing pod after pod)
    keeps what it derives bounded: one CPU entry for every pod it does not hold."""
    m = _load("seed-figure1.yaml")
    led = Ledger(m)
    led.allocate("held", "init", ContainerAllocation(cpus=(0,), reusable=True))
    for i in range(50):
        assert cpu_demand(m, led, f"u{i}", 1).required == 0
        memory_demand(m, led, {"memory": GI})
    assert cpu_demand(m, led, "held", 1).required == 1
    assert len(led._memo) <= 5


def test_kept_hint_lists_are_the_kubelet_walk() -> None:
    """On random machines, states and requests (with reusable CPUs and memory), every
    hint list, made or kept, is the plain walk over every mask with the narrowest width
    by capacity."""
    rng = random.Random(20261201)
    walked = 0
    for _ in range(150):
        m = _random_machine(rng, rng.randrange(3, 9))
        led = _random_state(rng, m)
        free = sorted(led.free_cpus())
        if free and rng.random() < 0.5:
            led.allocate("u", "init", ContainerAllocation(
                cpus=tuple(rng.sample(free, rng.randrange(1, len(free) + 1))), reusable=True))
        items = [d for d in _demands(rng, m, led) if isinstance(d, Demand)]
        mask = mask_of(rng.sample(m.numa_ids, rng.randrange(1, len(m.numa_ids) + 1)))
        items.append(memory_demand(m, led, {"memory": rng.randrange(1, 6) * GI // 2},
                                   {mask: {"memory": rng.randrange(0, 3) * GI}}))
        for d in items:
            width = min((k.bit_count() for k in iterate_masks(d.domain)
                         if d.fits_capacity(k)), default=len(d.domain))
            want = [TopologyHint(k, k.bit_count() == width) for k in iterate_masks(d.domain)
                    if d.fits(k)]
            assert full_hints(d) == want
            assert full_hints(d) == want  # kept
            walked += 1
    assert walked > 300


# ------------------------------------------------------------------ reduced == full


def _random_machine(rng: random.Random, n: int) -> Machine:
    nodes: list[dict[str, Any]] = []
    cpu = 0
    for i in range(n):
        k = rng.choice([0, 2, 4, 4])
        cpus = f"{cpu}-{cpu + k - 1}" if k else ""
        cpu += k
        nodes.append({"id": i, "cpus": cpus, "memory": f"{rng.choice([1, 2, 4])}Gi"})
    dist = [[10 if a == b else rng.choice([12, 20, 20, 30]) for b in range(n)] for a in range(n)]
    for a in range(n):
        for b in range(a):
            dist[a][b] = dist[b][a]
    devices = [{"resource": "v.com/gpu", "id": f"g{j}", "numaNode": rng.randrange(n)}
               for j in range(rng.randrange(1, 5))]
    devices += [{"resource": "v.com/nic", "id": f"n{j}", "numaNode": rng.randrange(n)}
                for j in range(rng.randrange(1, 4))]
    return machine_from_dict({"name": "r", "numaNodes": nodes, "distances": dist,
                              "devices": devices})


def _random_state(rng: random.Random, m: Machine) -> Ledger:
    led = Ledger(m)
    cpus = sorted(m.cpus)
    taken = rng.sample(cpus, rng.randrange(0, max(1, len(cpus) // 2)))
    if taken:
        led.allocate("x", "cpus", ContainerAllocation(cpus=tuple(taken)))
    ids = m.numa_ids
    for j in range(rng.randrange(0, 3)):
        group = rng.sample(ids, rng.choice([1, 1, 2, 3]))
        if any(led.assignments.get(g) for g in group):
            continue
        mem = {g: rng.randrange(0, led.free_memory(g, "memory") // 2 + 1) for g in group}
        led.allocate(f"m{j}", "c", ContainerAllocation(memory={"memory": mem},
                                                      memory_mask=mask_of(group)))
    gpus = [d.id for d in m.devices_of("v.com/gpu")]
    used = rng.sample(gpus, rng.randrange(0, len(gpus)))
    if used:
        led.allocate("d", "c", ContainerAllocation(devices={"v.com/gpu": tuple(used)}))
    return led


def _demands(rng: random.Random, m: Machine, led: Ledger) -> list[Demand | list[Any] | None]:
    out: list[Demand | list[Any] | None] = []
    if rng.random() < 0.8:
        out.append(cpu_demand(m, led, "u", rng.randrange(1, 10)))
    if rng.random() < 0.7:
        out.append(memory_demand(m, led, {"memory": rng.randrange(1, 6) * GI // 2}))
    for res in ("v.com/gpu", "v.com/nic"):
        if rng.random() < 0.6:
            out.append(device_hints_or_demand(m, led, "u", res, rng.randrange(1, 3)))
    return out


def test_reduced_hints_give_the_full_merge_answer() -> None:
    rng = random.Random(20240611)
    checked = inexact = 0
    for case in range(120):
        m = _random_machine(rng, rng.randrange(3, 8))
        led = _random_state(rng, m)
        items = _demands(rng, m, led)
        demands = [d for d in items if isinstance(d, Demand)]
        others = {f"fixed{i}": d for i, d in enumerate(items) if not isinstance(d, Demand)}
        for policy in ("best-effort", "restricted", "single-numa-node"):
            closest = case % 3 == 0
            opts = PolicyOptions(prefer_closest_numa_nodes=closest)
            fixed = list(others.values())
            full = plan_hints(demands, m.numa_ids, m.distances, policy, closest)
            red = plan_hints(demands, m.numa_ids, m.distances, policy, closest, full_limit=0,
                             fixed=fixed)
            assert full.method == "full" and red.method == "reduced"
            for fl, rl in zip(full.lists, red.lists, strict=True):
                assert set(rl) <= set(fl)  # reduced lists are sub-lists of the kubelet's
            answers = []
            for plan in (full, red):
                provider: dict[str, list[TopologyHint] | None] = {
                    f"r{i}": lst for i, lst in enumerate(plan.lists)}
                provider.update(others)
                res = merge(policy, [provider], m.numa_ids, m.distances, opts)
                answers.append((res.hint, res.admit))
            if not red.exact:
                inexact += 1
                continue
            checked += 1
            assert answers[0] == answers[1], (case, policy, answers)
    assert checked > 300 and inexact < 10


def test_full_generation_up_to_the_limit_only() -> None:
    m = _load("wide64.yaml")
    d = cpu_demand(m, Ledger(m), "u", 20)
    plan = plan_hints([d], m.numa_ids, m.distances, "restricted", False)
    assert plan.method == "reduced" and len(m.numa_ids) > FULL_LIMIT
    hints = plan.lists[0]
    assert TopologyHint(mask_of([0, 1, 2]), True) in hints
    assert all(h.mask is not None and d.fits(h.mask) for h in hints)
    res = merge("restricted", [{"cpu": hints}], m.numa_ids, m.distances, PolicyOptions())
    assert res.hint == TopologyHint(mask_of([0, 1, 2]), True) and res.admit
