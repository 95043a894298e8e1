"""The allocator against exhaustive search on small machines: for every generated
request mix and free state, its allocation scores at least as well as the best
allocation found by trying every combination (numalign.testing.gpu_bruteforce)."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

import testdata
from numalign.testing.gpu_bruteforce import brute_force
from numalign.topology.errors import TopologyError
from numalign.topology.gpu import (
    GpuAllocationError,
    allocate,
    get_scorer,
    hints,
    parse_gpu_requests,
    score_allocation,
    trees_of,
)
from numalign.topology.machine import Machine, load_machine, machine_from_dict

MACHINES = testdata.MACHINES


def random_machine(rng: random.Random) -> Machine:
    """3-8 GPUs in up to 3 outer x 3 inner groups (some devices lack the outer level),
    mixed memory, 2 NUMA nodes that need not nest in the groups, sometimes NICs."""
    outer, inner = rng.randint(1, 3), rng.randint(1, 3)
    devs: list[dict[str, Any]] = []
    for i in range(rng.randint(3, 8)):
        o = rng.randrange(outer)
        groups = {"inner": f"i{o}{rng.randrange(inner)}"}
        if rng.random() < 0.9:
            groups = {"outer": f"o{o}", **groups}
        devs.append({"resource": "x.com/gpu", "id": f"g{i}", "numaNode": o % 2,
                     "memory": rng.choice(["8Gi", "16Gi"]), "groups": groups})
    if rng.random() < 0.4:
        for j in range(rng.randint(1, 3)):
            o = rng.randrange(outer)
            devs.append({"resource": "x.com/nic", "id": f"n{j}", "numaNode": o % 2,
                         "groups": {"outer": f"o{o}", "inner": f"i{o}{rng.randrange(inner)}"}})
    nodes = [{"id": 0, "cpus": "0", "memory": "1Gi"}, {"id": 1, "cpus": "1", "memory": "1Gi"}]
    return machine_from_dict({"name": "random", "numaNodes": nodes, "devices": devs})


def random_requests(rng: random.Random, m: Machine, levels: list[str]) -> str:
    nic = sorted(r for r in m.device_resources if not r.endswith("/gpu"))
    out: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 3)):
        r: dict[str, Any] = {"count": rng.randint(1, 3)}
        if rng.random() < 0.3:
            r["minMemory"] = "10Gi"
        r["sameGroup"] = rng.choice(["any", "any", *levels])
        if nic and rng.random() < 0.3:
            r["withResource"] = {"resource": nic[0], "sameGroup": rng.choice(levels)}
        out.append(r)
    return json.dumps(out)


def check(m: Machine, rng: random.Random, levels: list[str]) -> bool:
    """One random case; False if the request mix is invalid for the machine."""
    try:
        reqs = parse_gpu_requests(random_requests(rng, m, levels), m)
    except TopologyError:
        return False
    trees = trees_of(m)
    free = {res: t.all_mask if rng.random() < 0.4 else rng.getrandbits(len(t.devices))
            for res, t in trees.items()}
    mask = rng.choice([None, None, 1, 2, 3])
    want = brute_force(m, free, reqs, mask)
    free_ids = {res: t.ids(free[res]) for res, t in trees.items()}
    try:
        got = allocate(m, free_ids, reqs, mask)
    except GpuAllocationError:
        assert want is None, f"exhaustive search found {want}"
        return True
    assert want is not None
    # The reported score is the real one, and no allocation scores better.
    sc = get_scorer("pack")
    primary = [(r.resource or "", trees[r.resource or ""].bits_of(got.gpus[r.name]))
               for r in reqs]
    extra = [(r.with_resource.resource,
              trees[r.with_resource.resource].bits_of(got.attached[r.name]))
             for r in reqs if r.with_resource is not None]
    assert score_allocation(sc, trees, free, primary, extra) == got.score
    assert got.score <= want[0], (got, want)
    for r, (res, bits) in zip(reqs, primary, strict=True):
        assert bits & ~free[res] == 0 and bits.bit_count() == r.count
    # Every mask a hint offers holds an allocation.
    for h in hints(m, free_ids, reqs):
        assert brute_force(m, free, reqs, h.mask) is not None
    return True


@pytest.mark.parametrize("block", range(4))
def test_random_small_machines_match_exhaustive(block: int) -> None:
    checked = 0
    for seed in range(block * 150, (block + 1) * 150):
        rng = random.Random(seed)
        checked += check(random_machine(rng), rng, ["outer", "inner", "numa"])
    assert checked > 80


@pytest.mark.parametrize(("name", "levels"), [
    ("group4-gpu.yaml", ["nvlink", "numa"]),
    ("group8-gpu.yaml", ["grp0", "grp1", "numa"]),
    ("dgx1-like.yaml", ["quad", "pcie", "numa"]),
])
def test_fixture_machines_match_exhaustive(name: str, levels: list[str]) -> None:
    path = MACHINES / name
    m = load_machine(path)
    checked = 0
    for seed in range(60):
        checked += check(m, random.Random(seed), levels)
    assert checked > 20
