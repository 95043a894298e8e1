"""Which nodes cannot fit a pod, judged from their NodeTopology objects (pure).

A coarse, fast check (no provider hints): the pod's effective request (the engine's
pod-scope rule) against what each NUMA zone reports ``available``. Under
``single-numa-node`` one zone must hold every requested resource that the zones
report; otherwise the zones' sum must. Resources that no zone reports (or nodes
without zones) are not judged: the node is not avoided. The policy is the one the node
applies (:func:`numalign.api.effective.effective_policy`): on a kubelet-managed node its
kubelet's, whatever numalign resolved for the pod.

The operator judges the NodeTopologies it caches (``numalign.controller.avoidance``);
``kubectl numalign why`` those it lists.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from typing import Any

from numalign.api.effective import NodePolicy, effective_policy
from numalign.topology.errors import TopologyError
from numalign.topology.pod import pod_from_dict
from numalign.topology.quantity import parse_quantity


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
        raw = z.get("available") if isinstance(z, Mapping) else None
        for k, v in (raw.items() if isinstance(raw, Mapping) else ()):
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


def unfit_among(pod: Mapping[str, Any], node_topologies: Iterable[Mapping[str, Any]],
                skip: Iterable[str] = ()) -> list[str]:
    """Names of the nodes (of ``node_topologies``) whose status shows they cannot fit
    ``pod`` now, sorted."""
    requests = pod_requests(pod)
    if not requests:
        return []
    skipped = set(skip)
    out: list[str] = []
    for nt in node_topologies:
        name = str((nt.get("metadata") or {}).get("name", ""))
        if not name or name in skipped:
            continue
        zones = (nt.get("status") or {}).get("zones")
        single = effective_policy(pod, NodePolicy.from_nodetopology(nt)).policy.single_numa
        if isinstance(zones, list) and node_fits(requests, zones, single) is False:
            out.append(name)
    return sorted(out)
