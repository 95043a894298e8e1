"""In-memory views of what the handlers read often, fed by watch events.

Resolving a pod, redeploying one and reconciling statuses read TopologyPolicies,
NodeTopologies, Node labels, namespace labels, the redeploy records and the Failed
pods again and again. LISTing them per step overloads the API server at scale (429s
at 100 nodes / 2,000 pods), so the operator keeps them here:

- Kopf event handlers (the initial listing and every change) put and remove objects;
- :func:`resync` (the periodic pass, every few seconds) LISTs each kind once, which
  bounds the staleness where watch events are missed: while a peering standby is
  paused its watches stop, yet it may still serve webhooks;
- every handler and webhook awaits :func:`ready` first, which LISTs the stores not
  filled yet (webhooks may be called before the initial listing is through); the reads
  after it are plain (synchronous) lookups.

Writes never trust the cache blindly: the redeploy record is replaced with optimistic
concurrency on the ConfigMap's resourceVersion (a stale copy gets 409, then a fresh
GET), and the operator puts what its own writes return back into the stores, so that
it never acts twice on a copy older than its own write. Newer resourceVersions win.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

import kopf

from numalign.api.kube import NT_BASE, q
from numalign.api.names import LABEL_STATE, REJECT_REASON

from . import connection

# The redeploy records: one ConfigMap per namespace (controller.redeploy.store).
STATE_CONFIGMAP = "numalign-redeploy"


def _rv(obj: Mapping[str, Any] | None) -> int | None:
    try:
        return int(str(((obj or {}).get("metadata") or {}).get("resourceVersion")))
    except (TypeError, ValueError):
        return None


def _newer(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    a, b = _rv(old), _rv(new)
    return old is None or a is None or b is None or b >= a


Lister = Callable[[], Awaitable[tuple[list[dict[str, Any]], int | None]]]


class Store:
    """Objects of one kind by key. Used from the operator's event loop only (handlers,
    webhooks and redeploy workers are coroutines): no locks."""

    def __init__(self, name: str, lister: Lister, key: Callable[[Mapping[str, Any]], str],
                 slim: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None):
        """``slim``: what is kept of each object put (None: all of it; the lister
        slims what it lists)."""
        self.name = name
        self._lister = lister
        self._key = key
        self._slim = slim
        self._items: dict[str, dict[str, Any]] = {}
        self._filled = False
        self._filling = asyncio.Lock()
        self.filled_at = 0.0

    def key_of(self, obj: Mapping[str, Any]) -> str:
        return self._key(obj)

    @property
    def filled(self) -> bool:
        return self._filled

    def put(self, obj: Mapping[str, Any]) -> None:
        key = self._key(obj)
        if _newer(self._items.get(key), obj):
            self._items[key] = self._slim(obj) if self._slim is not None else dict(obj)

    def remove(self, obj: Mapping[str, Any]) -> None:
        self._items.pop(self._key(obj), None)

    def forget(self, key: str) -> None:
        self._items.pop(key, None)

    async def fill(self) -> None:
        """Replace the contents with a fresh LIST (keeping entries newer than it)."""
        items, list_rv = await self._lister()  # slimmed by the lister, page by page
        fresh = {self._key(o): o for o in items}
        for key, old in self._items.items():
            new = fresh.get(key)
            old_rv = _rv(old)
            if new is None:
                # Absent from the LIST: keep it only if it is newer than the LIST.
                if old_rv is not None and list_rv is not None and old_rv > list_rv:
                    fresh[key] = old
            elif not _newer(old, new):
                fresh[key] = old
        self._items = fresh
        self._filled = True
        self.filled_at = time.monotonic()

    async def ensure(self) -> None:
        """Fill it unless filled (callers at once share one LIST)."""
        if self._filled:
            return
        async with self._filling:
            if not self._filled:
                await self.fill()

    def get(self, key: str) -> dict[str, Any] | None:
        return self._items.get(key)

    def values(self) -> list[dict[str, Any]]:
        return list(self._items.values())

    def clear(self) -> None:
        self._items = {}
        self._filled = False


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _ns_name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def _list_rv(rv: str) -> int | None:
    try:
        return int(rv)
    except (TypeError, ValueError):
        return None


def _custom(base: str, keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None
            ) -> Lister:
    async def lister() -> tuple[list[dict[str, Any]], int | None]:
        # nothing when the CRD is not installed
        items, rv = await connection.list_items(base, keep=keep)
        return items, _list_rv(rv)
    return lister


def _interned(value: Any) -> Any:
    return sys.intern(value) if type(value) is str and len(value) <= 64 else value


def slim_labels(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What is kept of a Node or Namespace: name, labels, resourceVersion."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    return {"metadata": {"name": meta.get("name"),
                         "labels": {_interned(k): _interned(v) for k, v in labels.items()},
                         "resourceVersion": meta.get("resourceVersion")}}


# What the operator's readers take of a NodeTopology (numalign.api.zonefit through
# controller.avoidance, controller.metrics, controller.policies, controller.pods,
# controller.nodedefaults through numalign.api.effective and numalign.api.reads): the
# rest of its status (CPU topology, distances, devices, each admitted pod's placement)
# is the extender's and the agent's. A fleet's NodeTopologies kept whole cost the
# operator ~40 KiB a node at 20 pods a node.
_ZONE_KEYS = ("id", "capacity", "allocatable", "available")
_ZONE_KEYS_ALLOCATABLE = ("id", "allocatable", "available")
_CONDITION_KEYS = ("type", "status", "reason")
_ADMITTED_KEYS = ("policy", "source")
_STATUS_KEPT = ("kubelet", "rejected", "summary")
# One read-only entry per (policy, source) told apart: every admitted pod under the same
# policy and source shares it (bounded: beyond it, an entry of its own).
_ADMITTED_SHARED: dict[tuple[Any, ...], Mapping[str, Any]] = {}
_ADMITTED_SHARED_MAX = 4096


def _slim_map(raw: Any) -> Any:
    """A zone's resource -> quantity map with its names and quantities interned."""
    if not isinstance(raw, Mapping):
        return raw
    return {_interned(k): _interned(v) for k, v in raw.items()}


