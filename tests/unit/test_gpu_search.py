"""The joint GPU search stays cheap whatever a pod's ``numalign.io/gpus`` asks: its work
is counted (:class:`SearchStats`: partial allocations expanded, candidate lists computed,
complete allocations scored), never timed. Identical requests are one class; the scored
search has a budget; feasibility (hints, and allocate's fallback) is unchanged.

Before grouping, eight one-GPU requests on an 8-GPU machine scored 20,000 complete
allocations (the old budget) over about 54,000 partial ones, ~1 s of CPU per node state.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pytest
from test_gpu_optimal import random_machine

import testdata
from numalign.testing.gpu_bruteforce import brute_force
from numalign.topology.errors import TopologyError
from numalign.topology.gpu import (
    ANY_LEVEL,
    GpuAllocation,
    GpuAllocationError,
    GpuRequest,
    allocate,
    hints,
    parse_gpu_requests,
    resolve_requests,
    trees_of,
)
from numalign.topology.gpu import search as gpu_search
from numalign.topology.gpu.groups import group_of
from numalign.topology.gpu.search import SEARCH_BUDGET, SearchStats
from numalign.topology.hints import mask_ids
from numalign.topology.machine import Machine, load_machine

EIGHT_GPUS = ["dgx1-like", "group8-gpu", "dgx-a100-like"]
LEVELS = {"dgx1-like": ["quad", "pcie"], "group8-gpu": ["grp0", "grp1"],
          "dgx-a100-like": ["nvswitch", "pcie"], "group4-gpu": ["nvlink"]}


def machine(name: str) -> Machine:
    return load_machine(testdata.MACHINES / f"{name}.yaml")


def lex_best(m: Machine, free: Mapping[str, int], requests: Sequence[GpuRequest],
             mask: int | None = None) -> tuple[tuple[int, int], list[list[int]]] | None:
    """Every allocation tried: the best score, then the lowest devices for the first
    request, the second, ... (the allocator's documented tie-break); GPU leaf indices."""
    got = brute_force(m, free, requests, mask, lowest=True)
    return None if got is None else (got[0], [mask_ids(p[0]) for p in got[1]])


def check_valid(m: Machine, free: Mapping[str, int], reqs: Sequence[GpuRequest],
                got: GpuAllocation, mask: int | None) -> None:
    """Each request's devices are free, within the mask, distinct, in one group of its
    sameGroup level, and its withResource devices in its withResource group."""
    trees = trees_of(m)
    used: dict[str, int] = {}
    for r in resolve_requests(m, list(reqs)):
        sets = [(r.resource or "", got.gpus[r.name], r.count)]
        if r.with_resource is not None:
            sets.append((r.with_resource.resource, got.attached[r.name],
                         r.with_resource.count))
        for res, ids, count in sets:
            tree = trees[res]
            bits = tree.bits_of(ids)
            assert len(ids) == count and bits.bit_count() == count
            assert bits & ~free[res] == 0 and bits & used.get(res, 0) == 0
            assert bits & ~tree.within_numa(mask) == 0
            used[res] = used.get(res, 0) | bits
        devs = [trees[r.resource or ""].devices[i]
                for i in mask_ids(trees[r.resource or ""].bits_of(got.gpus[r.name]))]
        assert all((d.memory or 0) >= r.min_memory for d in devs)
        if r.same_group != ANY_LEVEL:
            assert len({group_of(d, r.same_group) for d in devs} - {None}) == 1
        wr = r.with_resource
        if wr is not None:
            assert wr.level is not None
            nt = trees[wr.resource]
            ndevs = [nt.devices[i] for i in mask_ids(nt.bits_of(got.attached[r.name]))]
            assert len({group_of(d, wr.level) for d in [*devs, *ndevs]}) == 1


@pytest.mark.parametrize("name", EIGHT_GPUS)
def test_identical_one_gpu_requests_search_one_class(name: str) -> None:
    m = machine(name)
    trees = trees_of(m)
    tree = trees["nvidia.com/gpu"]
    free = {res: t.all_mask for res, t in trees.items()}
    for n in range(2, 9):
        reqs = parse_gpu_requests(json.dumps([{"count": 1}] * n), m)
        st = SearchStats()
        got = allocate(m, None, reqs, stats=st)
        assert st.truncated == 0 and st.expanded + st.scored <= 100, (n, st)
        hs = SearchStats()
        assert hints(m, None, reqs, stats=hs)
        assert hs.expanded + hs.scored <= 100, (n, hs)
        ids = {k: mask_ids(tree.bits_of(v)) for k, v in got.gpus.items()}
        if n == 8:
            assert ids == {f"gpu-{i}": [i] for i in range(8)}
        elif n <= 4:
            want = lex_best(m, free, reqs)
            assert want is not None
            assert got.score == want[0]
            assert [ids[r.name] for r in reqs] == want[1]


@pytest.mark.parametrize("name", EIGHT_GPUS)
def test_equivalent_requests_written_differently_are_one_class(name: str) -> None:
    """Eight one-GPU requests, each with its own name, minMemory and group level, that
    all mean "any one GPU": no cheaper to defeat the grouping than to use it."""
    m = machine(name)
    levels = itertools.cycle([ANY_LEVEL, "numa", *LEVELS[name]])
    doc = [{"count": 1, "name": f"r{i}", "minMemory": str(i + 1), "sameGroup": next(levels)}
           for i in range(8)]
    reqs = parse_gpu_requests(json.dumps(doc), m)
    st = SearchStats()
    got = allocate(m, None, reqs, stats=st)
    assert st.truncated == 0 and st.expanded + st.scored <= 100, st
    assert len({d for ids in got.gpus.values() for d in ids}) == 8


# Valid annotations that made the search work hardest (found by mutating annotations to
# maximise its work on these machines).
HARD: dict[str, list[list[dict[str, Any]]]] = {
    "dgx1-like": [
        [{"count": 1, "minMemory": "1", "withResource": {"resource": "mellanox.com/ib",
                                                          "sameGroup": "pcie"}},
         {"count": 1, "sameGroup": "pcie", "minMemory": "1Gi",
          "withResource": {"resource": "mellanox.com/ib", "sameGroup": "quad"}},
         {"count": 1, "sameGroup": "quad", "minMemory": "1Gi"},
         {"count": 2, "sameGroup": "quad", "minMemory": "1Gi"}],
        [{"count": 1, "withResource": {"resource": "mellanox.com/ib", "sameGroup": "numa"}},
         {"count": 1, "sameGroup": "numa", "minMemory": "1Gi"},
         {"count": 1, "sameGroup": "quad"},
         {"count": 1},
         {"count": 1, "withResource": {"resource": "mellanox.com/ib", "sameGroup": "pcie"}},
         {"count": 1, "sameGroup": "quad",
          "withResource": {"resource": "mellanox.com/ib", "sameGroup": "numa"}},
         {"count": 1},
         {"count": 1}],
    ],
    "group8-gpu": [
        [{"count": 2, "minMemory": "1"}, {"count": 1, "sameGroup": "grp0", "minMemory": "1"},
         {"count": 2, "sameGroup": "numa", "minMemory": "1Gi"},
         {"count": 1, "sameGroup": "grp0", "minMemory": "1"}],
        [{"count": 2, "sameGroup": "grp1"}, {"count": 1, "sameGroup": "grp1"},
         {"count": 1, "sameGroup": "grp0"}, {"count": 1}],
    ],
    "dgx-a100-like": [
        [{"count": 2, "minMemory": "1", "withResource": {"resource": "nvidia.com/hca",
                                                          "sameGroup": "pcie"}},
         {"count": 1, "sameGroup": "nvswitch", "minMemory": "1Gi",
          "withResource": {"resource": "nvidia.com/hca", "sameGroup": "nvswitch"}},
         {"count": 4, "sameGroup": "nvswitch", "minMemory": "30Gi",
          "withResource": {"resource": "nvidia.com/hca", "sameGroup": "nvswitch"}},
         {"count": 1, "sameGroup": "nvswitch", "minMemory": "50Gi",
          "withResource": {"resource": "nvidia.com/hca", "sameGroup": "numa"}}],
        [{"count": 2, "minMemory": "1Gi", "sameGroup": "pcie",
          "withResource": {"resource": "nvidia.com/hca", "sameGroup": "nvswitch"}},
         {"count": 1, "sameGroup": "pcie", "minMemory": "50Gi"},
         {"count": 3, "minMemory": "1",
          "withResource": {"resource": "nvidia.com/hca", "sameGroup": "nvswitch"}},
         {"count": 1, "sameGroup": "numa", "minMemory": "1Gi",
          "withResource": {"resource": "nvidia.com/hca", "sameGroup": "numa"}}],
        [{"count": 2, "sameGroup": "numa"}, {"count": 1, "sameGroup": "pcie"},
         {"count": 1, "sameGroup": "nvswitch",
          "withResource": {"resource": "nvidia.com/hca", "sameGroup": "numa"}},
         {"count": 1, "withResource": {"resource": "nvidia.com/hca", "sameGroup": "nvswitch"}},
         *[{"count": 1, "withResource": {"resource": "nvidia.com/hca", "sameGroup": "pcie"}}]
         * 3],
    ],
}


@pytest.mark.parametrize(("name", "index"),
                         [(n, i) for n, docs in HARD.items() for i in range(len(docs))])
def test_hard_annotations_stay_bounded(name: str, index: int) -> None:
    """What the admission runs per node state (hints, then allocate in the first hint's
    mask) stays within the budget, and the allocation is valid."""
    m = machine(name)
    reqs = parse_gpu_requests(json.dumps(HARD[name][index]), m)
    hs = SearchStats()
    got_hints = hints(m, None, reqs, stats=hs)
    assert got_hints
    assert hs.expanded + hs.evaluated + hs.scored <= 5000, hs
    st = SearchStats()
    mask = got_hints[0].mask
    got = allocate(m, None, reqs, mask, stats=st)
    assert st.searches == 1 and st.expanded + st.scored <= SEARCH_BUDGET, st
    assert st.evaluated <= st.expanded + len(reqs)
    free = {res: t.all_mask for res, t in trees_of(m).items()}
    check_valid(m, free, reqs, got, mask)


def _case(rng: random.Random) -> tuple[Machine, str, dict[str, int], int | None]:
    """A small machine (random or a fixture), a mix of 1-4 requests from at most two
    templates (so most mixes repeat a request), a free state and a NUMA mask."""
    if rng.random() < 0.6:
        m = random_machine(rng)
        levels = ["outer", "inner", "numa"]
    else:
        name = rng.choice(["group4-gpu", "group8-gpu", "dgx1-like"])
        m = machine(name)
        levels = ["numa", *LEVELS[name]]
    nic = sorted(r for r in m.device_resources if not r.endswith("/gpu"))
    templates: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 2)):
        t: dict[str, Any] = {"count": rng.choice([1, 1, 2, 3]),
                             "sameGroup": rng.choice([ANY_LEVEL, *levels])}
        if rng.random() < 0.3:
            t["minMemory"] = "10Gi"
        if nic and rng.random() < 0.3:
            t["withResource"] = {"resource": nic[0], "sameGroup": rng.choice(levels)}
        templates.append(t)
    text = json.dumps([rng.choice(templates) for _ in range(rng.randint(2, 4))])
    free = {res: t.all_mask if rng.random() < 0.4 else rng.getrandbits(len(t.devices))
            for res, t in trees_of(m).items()}
    return m, text, free, rng.choice([None, None, 1, 2, 3])


