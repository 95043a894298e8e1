"""``single-numa-node``: the kubelet's ``filterSingleNumaHints`` keeps only preferred hints
that are nil or exactly one NUMA node wide (a resource may be left with none); a merged
hint of every NUMA node is reported as no affinity; only a preferred hint is admitted;
``prefer-closest-numa-nodes`` has nothing to choose between."""

from __future__ import annotations

from numalign.topology.hints import NumaMask, TopologyHint
from numalign.topology.policyconfig import POLICY_SINGLE_NUMA_NODE

from .base import AlignmentPolicy


class SingleNumaNodePolicy(AlignmentPolicy):
    name = POLICY_SINGLE_NUMA_NODE
    single_numa = True
    closest_applies = False

    def keep_hints(self, hints: tuple[TopologyHint, ...]) -> tuple[TopologyHint, ...]:
        return tuple(h for h in hints
                     if h.preferred and (h.mask is None or h.mask.bit_count() == 1))

    def report(self, hint: TopologyHint, all_nodes: NumaMask) -> TopologyHint:
        return TopologyHint(None, hint.preferred) if hint.mask == all_nodes else hint

    def explain_merge(self, reported_no_affinity: bool) -> str:
        why = (" Under single-numa-node only preferred hints one NUMA node wide (or with no "
               "preference) take part.")
        if reported_no_affinity:
            why += (" The merge gave every NUMA node, which single-numa-node reports as no "
                    "affinity.")
        return why