def _slim_zone(zone: Mapping[str, Any]) -> dict[str, Any]:
    """A zone's id and amounts; its capacity only where no allocatable stands for it
    (:class:`numalign.api.reads.ZoneRead`)."""
    keys = _ZONE_KEYS if not zone.get("allocatable") else _ZONE_KEYS_ALLOCATABLE
    return {k: _slim_map(zone[k]) for k in keys if k in zone}


def _slim_admitted(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    kept = {k: entry[k] for k in _ADMITTED_KEYS if k in entry}
    key = tuple((k, type(v), v) for k, v in kept.items())  # 1 and True apart
    try:
        shared = _ADMITTED_SHARED.get(key)
    except TypeError:  # a value that is not hashable: an entry of its own
        return MappingProxyType(kept)
    if shared is None:
        shared = MappingProxyType({k: _interned(v) for k, v in kept.items()})
        if len(_ADMITTED_SHARED) < _ADMITTED_SHARED_MAX:
            _ADMITTED_SHARED[key] = shared
    return shared


def slim_nt(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What is kept of a NodeTopology: its name, uid and resourceVersion, its spec (the
    node default), and of its status the conditions' type, status and reason, the
    kubelet's settings, the zones' id and amounts (allocatable, else capacity; available),
    the rejected count, the summary, and of each admitted pod its policy and source
    (shared, read-only). A part that is not what the schema says is kept as it came (the
    readers judge it)."""
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    out: dict[str, Any] = {"metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion")
                                        if k in meta}}
    if "spec" in obj:
        out["spec"] = obj["spec"]
    status = obj.get("status")
    if not isinstance(status, Mapping):
        if "status" in obj:
            out["status"] = status
        return out
    slim: dict[str, Any] = {k: status[k] for k in _STATUS_KEPT if k in status}
    conds = status.get("conditions")
    if conds is not None:
        slim["conditions"] = [
            {k: c[k] for k in _CONDITION_KEYS if k in c} if isinstance(c, Mapping) else c
            for c in conds] if isinstance(conds, list) else conds
    zones = status.get("zones")
    if zones is not None:
        slim["zones"] = [_slim_zone(z) if isinstance(z, Mapping) else z for z in zones
                         ] if isinstance(zones, list) else zones
    admitted = status.get("admitted")
    if admitted is not None:
        slim["admitted"] = [_slim_admitted(a) for a in admitted if isinstance(a, Mapping)
                            ] if isinstance(admitted, list) else admitted
    out["status"] = slim
    return out


async def _list_nodes() -> tuple[list[dict[str, Any]], int | None]:
    items, rv = await connection.client().list_all("/api/v1/nodes", keep=slim_labels)
    return items, _list_rv(rv)


async def _list_namespaces() -> tuple[list[dict[str, Any]], int | None]:
    items, rv = await connection.client().list_all("/api/v1/namespaces", keep=slim_labels)
    return items, _list_rv(rv)


def slim_state(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "resourceVersion": meta.get("resourceVersion")},
            "data": dict(obj.get("data") or {})}


async def _list_states() -> tuple[list[dict[str, Any]], int | None]:
    # By name: RBAC lets the operator read no other ConfigMap (resourceNames), which a
    # LIST passes only with this field selector.
    items, rv = await connection.client().list_all("/api/v1/configmaps", {
        "fieldSelector": f"metadata.name={STATE_CONFIGMAP}",
        "labelSelector": f"{LABEL_STATE}=redeploy"}, keep=slim_state)
    return items, _list_rv(rv)


def slim_failed(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What is kept of a pod Failed with TopologyAffinityError: its controller and node."""
    meta = obj.get("metadata") or {}
    owner = next((r.get("uid") for r in meta.get("ownerReferences") or []
                  if isinstance(r, Mapping) and r.get("controller")), None)
    return {"metadata": {"uid": meta.get("uid"), "name": meta.get("name"),
                         "namespace": meta.get("namespace"),
                         "resourceVersion": meta.get("resourceVersion")},
            "owner": owner, "node": (obj.get("spec") or {}).get("nodeName")}


def is_rejected(obj: Mapping[str, Any]) -> bool:
    status = obj.get("status") or {}
    return bool(status.get("phase") == "Failed" and status.get("reason") == REJECT_REASON)


async def _list_failed() -> tuple[list[dict[str, Any]], int | None]:
    items, rv = await connection.client().list_all(
        "/api/v1/pods", {"fieldSelector": "status.phase=Failed"},
        keep=lambda p: slim_failed(p) if is_rejected(p) else None)
    return items, _list_rv(rv)


def slim_gated(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What is kept of a pod held by the redeploy gate."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta.get(k) for k in ("uid", "name", "namespace",
                                                   "resourceVersion", "ownerReferences")},
            "spec": {"schedulingGates": list((obj.get("spec") or {}).get("schedulingGates")
                                             or [])}}


