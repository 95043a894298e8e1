"""The Topology Manager merge: the kubelet's own policy test tables, and the fast engine
against a brute-force cross-product reference on random inputs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numalign.testing.reference_merge import reference_merge
from numalign.topology import reachable as reachable_mod
from numalign.topology.errors import TopologyError
from numalign.topology.hints import ProviderHints, TopologyHint, mask_of
from numalign.topology.merge import (
    ResourceHints,
    keep_hints,
    max_of_min_affinity_counts,
    merge,
)
from numalign.topology.policies import get_policy, kubelet_names
from numalign.topology.policyconfig import PolicyOptions

# ---------------------------------------------------------------------------------------
# The kubelet's tables (policy_test.go, policy_best_effort_test.go,
# policy_restricted_test.go, policy_single_numa_node_test.go), transcribed as data.
#
# A provider is None (no output), {} (empty map) or {resource: hints}; hints are None
# (no preference), [] (cannot satisfy) or a list of (node ids | None, preferred).
# An expected mask of "ALL" means every NUMA node of the machine.
# ---------------------------------------------------------------------------------------

P, N = True, False

COMMON: list[tuple[str, list[Any], Any, bool]] = [
    ("two providers, one hint each, same mask, both preferred 1/2",
     [{"r1": [([0], P)]}, {"r2": [([0], P)]}], [0], P),
    ("two providers, one hint each, same mask, both preferred 2/2",
     [{"r1": [([1], P)]}, {"r2": [([1], P)]}], [1], P),
    ("one provider without hints, one single preferred hint 1/2",
     [None, {"resource": [([0], P)]}], [0], P),
    ("one provider without hints, one single preferred hint 2/2",
     [None, {"resource": [([1], P)]}], [1], P),
    ("one provider with two hints, one with a single matching hint 1/2",
     [{"r1": [([0], P), ([1], P)]}, {"r2": [([0], P)]}], [0], P),
    ("one provider with two hints, one with a single matching hint 2/2",
     [{"r1": [([0], P), ([1], P)]}, {"r2": [([1], P)]}], [1], P),
    ("both with two hints, the narrower preferred hint matches",
     [{"r1": [([0], P), ([1], P)]}, {"r2": [([0], P), ([0, 1], N)]}], [0], P),
    ("a less narrow preferred hint beats a narrower non-preferred one",
     [{"r1": [([1], P), ([0, 1], N)]}, {"r2": [([0], P), ([1], P), ([0, 1], N)]}], [1], P),
    ("several resources from the same provider",
     [{"r1": [([1], P), ([0, 1], N)], "r2": [([0], P), ([1], P), ([0, 1], N)]}], [1], P),
]

BEST_EFFORT: list[tuple[str, list[Any], Any, bool]] = [
    ("two providers, two hints each, same masks with different bits",
     [{"r1": [([0, 1], P), ([0, 2], P)]}, {"r2": [([0, 1], P), ([0, 2], P)]}], [0, 1], P),
    ("no hint providers", [], "ALL", P),
    ("a provider returns an empty map", [{}], "ALL", P),
    ("a provider returns a nil list for its resource", [{"resource": None}], "ALL", P),
    ("a provider returns an empty list for its resource", [{"resource": []}], "ALL", N),
    ("a single preferred nil hint", [{"resource": [(None, P)]}], "ALL", P),
    ("a single non-preferred nil hint", [{"resource": [(None, N)]}], "ALL", N),
    ("two providers, one hint each, no common mask",
     [{"r1": [([0], P)]}, {"r2": [([1], P)]}], "ALL", N),
    ("same mask, one preferred and one not 1/2",
     [{"r1": [([0], P)]}, {"r2": [([0], N)]}], [0], N),
    ("same mask, one preferred and one not 2/2",
     [{"r1": [([1], P)]}, {"r2": [([1], N)]}], [1], N),
    ("one wider mask, both preferred 1/2",
     [{"r1": [([0], P)]}, {"r2": [([0, 1], P)]}], [0], N),
    ("two hints against a single non-preferred hint",
     [{"r1": [([0], P), ([1], P)]}, {"r2": [([0, 1], N)]}], [0], N),
    ("one wider mask, both preferred 2/2",
     [{"r1": [([1], P)]}, {"r2": [([0, 1], P)]}], [1], N),
    ("bestNonPreferredAffinityCount (1)",
     [{"r1": [([0, 1, 2, 3], N), ([0, 1], N)]}, {"r2": [([0, 1], N)]}], [0, 1], N),
    ("bestNonPreferredAffinityCount (2)",
     [{"r1": [([0, 1, 2, 3], N), ([0, 1], N)]}, {"r2": [([0, 3], N)]}], [0, 3], N),
    ("bestNonPreferredAffinityCount (3)",
     [{"r1": [([0, 1, 2, 3], N), ([0, 1], N)]}, {"r2": [([1, 2], N)]}], [1, 2], N),
    ("bestNonPreferredAffinityCount (4)",
     [{"r1": [([0, 1, 2, 3], N), ([0, 1], N)]}, {"r2": [([2, 3], N)]}], [2, 3], N),
]

BNP5 = [{"r1": [([0, 1, 2, 3], N), ([0, 1], N)]}, {"r2": [([1, 2], N), ([2, 3], N)]}]
BNP6 = [
    {"r1": [([0, 1, 2, 3], N), ([0, 1], N)]},
    {"r2": [([1, 2, 3], N), ([1, 2], N), ([1, 3], N), ([2, 3], N)]},
]

NO_POLICY_OPTIONS: list[tuple[str, list[Any], Any, bool]] = [
    ("bestNonPreferredAffinityCount (5)", BNP5, [1, 2], N),
    ("bestNonPreferredAffinityCount (6)", BNP6, [1, 2], N),
]

CLOSEST_NUMA: list[tuple[str, list[Any], Any, bool]] = [
    ("two providers, two hints each, same masks, the closer one wins",
     [{"r1": [([0, 4], P), ([0, 2], P)]}, {"r2": [([0, 4], P), ([0, 2], P)]}], [0, 2], P),
    ("two providers, two hints each, different widths",
     [{"r1": [([4], P), ([0, 2], P)]}, {"r2": [([4], P), ([0, 2], P)]}], [4], P),
    ("bestNonPreferredAffinityCount (5), closest", BNP5, [2, 3], N),
    ("bestNonPreferredAffinityCount (6), closest", BNP6, [2, 3], N),
]

SINGLE_NUMA_NODE: list[tuple[str, list[Any], Any, bool]] = [
    ("no hint providers", [], None, P),
    ("a provider returns an empty map", [{}], None, P),
    ("a provider returns a nil list for its resource", [{"resource": None}], None, P),
    ("a provider returns an empty list for its resource", [{"resource": []}], None, N),
    ("a single preferred nil hint", [{"resource": [(None, P)]}], None, P),
    ("a single non-preferred nil hint", [{"resource": [(None, N)]}], None, N),
    ("two providers, one hint each, no common mask",
     [{"r1": [([0], P)]}, {"r2": [([1], P)]}], None, N),
    ("same mask, one preferred and one not 1/2",
     [{"r1": [([0], P)]}, {"r2": [([0], N)]}], None, N),
    ("same mask, one preferred and one not 2/2",
     [{"r1": [([1], P)]}, {"r2": [([1], N)]}], None, N),
    ("two hints against a single non-preferred hint",
     [{"r1": [([0], P), ([1], P)]}, {"r2": [([0, 1], N)]}], None, N),
    ("single NUMA hint generation",
     [{"r1": [([0, 1], P)], "r2": [([0], P), ([1], P), ([0, 1], N)]}], None, N),
    ("one no-preference provider",
     [{"r1": [([0], P), ([1], P), ([0, 1], N)]}, None], [0], P),
]

# commonNUMAInfoEightNodes: note the asymmetric 6 -> 7 (11) and 7 -> 6 (13) distances.
EIGHT_NODE_DISTANCES = {
    0: [10, 11, 12, 12, 30, 30, 30, 30],
    1: [11, 10, 12, 12, 30, 30, 30, 30],
    2: [12, 12, 10, 11, 30, 30, 30, 30],
    3: [12, 12, 11, 10, 30, 30, 30, 30],
    4: [30, 30, 30, 30, 10, 11, 12, 12],
    5: [30, 30, 30, 30, 11, 10, 12, 12],
    6: [30, 30, 30, 30, 12, 12, 10, 11],
    7: [30, 30, 30, 30, 12, 12, 13, 10],
}


def as_distance_map(rows: dict[int, list[int]]) -> dict[int, dict[int, int]]:
    ids = sorted(rows)
    return {a: {b: rows[a][j] for j, b in enumerate(ids)} for a in ids}


def build_providers(spec: list[Any]) -> list[ProviderHints]:
    out: list[ProviderHints] = []
    for provider in spec:
        if provider is None:
            out.append(None)
            continue
        hints_map: dict[str, list[TopologyHint] | None] = {}
        for name, hints in provider.items():
            if hints is None:
                hints_map[name] = None
            else:
                hints_map[name] = [
                    TopologyHint(None if ids is None else mask_of(ids), pref)
                    for ids, pref in hints
                ]
        out.append(hints_map)
    return out


def expected_hint(mask: Any, preferred: bool, numa_ids: list[int]) -> TopologyHint:
    if mask == "ALL":
        return TopologyHint(mask_of(numa_ids), preferred)
    return TopologyHint(None if mask is None else mask_of(mask), preferred)


def kubelet_suites() -> Iterator[Any]:
    four, eight, two = [0, 1, 2, 3], list(range(8)), [0, 1]
    dist8 = as_distance_map(EIGHT_NODE_DISTANCES)
    plain = PolicyOptions()
    closest = PolicyOptions(prefer_closest_numa_nodes=True)
    for policy in ("best-effort", "restricted"):
        for name, spec, mask, pref in COMMON + BEST_EFFORT + NO_POLICY_OPTIONS:
            yield pytest.param(policy, four, None, plain, spec, mask, pref,
                               id=f"{policy}-{name}")
        for name, spec, mask, pref in COMMON + BEST_EFFORT + CLOSEST_NUMA:
            yield pytest.param(policy, eight, dist8, closest, spec, mask, pref,
                               id=f"{policy}-closest-{name}")
    for name, spec, mask, pref in COMMON + SINGLE_NUMA_NODE:
        yield pytest.param("single-numa-node", two, None, plain, spec, mask, pref,
                           id=f"single-numa-node-{name}")


@pytest.mark.parametrize(
    ("policy", "numa_ids", "distances", "options", "spec", "mask", "preferred"),
    list(kubelet_suites()),
)
def test_kubelet_tables(
    policy: str,
    numa_ids: list[int],
    distances: dict[int, dict[int, int]] | None,
    options: PolicyOptions,
    spec: list[Any],
    mask: Any,
    preferred: bool,
) -> None:
    providers = build_providers(spec)
    want = expected_hint(mask, preferred, numa_ids)
    got = merge(policy, providers, numa_ids, distances, options)
    assert got.hint == want
    assert got.admit == (True if policy == "best-effort" else want.preferred)
    # The reference agrees with the kubelet's tables too.
    assert reference_merge(policy, providers, numa_ids, distances, options) == (
        want,
        got.admit,
    )


def test_none_policy() -> None:
    got = merge("none", [{"r": []}], [0, 1], None, PolicyOptions())
    assert got.hint == TopologyHint(None, False)
    assert got.admit


# TestPolicySingleNumaNodeFilterHints
@pytest.mark.parametrize(
    ("given", "want"),
    [
        ([], []),
        ([[(None, N)], [(None, P)]], [[], [(None, P)]]),
        ([[([0], P), (None, N)], [([1], P), (None, P)]], [[([0], P)], [([1], P), (None, P)]]),
        ([[([1], P), ([0], P), (None, N)], []], [[([1], P), ([0], P)], []]),
        (
            [
                [([0], P), ([1], P), ([1, 2], N), ([0, 1, 2], N), (None, N)],
                [([1, 2], N), ([0, 1, 2], N), ([0, 2], N), ([3], N)],
                [([1, 2], N), ([0, 1, 2], N), ([0, 2], N)],
            ],
            [[([0], P), ([1], P)], [], []],
        ),
    ],
)
def test_filter_single_numa_hints(given: list[Any], want: list[Any]) -> None:
    def conv(lists: list[Any]) -> list[ResourceHints]:
        return [
            ResourceHints(i, f"r{i}", tuple(
                TopologyHint(None if ids is None else mask_of(ids), p) for ids, p in hints
            ))
            for i, hints in enumerate(lists)
        ]

    assert [r.hints for r in keep_hints(get_policy("single-numa-node"), conv(given))] == [
        r.hints for r in conv(want)
    ]


# TestMaxOfMinAffinityCounts
@pytest.mark.parametrize(
    ("lists", "want"),
    [
        ([], 0),
        ([[[]]], 0),
        ([[[0]]], 1),
        ([[[0, 1]]], 2),
        ([[[0, 1], [0, 1, 2]]], 2),
        ([[[0, 1], [0, 1, 2]], [[0, 1, 2]]], 3),
        ([[[0, 1], [0, 1, 2]], [[0, 1, 2], [0, 1, 2, 3]]], 3),
    ],
)
def test_max_of_min_affinity_counts(lists: list[list[list[int]]], want: int) -> None:
    hints = [[TopologyHint(mask_of(ids), True) for ids in lst] for lst in lists]
    assert max_of_min_affinity_counts(hints) == want


def test_too_many_numa_nodes() -> None:
    ids = list(range(9))
    with pytest.raises(TopologyError, match="unsupported on machines with more than 8 NUMA"):
        merge("best-effort", [], ids, None, PolicyOptions(max_allowable_numa_nodes=8))
    # none never checks; the default limit is 64
    merge("none", [], ids, None, PolicyOptions(max_allowable_numa_nodes=8))
    merge("restricted", [], list(range(64)), None, PolicyOptions())
    with pytest.raises(TopologyError, match="more than 64"):
        merge("restricted", [], list(range(65)), None, PolicyOptions())


def test_prefer_closest_needs_distances() -> None:
    with pytest.raises(TopologyError) as e:
        merge("best-effort", [], [0, 1], None, PolicyOptions(prefer_closest_numa_nodes=True))
    assert e.value.field == "distances"


def test_explain_fields() -> None:
    providers = build_providers(BNP5)
    got = merge("best-effort", providers, [0, 1, 2, 3], None, PolicyOptions())
    assert got.best_non_preferred_affinity_count == 2
    assert got.candidates and got.candidates[0].mask == got.hint.mask
    assert [r.resource for r in got.resources] == ["r1", "r2"]
    assert "non-preferred" in got.reason


# ---------------------------------------------------------------------------------------
# Property tests: the fast engine against the brute-force reference.
# ---------------------------------------------------------------------------------------


@st.composite
def machines(draw: st.DrawFn, max_nodes: int = 8) -> tuple[list[int], dict[int, dict[int, int]]]:
    sparse = draw(st.booleans())
    pool = range(0, 256) if sparse else range(0, max_nodes)
    ids = sorted(draw(st.sets(st.sampled_from(pool), min_size=1, max_size=max_nodes)))
    dist = {
        a: {b: draw(st.integers(min_value=0, max_value=40)) for b in ids} for a in ids
    }
    return ids, dist


@st.composite
def provider_lists(
    draw: st.DrawFn, ids: list[int], max_resources: int = 4, max_hints: int = 6
) -> list[ProviderHints]:
    providers: list[ProviderHints] = []
    budget = max_resources
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        kind = draw(st.sampled_from(["nil", "empty", "map", "map", "map"]))
        if kind == "nil":
            providers.append(None)
            continue
        if kind == "empty" or budget == 0:
            providers.append({})
            continue
        res: dict[str, list[TopologyHint] | None] = {}
        for r in range(draw(st.integers(min_value=1, max_value=min(2, budget)))):
            budget -= 1
            form = draw(st.sampled_from(["nil", "empty", "list", "list", "list", "list"]))
            if form == "nil":
                res[f"r{r}"] = None
            elif form == "empty":
                res[f"r{r}"] = []
            else:
                hints = []
                for _ in range(draw(st.integers(min_value=1, max_value=max_hints))):
                    if draw(st.integers(min_value=0, max_value=9)) == 0:
                        mask = None
                    else:
                        sub = draw(st.sets(st.sampled_from(ids), max_size=len(ids)))
                        mask = mask_of(sub)
                    hints.append(TopologyHint(mask, draw(st.booleans())))
                res[f"r{r}"] = hints
        providers.append(res)
    return providers


KUBELET_POLICIES = kubelet_names()


@st.composite
def merge_inputs(draw: st.DrawFn, max_nodes: int = 8, max_hints: int = 6) -> Any:
    ids, dist = draw(machines(max_nodes))
    providers = draw(provider_lists(ids, max_hints=max_hints))
    policy = draw(st.sampled_from(KUBELET_POLICIES))
    closest = draw(st.booleans())
    options = PolicyOptions(prefer_closest_numa_nodes=closest)
    distances = dist if closest or draw(st.booleans()) else None
    return policy, providers, ids, distances, options


def check_against_reference(args: Any) -> None:
    policy, providers, ids, distances, options = args
    got = merge(policy, providers, ids, distances, options)
    assert (got.hint, got.admit) == reference_merge(policy, providers, ids, distances, options)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(merge_inputs())
def test_fast_merge_equals_reference(args: Any) -> None:
    check_against_reference(args)


@contextmanager
def forced_method(method: str) -> Iterator[None]:
    saved = reachable_mod._use_zeta
    saved_pairs = reachable_mod._Layer.NAIVE_PAIRS

    def use_zeta(n: int, resources: int, product: int) -> bool:
        if method == "auto":
            return saved(n, resources, product)
        return method == "zeta" and n <= 16

    reachable_mod._use_zeta = use_zeta
    if method == "layered-index":
        reachable_mod._Layer.NAIVE_PAIRS = 0
    try:
        yield
    finally:
        reachable_mod._use_zeta = saved
        reachable_mod._Layer.NAIVE_PAIRS = saved_pairs


@pytest.mark.parametrize("method", ["zeta", "layered", "layered-index"])
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=merge_inputs(max_hints=8))
def test_each_non_preferred_method_equals_reference(method: str, args: Any) -> None:
    with forced_method(method):
        check_against_reference(args)


@pytest.mark.parametrize("method", ["auto", "layered-index"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(args=merge_inputs(max_nodes=20, max_hints=5))
def test_wide_machines_equal_reference(method: str, args: Any) -> None:
    with forced_method(method):
        check_against_reference(args)


def test_full_lists_eight_nodes_match_reference_small() -> None:
    # Every mask of 5 nodes for 3 resources (the kubelet's providers' full lists), with
    # preferred flags that never line up, so the non-preferred search decides.
    ids = list(range(5))
    masks = list(range(1, 32))
    providers: list[ProviderHints] = [
        {f"r{r}": [TopologyHint(m, m.bit_count() == r + 1 and m & 1 << r != 0) for m in masks]}
        for r in range(3)
    ]
    for policy in KUBELET_POLICIES:
        for closest in (False, True):
            options = PolicyOptions(prefer_closest_numa_nodes=closest)
            dist = {a: {b: abs(a - b) * 3 + 10 for b in ids} for a in ids}
            check_against_reference((policy, providers, ids, dist, options))
