"""The durable redeploy records: one ConfigMap per namespace (read from the watch cache,
written with optimistic concurrency), and the controllers' replica counts."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from numalign.api.kube import ApiError
from numalign.api.names import ANN_REDEPLOY_RESET, LABEL_STATE

from .. import cache, connection
from ..cache import STATE_CONFIGMAP
from .record import MAX_DATA_BYTES, REPLICATED_KINDS, WorkloadState, controller_ref, prune


def load_state(namespace: str) -> tuple[dict[str, str], str | None]:
    """The ConfigMap's data and resourceVersion (None when it does not exist yet), from
    the operator's cache (:func:`save_state` refreshes it on a conflict)."""
    return cache.state(namespace)


def live_uids(namespace: str) -> set[str]:
    """Uids of the namespace's pods Failed with TopologyAffinityError now (cache)."""
    return {str(p["metadata"].get("uid")) for p in cache.FAILED.values()
            if p["metadata"].get("namespace") == namespace}


async def save_state(namespace: str, data: dict[str, str], resource_version: str | None
                     ) -> None:
    """Write the ConfigMap; raises ApiError 409 when someone else wrote it first
    (the cached copy was stale: it is read again for the retry). Records that no longer
    matter are pruned first when the data grows past :data:`MAX_DATA_BYTES`."""
    if sum(len(k) + len(v) for k, v in data.items()) > MAX_DATA_BYTES:
        prune(data, time.time(), live_uids(namespace))
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": STATE_CONFIGMAP, "namespace": namespace,
                         "labels": {LABEL_STATE: "redeploy"}},
            "data": data}
    try:
        if resource_version is None:
            out = await connection.client().create(connection.ns_path(namespace, "configmaps"),
                                                   body)
        else:
            body["metadata"]["resourceVersion"] = resource_version
            out = await connection.client().put(
                connection.ns_path(namespace, "configmaps", STATE_CONFIGMAP), body)
    except ApiError as e:
        if e.status == 409:
            await cache.refresh_state(namespace)
        raise
    cache.STATES.put(cache.slim_state(out))


def workload_state(namespace: str, key: str) -> WorkloadState:
    data, _ = load_state(namespace)
    return WorkloadState.parse(data.get(key))


async def update_record(namespace: str, key: str, change: Callable[[WorkloadState], bool],
                        tries: int = 5) -> WorkloadState | None:
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
            await save_state(namespace, data, rv)
            return st
        except ApiError as e:
            if e.status != 409:
                raise
    return None


# ---------------------------------------------------------------------------
# The redeploy step


_OWNERS: dict[str, tuple[float, dict[str, Any] | None]] = {}
OWNER_TTL_S = 10.0
# The controllers read here: kind -> (API group/version, resource).
OWNER_KINDS = {"ReplicaSet": ("apps/v1", "replicasets"),
               "StatefulSet": ("apps/v1", "statefulsets"),
               "ReplicationController": ("", "replicationcontrollers"),
               "Job": ("batch/v1", "jobs")}


async def read_owner(kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    """The controller object (as JSON), None when gone or of a kind not read here."""
    where = OWNER_KINDS.get(kind)
    if where is None:
        return None
    group, resource = where
    try:
        return await connection.client().get(connection.ns_path(namespace, resource, name, group))
    except ApiError as e:
        if e.status in (403, 404):
            return None
        raise


def slim_owner(owner: Mapping[str, Any]) -> dict[str, Any]:
    """What is read of a controller: its ``spec.replicas`` and its redeploy-reset
    annotation (the rest of a ReplicaSet, its pod template and managed fields, is not
    kept in :data:`_OWNERS`)."""
    meta = owner.get("metadata") or {}
    ann = (meta.get("annotations") or {}) if isinstance(meta, Mapping) else {}
    spec = owner.get("spec") or {}
    kept_ann = {ANN_REDEPLOY_RESET: ann[ANN_REDEPLOY_RESET]} if isinstance(
        ann, Mapping) and ANN_REDEPLOY_RESET in ann else {}
    kept_spec = {"replicas": spec["replicas"]} if isinstance(
        spec, Mapping) and "replicas" in spec else {}
    return {"metadata": {"annotations": kept_ann}, "spec": kept_spec}


async def owner_replicas(pod: Mapping[str, Any]) -> tuple[int, dict[str, Any] | None]:
    """Desired replicas of the pod's controller (1 for bare pods, Jobs and what cannot
    be read) and what is read of the controller (:func:`slim_owner`; cached for
    :data:`OWNER_TTL_S`)."""
    ref = controller_ref(pod)
    if ref is None:
        return 1, None
    uid = str(ref.get("uid"))
    now = time.monotonic()
    hit = _OWNERS.get(uid)
    if hit is not None and now - hit[0] < OWNER_TTL_S:
        owner = hit[1]
    else:
        ns = str((pod.get("metadata") or {}).get("namespace") or "")
        try:
            whole = await read_owner(str(ref.get("kind")), str(ref.get("name")), ns)
            owner = None if whole is None else slim_owner(whole)
        except ApiError:
            owner = None
        if len(_OWNERS) > 4096:
            _OWNERS.clear()
        _OWNERS[uid] = (now, owner)
    replicas = 1
    if owner is not None and ref.get("kind") in REPLICATED_KINDS:
        value = (owner.get("spec") or {}).get("replicas")
        replicas = value if isinstance(value, int) and value > 0 else 1
    return replicas, owner


async def prune_records(now: float | None = None) -> int:
    """The periodic pass: drop the records of workloads quiet for an hour (gone ones
    included) from every namespace's ConfigMap. Returns how many went."""
    now = time.time() if now is None else now
    total = 0
    for cm in cache.all_states():
        ns = str(cm["metadata"].get("namespace") or "")
        for _ in range(5):
            data, rv = load_state(ns)
            if rv is None:
                break
            removed = prune(data, now, live_uids(ns))
            if not removed:
                break
            try:
                await save_state(ns, data, rv)
            except ApiError as e:
                if e.status != 409:
                    raise
                continue
            total += len(removed)
            break
    return total