async def _list_nothing() -> tuple[list[dict[str, Any]], int | None]:
    return [], None


TOPOLOGY_POLICIES = Store("topologypolicies", _custom(connection.TP_BASE), _name)
NODE_TOPOLOGIES = Store("nodetopologies", _custom(NT_BASE, slim_nt), _name, slim_nt)
NODES = Store("nodes", _list_nodes, _name)
NAMESPACES = Store("namespaces", _list_namespaces, _name)
STATES = Store("redeploy-states", _list_states, _ns_name)
FAILED = Store("rejected-pods", _list_failed, _uid)
# Fed by pod events only (held pods are few; the initial listing fills it).
GATED = Store("gated-pods", _list_nothing, _uid)

ALL = (TOPOLOGY_POLICIES, NODE_TOPOLOGIES, NODES, NAMESPACES, STATES, FAILED)


async def resync() -> None:
    for store in ALL:
        await store.fill()


async def ready() -> None:
    """Fill the stores not filled yet (one LIST each); then the readers below answer."""
    for store in ALL:
        await store.ensure()


def clear() -> None:
    for store in (*ALL, GATED):
        store.clear()


# ---------------------------------------------------------------------------
# Readers


def policies() -> list[dict[str, Any]]:
    return sorted(TOPOLOGY_POLICIES.values(), key=_name)


