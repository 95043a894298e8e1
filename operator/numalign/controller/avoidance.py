"""Which nodes cannot fit a pod (the judgement is ``numalign.api.zonefit``'s, on the
NodeTopologies the operator caches), and the nodes a redeployed pod avoids."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from numalign.api.zonefit import unfit_among

from . import cache, metrics


def unfit_nodes(pod: Mapping[str, Any], skip: list[str] | None = None) -> list[str]:
    """Names of nodes whose NodeTopology shows they cannot fit ``pod`` now."""
    start = time.perf_counter()
    try:
        return unfit_among(pod, cache.node_topologies(), skip or [])
    finally:
        metrics.FIT_LATENCY.observe(time.perf_counter() - start)


def selectable_nodes(pod: Mapping[str, Any]) -> set[str]:
    """Names of the Nodes the pod's ``nodeSelector`` allows (its required node affinity
    is not evaluated: a superset)."""
    selector = (pod.get("spec") or {}).get("nodeSelector") or {}
    return {str(n["metadata"]["name"]) for n in cache.nodes()
            if all((n["metadata"].get("labels") or {}).get(str(k)) == str(v)
                   for k, v in selector.items())}


def keep_a_candidate(pod: Mapping[str, Any], avoid: list[str]) -> list[str]:
    """The nodes of ``avoid`` (newest rejection first) that can be avoided while some node
    the pod may select remains: when every candidate rejected the workload, the one that
    rejected it longest ago is let back in. Avoiding all of them would leave the
    replacement Pending for good, its rejections never reaching ``maxAttempts``: no
    RedeployGaveUp, no scheduling gate, no Warning -- a silent stall."""
    candidates = selectable_nodes(pod)
    kept: list[str] = []
    for node in avoid:
        if node in kept:
            continue
        if candidates and not candidates - set(kept) - {node}:
            continue  # the last candidate left: let it be tried again
        kept.append(node)
    return kept


def with_unfit(pod: Mapping[str, Any], avoid: list[str]) -> list[str]:
    """``avoid`` (newest rejection first, bounded by :func:`keep_a_candidate`) plus the
    nodes that cannot fit ``pod`` now -- unless that would leave none of the nodes the pod
    may select. The exclusion is written into the replacement's required node affinity
    for good: excluding every node that is merely full now would leave it Pending even
    after room frees up, and its rejections could never reach ``maxAttempts`` (no
    Warning, no status). With nothing that fits, the replacement only avoids the nodes
    that rejected the workload."""
    avoid = keep_a_candidate(pod, avoid)
    unfit = set(unfit_nodes(pod, avoid))
    if not unfit:
        return sorted(avoid)
    candidates = selectable_nodes(pod) - set(avoid)
    if candidates and candidates <= unfit:
        return sorted(avoid)
    return sorted(set(avoid) | unfit)
