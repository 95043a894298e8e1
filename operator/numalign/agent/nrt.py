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
* only NUMA nodes 0..63: scheduler-plugins reads a zone's id from its name
  (``numanode.NameToID``) into a 64-entry table and the kubelet's NUMA bitmask holds 64
  ids, so it skips ids above 64 and fails on 64 itself; a zone with id >= 64 (and costs
  naming one) is left out (:func:`omitted_zones` lists them, the agent logs it);
* top-level ``attributes`` as scheduler-plugins (``nodeconfig``) and NFD read them:
  ``topologyManagerPolicy`` (``single-numa-node``, ``restricted``, ``best-effort``,
  ``none``, or any policy registered in ``numalign.topology.policies``),
  ``topologyManagerScope`` (``container``, ``pod``),
  ``topologyManagerMaxNUMANodes`` (the policy option ``max-allowable-numa-nodes`` the
  node's admission applies: given, else numalign's default 64), and, when options are
  given, ``topologyManagerPolicyOptions`` in the kubelet's flag syntax
  (``max-allowable-numa-nodes=16,prefer-closest-numa-nodes=true``);
* with ``fingerprint`` (agent/podfingerprint.py): ``nodeTopologyPodsFingerprint`` and
  ``nodeTopologyPodsFingerprintMethod``, which the plugin's reserve-aware cache needs to
  resynchronise a node it marked dirty;
* the deprecated ``topologyPolicies`` list (``SingleNUMANodeContainerLevel`` ...) older
  plugin versions read, unless ``legacy_policies=False`` (or the policy is a registered
  one of numalign's own, which that list has no value for).

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from numalign.api.errors import WireError
from numalign.api.kube import ApiError, Kube, q
from numalign.api.resolved import parse_options
from numalign.topology.policies import known as known_policy
from numalign.topology.policies import names as policy_names
from numalign.topology.policyconfig import SCOPES
from numalign.topology.quantity import format_bytes, parse_cpulist, quantity_bytes

from . import podfingerprint as pfp

GROUP = "topology.node.k8s.io"
VERSION = "v1alpha2"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "NodeResourceTopology"
PLURAL = "noderesourcetopologies"
BASE_PATH = f"/apis/{GROUP}/{VERSION}/{PLURAL}"

ZONE_TYPE = "Node"
POLICY_ATTRIBUTE = "topologyManagerPolicy"
SCOPE_ATTRIBUTE = "topologyManagerScope"
MAX_NUMA_NODES_ATTRIBUTE = "topologyManagerMaxNUMANodes"
POLICY_OPTIONS_ATTRIBUTE = "topologyManagerPolicyOptions"
# scheduler-plugins' maxNUMAId: zone ids it can hold (0..63)
MAX_ZONE_ID = 63

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


def omitted_zones(status: Mapping[str, Any]) -> list[int]:
    """The NUMA node ids of ``status`` a NodeResourceTopology leaves out (ids >= 64)."""
    return sorted(z["id"] for z in status.get("zones") or []
                  if isinstance(z, Mapping) and isinstance(z.get("id"), int)
                  and z["id"] > MAX_ZONE_ID)


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
              labels: Mapping[str, str] | None = None,
              legacy_policies: bool = True) -> JSON:
    """The NodeResourceTopology object of ``node`` from its NodeTopology ``status``
    (zones, distances) and ``spec`` (the node default policy, scope and options).

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
    kept = [zid for zid in ids if 0 <= zid <= MAX_ZONE_ID]
    for i, (zid, z) in enumerate(zip(ids, zones_raw, strict=True)):
        if zid not in kept:
            continue
        zone: JSON = {"name": zone_name(zid), "type": ZONE_TYPE,
                      "resources": _resources(z, f"status.zones[{i}]")}
        costs = _costs(zid, distances, kept)
        if costs:
            zone["costs"] = costs
        zones.append(zone)
    policy = str((spec or {}).get("policy") or "none")
    scope = str((spec or {}).get("scope") or "container")
    if not known_policy(policy):
        raise NrtError(f"spec.policy: {policy!r} is not one of {', '.join(policy_names())}")
    if scope not in SCOPES:
        raise NrtError(f"spec.scope: {scope!r} is not one of {', '.join(SCOPES)}")
    try:
        options = parse_options((spec or {}).get("options"), "spec.options")
    except WireError as e:
        raise NrtError(str(e)) from None
    attributes = [{"name": POLICY_ATTRIBUTE, "value": policy},
                  {"name": SCOPE_ATTRIBUTE, "value": scope},
                  {"name": MAX_NUMA_NODES_ATTRIBUTE,
                   "value": str(options.engine.max_allowable_numa_nodes)}]
    if options.given:
        attributes.append({"name": POLICY_OPTIONS_ATTRIBUTE, "value": ",".join(
            f"{k}={v}" for k, v in sorted(options.given.items()))})
    meta: JSON = {"name": node}
    if labels:
        meta["labels"] = dict(labels)
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node,
                                    "uid": node_uid}]
    out: JSON = {"apiVersion": API_VERSION, "kind": KIND, "metadata": meta}
    if legacy_policies and (policy, scope) in _LEGACY:
        out["topologyPolicies"] = [_LEGACY[(policy, scope)]]
    out["attributes"] = attributes
    out["zones"] = zones
    return out


@dataclass(frozen=True)
class NrtOptions:
    """How the agent publishes NodeResourceTopology: the pod fingerprint's method and the
    scheduler's pod informer mode it must agree with (agent/podfingerprint.py), and
    whether to write the deprecated ``topologyPolicies``."""

    method: str = pfp.METHOD_EXCLUSIVE
    informer: str = pfp.INFORMER_DEDICATED
    legacy_policies: bool = True


def resource_names(obj: Mapping[str, Any]) -> set[str]:
    """The resource names a NodeResourceTopology lists in any zone."""
    return {str(r.get("name")) for z in obj.get("zones") or []
            for r in z.get("resources") or []}


def add_fingerprint(obj: JSON, pods: Iterable[pfp.PodEntry], options: NrtOptions) -> str:
    """Add ``nodeTopologyPodsFingerprint`` (of ``pods`` as ``options`` select them) and
    ``nodeTopologyPodsFingerprintMethod`` to ``obj``'s attributes; returns the fingerprint."""
    sign = pfp.fingerprint(pods, options.method, resource_names(obj), options.informer)
    attrs = [a for a in obj.get("attributes") or []
             if a.get("name") not in (pfp.ATTRIBUTE, pfp.ATTRIBUTE_METHOD)]
    obj["attributes"] = [*attrs, {"name": pfp.ATTRIBUTE, "value": sign},
                         {"name": pfp.ATTRIBUTE_METHOD, "value": options.method}]
    return sign


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
