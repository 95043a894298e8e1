"""NodeResourceTopology export: a node's NodeTopology as the ``topology.node.k8s.io/v1alpha2``
NodeResourceTopology (NRT) object that topology-aware schedulers read (scheduler-plugins'
NodeResourceTopologyMatch, the same API NFD's topology-updater publishes), so that a
cluster running numalign can filter and score nodes by free resources per NUMA node.

The conversion (``build_nrt``, pure) follows the conventions those readers expect:

* one zone per NUMA node, ``type: Node``, ``name: node-<id>``;
* zone ``resources``: ``name``, ``capacity``, ``allocatable``, ``available``, each a
  quantity string (CPUs as counts, memory and hugepages as bytes in binary units,
  devices with a NUMA node as counts), from the zone's ``capacity`` / ``allocatable`` /
  ``available`` (missing ones derived from the zone's cpus, memory and hugepages);
* zone ``costs``: the NUMA distances, ``name: node-<id>`` -> ``value`` (self included);
* top-level ``attributes`` ``topologyManagerPolicy`` (``single-numa-node``,
  ``restricted``, ``best-effort``, ``none``) and ``topologyManagerScope``
  (``container``, ``pod``), and the deprecated ``topologyPolicies`` list
  (``SingleNUMANodeContainerLevel`` ...) older plugin versions read.

The policy and scope are the node's default (``NodeTopology.spec``). numalign also admits
pods under per-pod or per-namespace policies; the scheduler plugin only knows one policy
per node, so pods whose policy differs from the node default are filtered by the default.

How it is called: with ``numalign agent --publish-nrt`` the agent's publisher
(``publish.Publisher.write_nrt``) does this after each successful NodeTopology status
write of node ``name`` (so NRT writes are coalesced like the status writes)::

    from numalign.agent import nrt

    obj = nrt.build_nrt(name, status, spec=state_spec, node_uid=node_uid)
    await nrt.publish_nrt(kube, obj)          # kube: numalign.api.kube.Kube

where ``status`` is the dict ``publish.build_status`` just wrote and ``spec`` the node's
``NodeTopology.spec`` (``{"policy", "scope", ...}``; None means ``none``/``container``).
``node_uid`` (optional) makes the Node the NRT's owner so it is garbage-collected with
the node. It creates the object, or replaces it when it exists (retrying on
conflicts). The agent's RBAC needs ``get``, ``create`` and ``update`` on
``noderesourcetopologies.topology.node.k8s.io``, and the CRD must be installed
(``config/nrt/crd.yaml`` where NFD or the scheduler plugin did not install it).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

from numalign.api.kube import ApiError, Kube, q
from numalign.topology.policy import POLICIES, SCOPES
from numalign.topology.quantity import format_bytes, parse_cpulist, quantity_bytes

GROUP = "topology.node.k8s.io"
VERSION = "v1alpha2"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "NodeResourceTopology"
PLURAL = "noderesourcetopologies"
BASE_PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"

ZONE_TYPE = "Node"
POLICY_ATTRIBUTE = "topologyManagerPolicy"
SCOPE_ATTRIBUTE = "topologyManagerScope"

# The deprecated topologyPolicies value per (policy, scope).
_LEGACY: dict[tuple[str, str], str] = {
    ("single-numa-node", "container"): "SingleNUMANodeContainerLevel",
    ("single-numa-node", "pod"): "SingleNUMANodePodLevel",
    ("restricted", "container"): "RestrictedContainerLevel",
    ("restricted", "pod"): "RestrictedPodLevel",
    ("best-effort", "container"): "BestEffortContainerLevel",
    ("best-effort", "pod"): "BestEffortPodLevel",
    ("none", "container"): "None",
    ("none", "pod"): "None",
}

JSON = dict[str, Any]


class NrtError(ValueError):
    """NodeTopology data that cannot be turned into a NodeResourceTopology."""


def zone_name(numa_id: int | str) -> str:
    return f"node-{numa_id}"


def _is_bytes(resource: str) -> bool:
    return resource == "memory" or resource.startswith("hugepages-")


def quantity_string(resource: str, value: Any) -> str:
    """A resource amount as a Kubernetes quantity string: memory and hugepages in binary
    units ("32Gi"), counts as integers ("16")."""
    if isinstance(value, bool):
        raise NrtError(f"{resource}: {value!r} is not a quantity")
    try:
        if _is_bytes(resource):
            return format_bytes(quantity_bytes(value))
        if isinstance(value, int):
            return str(value)
        text = str(value).strip()
        if not text:
            raise ValueError("empty")
        quantity_bytes(text)  # validates the syntax
        return text
    except (TypeError, ValueError) as e:
        raise NrtError(f"{resource}: {value!r} is not a quantity ({e})") from None


def _derived_capacity(zone: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"cpu": len(parse_cpulist(str(zone.get("cpus") or "")))}
    if zone.get("memory") is not None:
        out["memory"] = zone["memory"]
    for size, total in (zone.get("hugepages") or {}).items():
        out[f"hugepages-{size}"] = total
    return out


def _resources(zone: Mapping[str, Any], where: str) -> list[JSON]:
    capacity = zone.get("capacity") or _derived_capacity(zone)
    allocatable = zone.get("allocatable") or capacity
    available = zone.get("available") or allocatable
    for label, m in (("capacity", capacity), ("allocatable", allocatable),
                     ("available", available)):
        if not isinstance(m, Mapping):
            raise NrtError(f"{where}.{label}: must map a resource name to a quantity")
    out: list[JSON] = []
    for name in sorted(capacity):
        cap = capacity[name]
        alloc = allocatable.get(name, cap)
        avail = available.get(name, alloc)
        try:
            out.append({"name": str(name), "capacity": quantity_string(name, cap),
                        "allocatable": quantity_string(name, alloc),
                        "available": quantity_string(name, avail)})
        except NrtError as e:
            raise NrtError(f"{where}.{e}") from None
    return out


def _costs(zone_id: int, distances: Mapping[str, Any] | None, ids: list[int]) -> list[JSON]:
    if not distances:
        return []
    row = distances.get(str(zone_id))
    if not isinstance(row, Mapping):
        return []
    out: list[JSON] = []
    for other in ids:
        v = row.get(str(other))
        if isinstance(v, int) and not isinstance(v, bool):
            out.append({"name": zone_name(other), "value": v})
    return out


def build_nrt(node: str, status: Mapping[str, Any], spec: Mapping[str, Any] | None = None, *,
              node_uid: str | None = None,
              labels: Mapping[str, str] | None = None) -> JSON:
    """The NodeResourceTopology object of ``node`` from its NodeTopology ``status``
    (zones, distances) and ``spec`` (the node default policy and scope).

    Raises NrtError when the status has no zones or a zone is malformed."""
    zones_raw = status.get("zones")
    if not isinstance(zones_raw, list) or not zones_raw:
        raise NrtError("status.zones: no zones (the agent has not published the node yet)")
    ids: list[int] = []
    for i, z in enumerate(zones_raw):
        zid = z.get("id") if isinstance(z, Mapping) else None
        if not isinstance(zid, int) or isinstance(zid, bool):
            raise NrtError(f"status.zones[{i}].id: must be an integer")
        ids.append(zid)
    distances = status.get("distances")
    if distances is not None and not isinstance(distances, Mapping):
        raise NrtError("status.distances: must map a NUMA node id to its row")
    zones: list[JSON] = []
    for i, (zid, z) in enumerate(zip(ids, zones_raw, strict=True)):
        zone: JSON = {"name": zone_name(zid), "type": ZONE_TYPE,
                      "resources": _resources(z, f"status.zones[{i}]")}
        costs = _costs(zid, distances, ids)
        if costs:
            zone["costs"] = costs
        zones.append(zone)
    policy = str((spec or {}).get("policy") or "none")
    scope = str((spec or {}).get("scope") or "container")
    if policy not in POLICIES:
        raise NrtError(f"spec.policy: {policy!r} is not one of {', '.join(POLICIES)}")
    if scope not in SCOPES:
        raise NrtError(f"spec.scope: {scope!r} is not one of {', '.join(SCOPES)}")
    meta: JSON = {"name": node}
    if labels:
        meta["labels"] = dict(labels)
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node,
                                    "uid": node_uid}]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": meta,
        "topologyPolicies": [_LEGACY[(policy, scope)]],
        "attributes": [{"name": POLICY_ATTRIBUTE, "value": policy},
                       {"name": SCOPE_ATTRIBUTE, "value": scope}],
        "zones": zones,
    }


def nrt_path(name: str) -> str:
    return f"{BASE_PATH}/{q(name)}"


def _for_replace(obj: Mapping[str, Any], existing: Mapping[str, Any]) -> JSON:
    """``obj`` carrying the existing object's resourceVersion (optimistic concurrency),
    keeping labels and annotations others put there."""
    body = copy.deepcopy(dict(obj))
    meta = dict(body.get("metadata") or {})
    old = existing.get("metadata") or {}
    meta["resourceVersion"] = old.get("resourceVersion")
    for key in ("labels", "annotations"):
        merged = dict(old.get(key) or {})
        merged.update(meta.get(key) or {})
        if merged:
            meta[key] = merged
    if "ownerReferences" not in meta and old.get("ownerReferences"):
        meta["ownerReferences"] = old["ownerReferences"]
    body["metadata"] = meta
    return body


async def publish_nrt(kube: Kube, obj: Mapping[str, Any], *, attempts: int = 5) -> JSON:
    """Create the NodeResourceTopology ``obj``, or replace it when it exists; retried on
    conflicts (someone else wrote it in between). Returns the stored object. Raises
    ``ApiError`` (404: the CRD is not installed; 403: RBAC)."""
    name = str((obj.get("metadata") or {}).get("name") or "")
    if not name:
        raise NrtError("metadata.name: is required")
    for attempt in range(attempts):
        try:
            existing = await kube.get(nrt_path(name))
        except ApiError as e:
            if e.status != 404:
                raise
            try:
                return await kube.create(BASE_PATH, dict(obj))
            except ApiError as ce:
                if ce.status == 409 and attempt + 1 < attempts:
                    continue
                raise
        try:
            return await kube.put(nrt_path(name), _for_replace(obj, existing))
        except ApiError as e:
            if e.status == 409 and attempt + 1 < attempts:
                await asyncio.sleep(0.05 * (attempt + 1))
                continue
            raise
    raise AssertionError("unreachable")