def _parsed_cases(seeds: range) -> Iterator[
        tuple[int, str, Machine, list[GpuRequest], dict[str, int], int | None]]:
    """The random cases of ``seeds`` whose annotation parses on their machine."""
    for seed in seeds:
        m, text, free, mask = _case(random.Random(seed))
        try:
            reqs = parse_gpu_requests(text, m)
        except TopologyError:
            continue
        yield seed, text, m, reqs, free, mask


@pytest.mark.parametrize("block", range(2))
def test_repeated_requests_match_exhaustive(block: int) -> None:
    """With requests repeated, each request's devices are those of the exhaustive search's
    best allocation, ties to the lowest devices for the first request, ..."""
    checked = 0
    for seed, text, m, reqs, free, mask in _parsed_cases(range(block * 200, (block + 1) * 200)):
        trees = trees_of(m)
        want = lex_best(m, free, reqs, mask)
        try:
            got = allocate(m, {res: t.ids(free[res]) for res, t in trees.items()}, reqs, mask)
        except GpuAllocationError:
            assert want is None, (seed, text)
            continue
        assert want is not None, (seed, text)
        ids = [mask_ids(trees[r.resource or ""].bits_of(got.gpus[r.name]))
               for r in resolve_requests(m, reqs)]
        assert (got.score, ids) == want, (seed, text)
        checked += 1
    assert checked > 40


def test_budget_spent_keeps_a_valid_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the scored search cut after two steps the allocation is still valid, and a
    pod is refused exactly when no allocation exists (the unbudgeted feasibility search
    takes over)."""
    monkeypatch.setattr(gpu_search, "SEARCH_BUDGET", 2)
    truncated = 0
    for seed, text, m, reqs, free, mask in _parsed_cases(range(300)):
        trees = trees_of(m)
        want = brute_force(m, free, reqs, mask)
        st = SearchStats()
        try:
            got = allocate(m, {res: t.ids(free[res]) for res, t in trees.items()}, reqs, mask,
                           stats=st)
        except GpuAllocationError:
            assert want is None, (seed, text)
            continue
        assert want is not None, (seed, text)
        check_valid(m, free, reqs, got, mask)
        assert got.score >= want[0]
        truncated += st.truncated
    assert truncated > 20
