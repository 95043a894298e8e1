"""The durable redeploy records: one ConfigMap per namespace (read from the watch cache,
written with optimistic concurrency), and the controllers' replica counts."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from .. import cache, kube
from ..cache import STATE_CONFIGMAP, STATE_LABEL
from .record import REPLICATED_KINDS, WorkloadState, controller_ref


def load_state(namespace: str) -> tuple[dict[str, str], str | None]:
    """The ConfigMap's data and resourceVersion (None when it does not exist yet), from
    the watch-fed cache (:func:`save_state` refreshes it on a conflict)."""
    return cache.state(namespace)


def save_state(namespace: str, data: dict[str, str], resource_version: str | None) -> None:
    """Write the ConfigMap; raises ApiException 409 when someone else wrote it first
    (the cached copy was stale: it is read again for the retry)."""
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": STATE_CONFIGMAP, "namespace": namespace,
                         "labels": {STATE_LABEL: "redeploy"}},
            "data": data}
    try:
        if resource_version is None:
            out = kube.core().create_namespaced_config_map(namespace, body)
        else:
            body["metadata"]["resourceVersion"] = resource_version
            out = kube.core().replace_namespaced_config_map(STATE_CONFIGMAP, namespace, body)
    except ApiException as e:
        if e.status == 409:
            cache.refresh_state(namespace)
        raise
    cache.STATES.put(cache.slim_state(kube.to_dict(out)))


def workload_state(namespace: str, key: str) -> WorkloadState:
    data, _ = load_state(namespace)
    return WorkloadState.parse(data.get(key))


def update_record(namespace: str, key: str, change: Any, tries: int = 5) -> WorkloadState | None:
    """Read-modify-write one record with optimistic concurrency: ``change(state)``
    returns False to write nothing. The state written, or None."""
    for _ in range(tries):
        data, rv = load_state(namespace)
        if key not in data:
            return None
        st = WorkloadState.parse(data.get(key))
        if change(st) is False:
            return None
        data[key] = st.dump()
        try:
            save_state(namespace, data, rv)
            return st
        except ApiException as e:
            if e.status != 409:
                raise
    return None


# ---------------------------------------------------------------------------
# The redeploy step


_OWNERS: dict[str, tuple[float, dict[str, Any] | None]] = {}
_OWNERS_LOCK = threading.Lock()
OWNER_TTL_S = 10.0


def read_owner(kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    """The controller object (as JSON), None when gone or of a kind not read here."""
    try:
        if kind == "ReplicaSet":
            obj = kube.apps().read_namespaced_replica_set(name, namespace)
        elif kind == "StatefulSet":
            obj = kube.apps().read_namespaced_stateful_set(name, namespace)
        elif kind == "ReplicationController":
            obj = kube.core().read_namespaced_replication_controller(name, namespace)
        elif kind == "Job":
            obj = kube.batch().read_namespaced_job(name, namespace)
        else:
            return None
    except ApiException as e:
        if e.status in (403, 404):
            return None
        raise
    return kube.to_dict(obj)


def owner_replicas(pod: Mapping[str, Any]) -> tuple[int, dict[str, Any] | None]:
    """Desired replicas of the pod's controller (1 for bare pods, Jobs and what cannot
    be read) and the controller object (cached for :data:`OWNER_TTL_S`)."""
    ref = controller_ref(pod)
    if ref is None:
        return 1, None
    uid = str(ref.get("uid"))
    now = time.monotonic()
    with _OWNERS_LOCK:
        hit = _OWNERS.get(uid)
    if hit is not None and now - hit[0] < OWNER_TTL_S:
        owner = hit[1]
    else:
        ns = str((pod.get("metadata") or {}).get("namespace") or "")
        try:
            owner = read_owner(str(ref.get("kind")), str(ref.get("name")), ns)
        except ApiException:
            owner = None
        with _OWNERS_LOCK:
            if len(_OWNERS) > 4096:
                _OWNERS.clear()
            _OWNERS[uid] = (now, owner)
    replicas = 1
    if owner is not None and ref.get("kind") in REPLICATED_KINDS:
        value = (owner.get("spec") or {}).get("replicas")
        replicas = value if isinstance(value, int) and value > 0 else 1
    return replicas, owner
