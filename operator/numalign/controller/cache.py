"""In-memory views of what the handlers read often, fed by watch events.

Resolving a pod, redeploying one and reconciling statuses read TopologyPolicies,
NodeTopologies, Node labels, namespace labels, the redeploy records and the Failed
pods again and again. LISTing them per step overloads the API server at scale (429s
at 100 nodes / 2,000 pods), so the operator keeps them here:

- Kopf event handlers (the initial listing and every change) put and remove objects;
- :func:`resync` (the periodic pass, every few seconds) LISTs each kind once, which
  bounds the staleness where watch events are missed: while a peering standby is
  paused its watches stop, yet it may still serve webhooks;
- a store read before its first fill LISTs at once (webhooks may be called before the
  initial listing is through).

Writes never trust the cache blindly: the redeploy record is replaced with optimistic
concurrency on the ConfigMap's resourceVersion (a stale copy gets 409, then a fresh
GET), and the operator puts what its own writes return back into the stores, so that
it never acts twice on a copy older than its own write. Newer resourceVersions win.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from numalign.api.wire import REJECT_REASON

from . import kube

# The redeploy records: one ConfigMap per namespace (controller.redeploy.store).
STATE_CONFIGMAP = "numalign-redeploy"
STATE_LABEL = "numalign.io/state"


def _rv(obj: Mapping[str, Any] | None) -> int | None:
    try:
        return int(str(((obj or {}).get("metadata") or {}).get("resourceVersion")))
    except (TypeError, ValueError):
        return None


def _newer(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    a, b = _rv(old), _rv(new)
    return old is None or a is None or b is None or b >= a


Lister = Callable[[], tuple[list[dict[str, Any]], int | None]]


class Store:
    """Objects of one kind by key, thread-safe (handlers run in Kopf's thread pool and
    the redeploy workers in threads of their own)."""

    def __init__(self, name: str, lister: Lister, key: Callable[[Mapping[str, Any]], str]):
        self.name = name
        self._lister = lister
        self._key = key
        self._lock = threading.Lock()
        self._items: dict[str, dict[str, Any]] = {}
        self._filled = False
        self.filled_at = 0.0

    def key_of(self, obj: Mapping[str, Any]) -> str:
        return self._key(obj)

    def put(self, obj: Mapping[str, Any]) -> None:
        key = self._key(obj)
        with self._lock:
            if _newer(self._items.get(key), obj):
                self._items[key] = dict(obj)

    def remove(self, obj: Mapping[str, Any]) -> None:
        with self._lock:
            self._items.pop(self._key(obj), None)

    def forget(self, key: str) -> None:
        with self._lock:
            self._items.pop(key, None)

    def fill(self) -> None:
        """Replace the contents with a fresh LIST (keeping entries newer than it)."""
        items, list_rv = self._lister()
        fresh = {self._key(o): o for o in items}
        with self._lock:
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

    def _ensure(self) -> None:
        if not self._filled:
            self.fill()

    def get(self, key: str) -> dict[str, Any] | None:
        self._ensure()
        with self._lock:
            return self._items.get(key)

    def values(self) -> list[dict[str, Any]]:
        self._ensure()
        with self._lock:
            return list(self._items.values())

    def clear(self) -> None:
        with self._lock:
            self._items = {}
            self._filled = False


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _ns_name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def _list_rv(res: Any) -> int | None:
    meta = res.get("metadata") if isinstance(res, Mapping) else getattr(res, "metadata", None)
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else getattr(
        meta, "resource_version", None)
    try:
        return int(str(rv))
    except (TypeError, ValueError):
        return None


def _custom(plural: str) -> Lister:
    def lister() -> tuple[list[dict[str, Any]], int | None]:
        try:
            res = kube.custom().list_cluster_custom_object(kube.GROUP, kube.VERSION, plural)
        except ApiException as e:
            if e.status == 404:  # CRD not installed
                return [], None
            raise
        return list(res.get("items") or []), _list_rv(res)
    return lister


def slim_labels(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What is kept of a Node or Namespace: name, labels, resourceVersion."""
    meta = obj.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "labels": dict(meta.get("labels") or {}),
                         "resourceVersion": meta.get("resourceVersion")}}


def _labels_of(model: Any) -> dict[str, Any]:
    return {"metadata": {"name": model.metadata.name,
                         "labels": dict(model.metadata.labels or {}),
                         "resourceVersion": model.metadata.resource_version}}


def _list_nodes() -> tuple[list[dict[str, Any]], int | None]:
    res = kube.core().list_node()
    return [_labels_of(n) for n in res.items], _list_rv(res)


