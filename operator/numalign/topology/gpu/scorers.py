"""Scorers: what makes one GPU allocation better than another.

A scorer gives two costs, and the allocator minimises, lexicographically,

1. tightness: the sum over requests of ``anchor_cost`` of the smallest group holding the
   request's devices;
2. fragmentation: the sum of ``group_weight`` over the groups (of every resource used)
   that were whole (all devices free) before and are touched by the allocation.

Both are functions of the devices chosen and the state before, so any two allocations
compare the same way whatever order their requests were placed in (the brute force in
the tests uses :func:`score_allocation` directly). Ties go to the lowest device indices.

``pack`` (the default) packs each request into the tightest group that fits and then
breaks as few whole groups as possible, weighted by their size, keeping large groups
whole for later requests. ``spread`` does the opposite: it uses the widest group and
touches as many whole groups as it can (e.g. to spread PCIe or host-memory bandwidth).
Register another with :func:`register_scorer`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping

from ..errors import TopologyError
from .groups import GroupTree, Node


class Scorer(ABC):
    """Costs of an allocation; lower is better. Subclass and :func:`register_scorer`."""

    name: str = ""

    @abstractmethod
    def anchor_cost(self, tree: GroupTree, node: Node) -> int:
        """Cost of a request whose devices' smallest common group is ``node``."""

    @abstractmethod
    def group_weight(self, tree: GroupTree, node: Node) -> int:
        """Cost of touching ``node`` (an inner node) while all its devices were free."""


class PackScorer(Scorer):
    """Tightest group first, then break as few (and as small) whole groups as possible."""

    name = "pack"

    def anchor_cost(self, tree: GroupTree, node: Node) -> int:
        return node.size

    def group_weight(self, tree: GroupTree, node: Node) -> int:
        return node.size


class SpreadScorer(Scorer):
    """Widest group first, then touch as many (and as large) whole groups as possible."""

    name = "spread"

    def anchor_cost(self, tree: GroupTree, node: Node) -> int:
        return -node.size

    def group_weight(self, tree: GroupTree, node: Node) -> int:
        return -node.size


SCORERS: dict[str, Scorer] = {}


def register_scorer(scorer: Scorer) -> None:
    """Make ``scorer`` available by its name (replacing one of the same name)."""
    if not scorer.name:
        raise ValueError("a scorer needs a name")
    SCORERS[scorer.name] = scorer


def get_scorer(scorer: str | Scorer) -> Scorer:
    if isinstance(scorer, Scorer):
        return scorer
    try:
        return SCORERS[scorer]
    except KeyError:
        raise TopologyError("scorer", f"unknown scorer {scorer!r}; known: "
                            f"{', '.join(sorted(SCORERS))}") from None


register_scorer(PackScorer())
register_scorer(SpreadScorer())

Score = tuple[int, int]


def touched_cost(scorer: Scorer, tree: GroupTree, free_before: int, used: int) -> int:
    """Sum of ``group_weight`` over inner nodes all free before and touched by ``used``."""
    total = 0
    for node in tree.nodes:
        m = node.mask
        if node.children and used & m and free_before & m == m:
            total += scorer.group_weight(tree, node)
    return total


def score_allocation(scorer: Scorer, trees: Mapping[str, GroupTree],
                     free_before: Mapping[str, int],
                     primary: Iterable[tuple[str, int]],
                     extra: Iterable[tuple[str, int]] = ()) -> Score:
    """The (tightness, fragmentation) score of an allocation.

    ``primary``: (resource, leaf bitmask) of each request's GPUs; ``extra``: the
    ``withResource`` devices (they count for fragmentation only).
    """
    tight = 0
    used: dict[str, int] = {}
    for res, bits in primary:
        tight += scorer.anchor_cost(trees[res], trees[res].lca(bits))
        used[res] = used.get(res, 0) | bits
    for res, bits in extra:
        used[res] = used.get(res, 0) | bits
    frag = sum(touched_cost(scorer, trees[res], free_before[res], bits)
               for res, bits in used.items())
    return (tight, frag)