def node_topologies() -> list[dict[str, Any]]:
    return sorted(NODE_TOPOLOGIES.values(), key=_name)


def node_topology(name: str) -> dict[str, Any] | None:
    return NODE_TOPOLOGIES.get(name)


def node_labels(name: str) -> dict[str, str] | None:
    node = NODES.get(name)
    return None if node is None else dict(node["metadata"]["labels"])


def nodes() -> list[dict[str, Any]]:
    return NODES.values()


async def know_namespace(name: str) -> None:
    """Make sure the namespace's labels are cached: one created a moment ago is read
    (and remembered). Handlers call it before resolving a pod of ``name``."""
    if not name or NAMESPACES.get(name) is not None:
        return
    obj = await connection.client().get_or_none(f"/api/v1/namespaces/{q(name)}")
    if obj is not None:
        NAMESPACES.put(slim_labels(obj))


def namespace_labels(name: str) -> dict[str, str]:
    """The namespace's labels (empty for one not known: see :func:`know_namespace`)."""
    ns = NAMESPACES.get(name)
    return {} if ns is None else dict(ns["metadata"]["labels"])


def all_namespace_labels() -> dict[str, dict[str, str]]:
    return {_name(n): dict(n["metadata"]["labels"]) for n in NAMESPACES.values()}


def state(namespace: str) -> tuple[dict[str, str], str | None]:
    """The redeploy ConfigMap's data and resourceVersion (None: it does not exist)."""
    cm = STATES.get(f"{namespace}/{STATE_CONFIGMAP}")
    if cm is None:
        return {}, None
    return dict(cm.get("data") or {}), str(cm["metadata"].get("resourceVersion"))


def all_states() -> list[dict[str, Any]]:
    return STATES.values()


async def refresh_state(namespace: str) -> None:
    """Drop the cached record of ``namespace`` and read it again (after a 409)."""
    STATES.forget(f"{namespace}/{STATE_CONFIGMAP}")
    cm = await connection.client().get_or_none(connection.ns_path(namespace, "configmaps",
                                                                  STATE_CONFIGMAP))
    if cm is not None:
        STATES.put(slim_state(cm))


# ---------------------------------------------------------------------------
# Feeding from watch events (initial listing included)


def feed(store: Store, body: Mapping[str, Any], type_: str | None,
         slim: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None) -> None:
    obj = slim(body) if slim is not None else dict(body)
    if type_ == "DELETED":
        store.remove(obj)
    else:
        store.put(obj)


@kopf.on.event("", "v1", "namespaces", id="cache-namespaces")
async def namespace_event(body: kopf.Body, type: str | None, **_: Any) -> None:
    feed(NAMESPACES, body, type, slim_labels)


# The redeploy records are not watched through Kopf: Kopf watches every ConfigMap of the
# cluster, which the operator may not read. The periodic resync LISTs them by name, the
# operator's own writes go into the store, and a 409 reads the record again by name.


def _failed_or_gone(body: kopf.Body, **_: Any) -> bool:
    return is_rejected(body)


@kopf.on.event("", "v1", "pods", id="cache-rejected-pods", when=_failed_or_gone)
async def failed_pod_event(body: kopf.Body, type: str | None, **_: Any) -> None:
    feed(FAILED, body, type, slim_failed)
