"""The reachable non-preferred merged masks of a Topology Manager merge (:mod:`.merge`):
the set of ANDs of one mask per resource, without walking the cross product.

It is restricted first to the nodes that every resource can reach at all. On a small
universe (<= 12 nodes after that) it is computed exactly by superset-sum (zeta)
transforms: the number of combinations whose AND contains T is the product over
resources of the number of masks containing T, and Moebius inversion gives the
combinations whose AND is exactly T, in O(resources * n * 2^n) whatever the list sizes.
On larger universes a layered search over distinct partial ANDs runs, pruned by a width
threshold: the comparison wants width == B first, so only partial ANDs at least B wide
are kept first (AND only narrows), and lower thresholds are tried only when no mask of
width B is reachable.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, Sequence

from numalign.topology.hints import TopologyHint

# Largest universe (NUMA nodes every resource can reach) handled by the zeta transform.
ZETA_MAX_BITS = 18


def reachable_non_preferred(
    lists: Sequence[Sequence[TopologyHint]],
    default: int,
    bnp: int,
    stats: dict[str, int],
) -> list[int]:
    """Enough of the reachable non-empty merged masks to contain the best one under
    ``key`` (all of them on small universes). Called only when no preferred merged
    mask is non-empty, so every non-empty reachable mask is a non-preferred hint."""
    effective: list[set[int]] = []
    universe = default
    for hints in lists:
        s = {(default if h.mask is None else h.mask) & default for h in hints}
        s.discard(0)
        if not s:
            return []
        union = 0
        for m in s:
            union |= m
        universe &= union
        effective.append(s)
    if not universe:
        return []
    # Every merged mask lies inside `universe`; drop the rest of every mask.
    reduced: list[list[int]] = []
    for s in effective:
        r = {m & universe for m in s}
        r.discard(0)
        if not r:
            return []
        reduced.append(sorted(r))
    n = universe.bit_count()
    stats["universe"] = n
    classes = _node_classes(reduced, universe)
    stats["node_classes"] = len(classes)
    product = 1
    for masks in reduced:
        product *= len(masks)
        if product > 1 << 40:
            break
    zeta_cost = (len(reduced) + 1) * len(classes) * (1 << len(classes))
    if _use_zeta(len(classes), len(reduced), product):
        stats["method_zeta"] = 1
        return _reachable_zeta(reduced, classes)
    budget = zeta_cost // 2 if len(classes) <= ZETA_MAX_BITS else None
    try:
        got = _reachable_layered(reduced, universe, bnp, stats, budget)
        stats["method_layered"] = 1
        return got
    except _OverBudget:
        stats["method_zeta"] = 1
        return _reachable_zeta(reduced, classes)


def _node_classes(lists: list[list[int]], universe: int) -> list[int]:
    """Nodes that lie in exactly the same masks of every resource always go together in
    a merged mask; group them (as masks), lowest node first. Refines the partition by
    each mask in turn and stops as soon as every node is alone."""
    classes = [universe]
    alone = universe.bit_count()
    for masks in lists:
        for m in masks:
            if len(classes) == alone:
                return sorted(classes, key=lambda c: c & -c)
            split: list[int] = []
            for c in classes:
                inside = c & m
                if inside and inside != c:
                    split.append(inside)
                    split.append(c ^ inside)
                else:
                    split.append(c)
            classes = split
    return sorted(classes, key=lambda c: c & -c)


def _low_bits(mask: int) -> Iterator[int]:
    while mask:
        low = mask & -mask
        yield low
        mask ^= low


def _use_zeta(n: int, resources: int, product: int) -> bool:
    """Zeta transforms cost about (resources + 1) * n * 2**n (n: node classes); the
    layered search at most the product of the list sizes, usually far less."""
    return n <= ZETA_MAX_BITS and product > 4 * (resources + 1) * n * (1 << n)


class _OverBudget(Exception):
    pass


def _superset_sums(g: list[int], n: int, op: Callable[[int, int], int]) -> None:
    """In place: g[T] = op-fold of g[U] over U containing T (op = add), or its inverse
    (op = sub)."""
    size = 1 << n
    for b in range(n):
        step = 1 << b
        span = step << 1
        if step <= size // span:
            # step strided slices: indices k + j*span (bit b clear) and k + step + j*span
            for k in range(step):
                g[k:size:span] = map(op, g[k:size:span], g[k + step : size : span])
        else:
            for base in range(0, size, span):
                hi = base + step
                g[base:hi] = map(op, g[base:hi], g[hi : hi + step])


def _reachable_zeta(lists: list[list[int]], classes: list[int]) -> list[int]:
    n = len(classes)
    size = 1 << n

    # Byte tables: compressed bits of the classes met by each byte value of a mask.
    chunk_tables: list[tuple[int, list[int]]] = []
    whole = 0
    for c in classes:
        whole |= c
    for chunk in range((whole.bit_length() + 7) // 8):
        part = (whole >> (8 * chunk)) & 0xFF
        if not part:
            continue
        table = [0] * 256
        for v in range(1, 256):
            low = v & -v
            node = 1 << (8 * chunk + low.bit_length() - 1)
            bit = 0
            if part & low:
                for k, c in enumerate(classes):
                    if c & node:
                        bit = 1 << k
                        break
            table[v] = table[v ^ low] | bit
        chunk_tables.append((8 * chunk, table))

    def compress(mask: int) -> int:
        out = 0
        for shift, table in chunk_tables:
            out |= table[(mask >> shift) & 0xFF]
        return out

    total: list[int] | None = None
    for masks in lists:
        g = [0] * size
        for m in masks:
            g[compress(m)] = 1
        _superset_sums(g, n, operator.add)
        total = g if total is None else list(map(operator.mul, total, g))
    assert total is not None
    _superset_sums(total, n, operator.sub)
    out: list[int] = []
    for t in range(1, size):
        if total[t] > 0:
            m = 0
            x = t
            while x:
                low = x & -x
                m |= classes[low.bit_length() - 1]
                x ^= low
            out.append(m)
    return out


class _Meter:
    """Counts (state, mask) pairs looked at; raises _OverBudget past the budget."""

    def __init__(self, budget: int | None) -> None:
        self.budget = budget
        self.spent = 0

    def spend(self, work: int) -> None:
        self.spent += work
        if self.budget is not None and self.spent > self.budget:
            raise _OverBudget


class _Layer:
    """One resource's masks, with an index node bit -> masks holding that node."""

    # Up to this many (state, mask) pairs a step ANDs every pair; past it, it goes
    # through the index.
    NAIVE_PAIRS = 40_000

    def __init__(self, masks: list[int], universe: int) -> None:
        self.full = universe in masks
        self.masks = [m for m in masks if m != universe]
        self.mask_set = set(self.masks)
        self._buckets: dict[int, set[int]] | None = None

    def buckets(self) -> dict[int, set[int]]:
        if self._buckets is None:
            b: dict[int, set[int]] = {}
            for m in self.masks:
                x = m
                while x:
                    low = x & -x
                    got = b.get(low)
                    if got is None:
                        b[low] = {m}
                    else:
                        got.add(m)
                    x ^= low
            self._buckets = b
        return self._buckets

    def step(self, states: set[int], threshold: int, meter: _Meter) -> set[int]:
        """{s & m} over states s and this resource's masks m, keeping results at least
        ``threshold`` nodes wide."""
        out: set[int] = set(states) if self.full else set()
        masks = self.masks
        if not masks:
            return out
        if len(states) * len(masks) <= self.NAIVE_PAIRS:
            meter.spend(len(states) * len(masks))
            out.update(
                x for s in states for m in masks if (x := s & m).bit_count() >= threshold
            )
            return out
        buckets = self.buckets()
        mask_set = self.mask_set
        empty: set[int] = set()
        for s in states:
            if s in out:
                if s.bit_count() == threshold:
                    continue
            elif s in mask_set:
                out.add(s)
                if s.bit_count() == threshold:
                    continue
            groups: list[set[int]] = []
            x = s
            while x:
                low = x & -x
                groups.append(buckets.get(low, empty))
                x ^= low
            if s.bit_count() == threshold:
                # Only s itself can come out: is there a mask holding all of s?
                groups.sort(key=len)
                common = set(groups[0])
                for g in groups[1:]:
                    if not common:
                        break
                    common &= g
                if common:
                    out.add(s)
                continue
            seen: set[int] = set().union(*groups)
            meter.spend(len(seen) + len(groups))
            out.update(x for m in seen if (x := s & m).bit_count() >= threshold)
        return out


def _reachable_layered(
    lists: list[list[int]],
    universe: int,
    bnp: int,
    stats: dict[str, int],
    budget: int | None = None,
) -> list[int]:
    ordered: list[list[int]] = sorted(lists, key=len)
    layers = [_Layer(m, universe) for m in ordered]
    meter = _Meter(budget)

    def reach(threshold: int) -> set[int]:
        states = {universe} if universe.bit_count() >= threshold else set()
        for layer in layers:
            if not states:
                break
            states = layer.step(states, threshold, meter)
            stats["states"] = stats.get("states", 0) + len(states)
        return states

    if bnp <= 1:
        return list(reach(1))
    wide = reach(bnp)  # every reachable mask at least bnp wide
    if any(m.bit_count() == bnp for m in wide):
        return [m for m in wide if m.bit_count() == bnp]
    for threshold in range(bnp - 1, 0, -1):
        got = [m for m in reach(threshold) if m.bit_count() == threshold]
        if got:
            return got  # widest reachable below bnp
    return list(wide)  # only masks wider than bnp are reachable
