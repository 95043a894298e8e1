"""Benchmark of the Topology Manager merge (``numalign.topology.merge``).

Prints the per-decision cost at 2..64 NUMA nodes with realistic provider hint lists,
the cost at 8 NUMA nodes x 4 resources x 255 hints (the kubelet's full lists), and the
speed-up over the brute-force cross-product reference (numalign.testing.reference_merge)
measured in this process on a case the reference can finish.

    python bench/run.py merge [--quick]
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path

from numalign.testing.reference_merge import reference_merge
from numalign.topology.hints import ProviderHints, TopologyHint, mask_of
from numalign.topology.merge import merge
from numalign.topology.policyconfig import PolicyOptions

HERE = Path(__file__).resolve().parent


def per_call(fn: Callable[[], object], min_time: float = 0.3, max_calls: int = 10_000) -> float:
    """Seconds per call: the best of a few timed batches."""
    fn()
    calls = 1
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    calls = max(1, min(max_calls, int(min_time / max(once, 1e-7) / 3)))
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def cost(
    policy: str,
    providers: list[ProviderHints],
    ids: list[int],
    dist: dict[int, dict[int, int]] | None,
    opts: PolicyOptions,
    min_time: float,
) -> float:
    """Seconds per merge decision."""
    return per_call(lambda: merge(policy, providers, ids, dist, opts), min_time)


def distances_for(ids: list[int]) -> dict[int, dict[int, int]]:
    # Sockets of 4 NUMA nodes: 10 local, 12 same socket, 20 + 2 * hops across sockets.
    return {
        a: {b: 10 if a == b else 12 if a // 4 == b // 4 else 20 + 2 * abs(a // 4 - b // 4)
            for b in ids}
        for a in ids
    }


def realistic_providers(ids: list[int], aligned: bool) -> list[ProviderHints]:
    """What a topology-aware provider emits at any size: every 1- and 2-node mask that can
    hold the request plus the all-nodes mask; preferred = the narrowest that fits.

    ``aligned``: every resource needs 2 NUMA nodes and the GPUs sit on the last two, so a
    preferred mask is common to all. Otherwise cpu and memory need 2 nodes, hugepages and
    the GPU 1 (on other nodes): no preferred mask can line up (preferred needs equal
    masks), and the non-preferred search decides.
    """
    n = len(ids)
    everything = mask_of(ids)
    singles = [1 << i for i in ids]
    pairs = [(1 << a) | (1 << b) for a, b in itertools.combinations(ids, 2)]
    half = ids[: max(1, n // 2)]
    other = ids[max(1, n // 2):] or ids

    def resource(width: int, free: list[int]) -> list[TopologyHint]:
        ok = mask_of(free)
        hints: list[TopologyHint] = []
        for m in singles + pairs:
            if m & ~ok:
                continue
            if m.bit_count() >= width:
                hints.append(TopologyHint(m, m.bit_count() == width))
        hints.append(TopologyHint(everything, width == n))
        return hints

    if aligned:
        return [
            {"cpu": resource(2, ids), "memory": resource(2, ids)},
            {"hugepages-1Gi": resource(2, ids[1:])},
            {"nvidia.com/gpu": resource(2, ids[-2:])},
        ]
    return [
        {"cpu": resource(2, half), "memory": resource(2, ids)},
        {"hugepages-1Gi": resource(1, other)},
        {"nvidia.com/gpu": resource(1, ids[:1] + other[-1:])},
    ]


def full_providers(n: int, resources: int, aligned: bool) -> list[ProviderHints]:
    """The kubelet's providers at n NUMA nodes: a hint for every non-empty mask;
    preferred = the minimal width. Aligned: every resource needs 2 nodes' worth, so every
    pair is preferred everywhere. Misaligned: resources need 1 or 2 nodes and are preferred
    only on different nodes, so no preferred mask lines up."""
    ids = list(range(n))
    masks = range(1, 1 << n)
    out: list[ProviderHints] = []
    for r in range(resources):
        need = 2 if aligned else 1 + r % 2
        if aligned:
            hints = [TopologyHint(m, m.bit_count() == need) for m in masks]
        else:
            hints = [
                TopologyHint(
                    m, m.bit_count() == need and bool(m >> r & 1) and not m >> (r + 1) & 1
                )
                for m in masks
            ]
            # make the preferred ones disjoint across resources
            hints = [
                h if not h.preferred or h.mask is None or h.mask.bit_count() == 1 or r == 0
                else TopologyHint(h.mask, False)
                for h in hints
            ]
        out.append({f"res{r}": hints})
    del ids
    return out


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    min_time = 0.05 if quick else 0.3
    print("numalign merge benchmark (per decision; lower is better)")
    print()
    print("Realistic provider lists (1- and 2-node masks + all nodes), 4 resources, best-effort")
    print(f"{'NUMA':>5} {'hints/res':>10} {'aligned':>12} {'mixed':>12} {'mixed+closest':>14}")
    plain = PolicyOptions()
    closest = PolicyOptions(prefer_closest_numa_nodes=True)
    previous = None
    for n in (2, 4, 8, 16, 32, 64):
        ids = list(range(n))
        dist = distances_for(ids)
        al = realistic_providers(ids, True)
        mis = realistic_providers(ids, False)
        hints = max(len(v or []) for p in al for v in (p or {}).values())
        t_al = cost("best-effort", al, ids, None, plain, min_time)
        t_mis = cost("best-effort", mis, ids, None, plain, min_time)
        t_cl = cost("best-effort", mis, ids, dist, closest, min_time)
        grow = "" if previous is None else f"  (mixed: x{t_mis / previous:.1f} for twice the nodes)"
        previous = t_mis
        print(f"{n:>5} {hints:>10} {t_al * 1e3:>10.3f}ms {t_mis * 1e3:>10.3f}ms "
              f"{t_cl * 1e3:>12.3f}ms{grow}")
    print()

    print("Full kubelet-style lists: 8 NUMA nodes x 4 resources x 255 hints")
    ids8 = list(range(8))
    dist8 = distances_for(ids8)
    for label, providers in (
        ("aligned (preferred wins)", full_providers(8, 4, True)),
        ("misaligned (non-preferred search)", full_providers(8, 4, False)),
    ):
        for policy in ("best-effort", "restricted", "single-numa-node"):
            for opts_label, opts, d8 in (("", plain, None), (", closest", closest, dist8)):
                if policy == "single-numa-node" and opts_label:
                    continue
                t = cost(policy, providers, ids8, d8, opts, min_time)
                print(f"  {label:<34} {policy + opts_label:<26} {t * 1e3:8.3f} ms")
    print()

    print("Speed-up over the brute-force cross product (same process)")
    for n, resources in ((5, 3), (6, 3)) if not quick else ((5, 3),):
        ids = list(range(n))
        dist = distances_for(ids)
        for label, providers in (
            ("aligned", full_providers(n, resources, True)),
            ("misaligned", full_providers(n, resources, False)),
        ):
            for opts, d in ((plain, None), (closest, dist)):
                fast = cost("best-effort", providers, ids, d, opts, min_time)
                start = time.perf_counter()
                want = reference_merge("best-effort", providers, ids, d, opts)
                slow = time.perf_counter() - start
                got = merge("best-effort", providers, ids, d, opts)
                assert (got.hint, got.admit) == want, (got, want)
                combos = ((1 << n) - 1) ** resources
                print(f"  {n} nodes x {resources} res x {(1 << n) - 1} hints "
                      f"({combos:,} combinations), {label:<10} "
                      f"{'closest' if opts.prefer_closest_numa_nodes else 'plain  '}: "
                      f"reference {slow * 1e3:9.1f} ms, fast {fast * 1e3:7.3f} ms, "
                      f"speed-up x{slow / fast:,.0f}")
                per_combo = slow / combos
    combos8 = 255**4
    mis8 = full_providers(8, 4, False)
    t8 = cost("best-effort", mis8, ids8, None, plain, min_time)
    print(f"  8 nodes x 4 res x 255 hints: {combos8:,} combinations; at the reference's "
          f"{per_combo * 1e9:.0f} ns per combination that is ~{combos8 * per_combo:,.0f} s, "
          f"vs {t8 * 1e3:.2f} ms (x{combos8 * per_combo / t8:,.0f}, extrapolated)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
