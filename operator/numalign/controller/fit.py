"""Which nodes cannot fit a pod, judged from their NodeTopology status.

A coarse, fast check (no provider hints): the pod's effective request (the engine's
pod-scope rule) against what each NUMA zone reports ``available``. Under
``single-numa-node`` one zone must hold every requested resource that the zones
report; otherwise the zones' sum must. Resources that no zone reports (or nodes
without zones) are not judged: the node is not avoided. The policy is the one the node
applies (:func:`numalign.api.effective.effective_policy`): on a kubelet-managed node its
kubelet's, whatever numalign resolved for the pod.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from numalign.api.effective import NodePolicy, effective_policy
from numalign.topology.errors import TopologyError
from numalign.topology.pod import pod_from_dict
from numalign.topology.policies import get_policy
from numalign.topology.quantity import parse_quantity

from . import cache, metrics


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """The pod's effective request per resource, by the engine's pod-scope rule
    (:meth:`numalign.topology.pod.Pod.effective_requests`: init containers with the
    sidecars started before them). A pod the engine cannot read (a malformed quantity,
    say) gives nothing: it is not judged, and no node is avoided for it."""
    meta = dict(pod.get("metadata") or {})
    # At admission a controller's pod has only generateName; the engine wants a name.
    meta.setdefault("name", meta.get("generateName") or "pod")
    try:
        return pod_from_dict({**pod, "metadata": meta}).effective_requests()
    except TopologyError:
        return {}


def node_fits(requests: Mapping[str, Decimal], zones: list[Mapping[str, Any]],
              single_zone: bool) -> bool | None:
    """True/False, or None when the zones say nothing about the requested resources."""
    avail: list[dict[str, Decimal]] = []
    for z in zones:
        a: dict[str, Decimal] = {}
        for k, v in ((z.get("available") if isinstance(z, Mapping) else None) or {}).items():
            try:
                a[str(k)] = parse_quantity(v)
            except (ValueError, ArithmeticError):
                continue
        avail.append(a)
    known = {k for a in avail for k in a}
    judged = {k: v for k, v in requests.items() if k in known}
    if not judged:
        return None
    if single_zone:
        return any(all(a.get(k, Decimal(0)) >= v for k, v in judged.items()) for a in avail)
    return all(sum((a.get(k, Decimal(0)) for a in avail), Decimal(0)) >= v
               for k, v in judged.items())


def unfit_nodes(pod: Mapping[str, Any], skip: list[str] | None = None) -> list[str]:
    """Names of nodes whose NodeTopology shows they cannot fit ``pod`` now."""
    start = time.perf_counter()
    try:
        requests = pod_requests(pod)
        if not requests:
            return []
        out: list[str] = []
        for nt in cache.node_topologies():
            name = str((nt.get("metadata") or {}).get("name", ""))
            if not name or name in (skip or []):
                continue
            policy = effective_policy(pod, NodePolicy.from_nodetopology(nt)).resolved.policy
            zones = (nt.get("status") or {}).get("zones") or []
            if node_fits(requests, list(zones), get_policy(policy or "none").single_numa) \
                    is False:
                out.append(name)
        return sorted(out)
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