def _list_namespaces() -> tuple[list[dict[str, Any]], int | None]:
    res = kube.core().list_namespace()
    return [_labels_of(n) for n in res.items], _list_rv(res)


def slim_state(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {"metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"),
                         "resourceVersion": meta.get("resourceVersion")},
            "data": dict(obj.get("data") or {})}


def _list_states() -> tuple[list[dict[str, Any]], int | None]:
    res = kube.core().list_config_map_for_all_namespaces(
        label_selector=f"{STATE_LABEL}=redeploy")
    return ([slim_state(kube.to_dict(cm)) for cm in res.items
             if cm.metadata.name == STATE_CONFIGMAP], _list_rv(res))


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


def _list_failed() -> tuple[list[dict[str, Any]], int | None]:
    res = kube.core().list_pod_for_all_namespaces(field_selector="status.phase=Failed")
    out = []
    for p in res.items:
        d = kube.to_dict(p)
        if is_rejected(d):
            out.append(slim_failed(d))
    return out, _list_rv(res)


def slim_gated(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What is kept of a pod held by the redeploy gate."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: meta.get(k) for k in ("uid", "name", "namespace",
                                                   "resourceVersion", "ownerReferences")},
            "spec": {"schedulingGates": list((obj.get("spec") or {}).get("schedulingGates")
                                             or [])}}


def _list_nothing() -> tuple[list[dict[str, Any]], int | None]:
    return [], None


POLICIES = Store("topologypolicies", _custom(kube.TP_PLURAL), _name)
NODE_TOPOLOGIES = Store("nodetopologies", _custom(kube.NT_PLURAL), _name)
NODES = Store("nodes", _list_nodes, _name)
NAMESPACES = Store("namespaces", _list_namespaces, _name)
STATES = Store("redeploy-states", _list_states, _ns_name)
FAILED = Store("rejected-pods", _list_failed, _uid)
# Fed by pod events only (held pods are few; the initial listing fills it).
GATED = Store("gated-pods", _list_nothing, _uid)

ALL = (POLICIES, NODE_TOPOLOGIES, NODES, NAMESPACES, STATES, FAILED)


def resync() -> None:
    for store in ALL:
        store.fill()


def clear() -> None:
    for store in (*ALL, GATED):
        store.clear()


# ---------------------------------------------------------------------------
# Readers


def policies() -> list[dict[str, Any]]:
    return sorted(POLICIES.values(), key=_name)


def node_topologies() -> list[dict[str, Any]]:
    return sorted(NODE_TOPOLOGIES.values(), key=_name)


def node_topology(name: str) -> dict[str, Any] | None:
    return NODE_TOPOLOGIES.get(name)


def node_labels(name: str) -> dict[str, str] | None:
    node = NODES.get(name)
    return None if node is None else dict(node["metadata"]["labels"])


def nodes() -> list[dict[str, Any]]:
    return NODES.values()


def namespace_labels(name: str) -> dict[str, str]:
    ns = NAMESPACES.get(name)
    if ns is None:  # created a moment ago: ask (and remember)
        try:
            obj = kube.core().read_namespace(name)
        except ApiException as e:
            if e.status == 404:
                return {}
            raise
        ns = _labels_of(obj)
        NAMESPACES.put(ns)
    return dict(ns["metadata"]["labels"])


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


def refresh_state(namespace: str) -> None:
    """Drop the cached record of ``namespace`` and read it again (after a 409)."""
    STATES.forget(f"{namespace}/{STATE_CONFIGMAP}")
    try:
        cm = kube.core().read_namespaced_config_map(STATE_CONFIGMAP, namespace)
    except ApiException as e:
        if e.status == 404:
            return
        raise
    STATES.put(slim_state(kube.to_dict(cm)))


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


def _is_state(body: kopf.Body, **_: Any) -> bool:
    return str((body.get("metadata") or {}).get("name")) == STATE_CONFIGMAP


@kopf.on.event("", "v1", "configmaps", id="cache-redeploy-states",
               labels={STATE_LABEL: "redeploy"}, when=_is_state)
async def state_event(body: kopf.Body, type: str | None, **_: Any) -> None:
    feed(STATES, body, type, slim_state)


def _failed_or_gone(body: kopf.Body, **_: Any) -> bool:
    return is_rejected(body)


@kopf.on.event("", "v1", "pods", id="cache-rejected-pods", when=_failed_or_gone)
async def failed_pod_event(body: kopf.Body, type: str | None, **_: Any) -> None:
    feed(FAILED, body, type, slim_failed)
