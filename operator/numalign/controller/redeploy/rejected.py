"""The redeploy step for one rejected pod: decide (recorded before acting), then carry
the decision out; replaying a recorded decision is harmless."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from numalign.api.kube import ApiError
from numalign.api.names import (
    ANN_REDEPLOY_RESET,
    EVENT_REDEPLOY,
    EVENT_REDEPLOY_GAVE_UP,
    EVENT_REDEPLOY_REPEAT,
    REDEPLOY_GATE,
)
from numalign.api.resolution import (
    NODE_UNKNOWN,
    PodMeta,
    policy_refs,
    redeploy_settings,
    resolve,
)
from numalign.api.topologypolicy import RedeployPolicy

from .. import cache, connection, metrics
from ..avoidance import with_unfit
from .guard import RedeployRefused, refusal_to_create, refusal_to_delete
from .record import (
    WorkloadState,
    backoff_delay,
    base_name,
    build_replacement,
    controller_ref,
    is_replacement_of,
    iso,
    repeats_a_counted_rejection,
    replacement_name,
    workload_key,
)
from .store import load_state, owner_replicas, save_state

log = logging.getLogger(__name__)


# Recreating bare pods needs `create` on pods, a separate role (config/recreate-bare-pods):
# off unless the operator runs with --recreate-bare-pods.
RECREATE_BARE_PODS = False
NAME_TAKEN = "name-taken"


def _no_checkpoint(point: str) -> None:
    pass


# Called at ``after-record`` (the decision is durable) and ``after-create`` (the
# replacement exists); the restart tests replace it to crash the process there.
checkpoint: Callable[[str], None] = _no_checkpoint


class RecordLock:
    """Read-modify-write of one namespace's record, one at a time in this process (the
    redeploy workers run concurrently on one event loop: unserialized, rejected pods of
    a namespace would mostly conflict on its ConfigMap and retry). Held from reading the
    record until the decision is written, not while it is carried out; other replicas
    still meet the ConfigMap's resourceVersion."""

    _locks: dict[str, asyncio.Lock] = {}

    def __init__(self, namespace: str) -> None:
        self._lock = self._locks.setdefault(namespace, asyncio.Lock())
        self._held = False

    async def __aenter__(self) -> RecordLock:
        await self._lock.acquire()
        self._held = True
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def release(self) -> None:
        if self._held:
            self._held = False
            self._lock.release()


def governing_settings(pod: Mapping[str, Any]) -> tuple[str | None, RedeployPolicy]:
    """The governing policy's redeploy settings (from the cache: the caller awaited
    ``cache.ready()`` and ``cache.know_namespace``)."""
    meta = PodMeta.from_object(pod)
    policies = policy_refs(cache.policies())
    res = resolve(meta, cache.namespace_labels(meta.namespace), policies, NODE_UNKNOWN)
    ref = next((p for p in policies if p.name == res.governing), None)
    return res.governing, redeploy_settings(ref)


async def _delete_pod(namespace: str, name: str, uid: str) -> None:
    try:
        await connection.client().delete(connection.ns_path(namespace, "pods", name),
                                         {"preconditions": {"uid": uid}, "gracePeriodSeconds": 0})
    except ApiError as e:
        if e.status not in (404, 409):  # gone, or a different pod now has that name
            raise


async def _finish(pod: Mapping[str, Any], decision: Mapping[str, Any]) -> str:
    """Carry out a recorded decision; idempotent. Returns the action done, or
    NAME_TAKEN when the replacement's name belongs to an unrelated pod (the original is
    then kept: deleting it would lose the workload)."""
    meta = pod.get("metadata") or {}
    ns, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
    why = refusal_to_delete(pod)
    if why is not None:
        raise RedeployRefused(why)
    if decision.get("action") == "recreate":
        new = build_replacement(pod, str(decision["replacement"]),
                                list(decision.get("avoid") or []))
        why = refusal_to_create(pod, new)
        if why is not None:
            raise RedeployRefused(why)
        try:
            await connection.client().create(connection.ns_path(ns, "pods"), new)
        except ApiError as e:
            if e.status != 409:
                raise
            # AlreadyExists: created before a crash/retry, or someone else's pod.
            try:
                existing = await connection.client().get(
                    connection.ns_path(ns, "pods", str(decision["replacement"])))
            except ApiError as e2:
                if e2.status != 404:
                    raise
                raise e from None  # gone again: retried by the caller
            if not is_replacement_of(existing, pod):
                return NAME_TAKEN
        checkpoint("after-create")
    await _delete_pod(ns, name, uid)
    return str(decision.get("action"))


async def give_up(pod: Mapping[str, Any], why: str, now: float) -> None:
    """Stop redeploying ``pod`` for good (recorded, so that a restart does not retry a
    decision that cannot be carried out) and say why in a Warning event."""
    meta = pod.get("metadata") or {}
    ns, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
    key = workload_key(pod)
    await cache.ready()  # called after API errors: maybe before any pass read the cache
    async with RecordLock(ns):
        data, rv = load_state(ns)
        st = WorkloadState.parse(data.get(key))
        st.handled = {k: v for k, v in (st.handled or {}).items() if k != uid}
        st.gave_up = {**(st.gave_up or {}), uid: iso(now)}
        data[key] = st.dump()
        await save_state(ns, data, rv)
    metrics.REDEPLOYS.labels(outcome="gave_up").inc()
    await connection.event(pod, "Warning", reason=EVENT_REDEPLOY_GAVE_UP,
                           message=f"not redeploying {name}: {why}")


async def _give_up_name_taken(pod: Mapping[str, Any], decision: Mapping[str, Any],
                              now: float) -> None:
    name = str((pod.get("metadata") or {}).get("name"))
    await give_up(pod, f"its replacement's name {decision.get('replacement')} is taken by a pod "
                 f"that is not its replacement; {name} is kept", now)


async def _clear_repeat(pod: Mapping[str, Any], st: WorkloadState, data: dict[str, str],
                        rv: str | None, now: float, held: RecordLock) -> None:
    """Delete a controller's pod whose rejection repeats one already counted
    (:func:`~.record.repeats_a_counted_rejection`) without spending an attempt: its
    controller has replaced it already, and that replacement is kept off the node."""
    meta = pod.get("metadata") or {}
    name, uid = str(meta["name"]), str(meta["uid"])
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    decision = {"action": "delete", "attempt": st.attempts, "node": node, "at": iso(now),
                "pod": name, "avoid": [], "replacement": None, "repeat": True}
    st.handled = {**(st.handled or {}), uid: decision}
    st.rejections = {**(st.rejections or {}), node: iso(now)}
    st.last = iso(now)
    data[workload_key(pod)] = st.dump()
    await save_state(str(meta["namespace"]), data, rv)  # durable before acting
    held.release()
    await _finish(pod, decision)
    metrics.REDEPLOYS.labels(outcome="repeat").inc()
    await connection.event(pod, "Normal", reason=EVENT_REDEPLOY_REPEAT,
                           message=f"deleted without spending a redeploy attempt ({st.attempts}/"
                                   f"{st.budget} spent): {node} had rejected this workload "
                                   f"already, and {name} was created while the operator could not "
                                   f"keep it off that node")


async def step(pod: Mapping[str, Any], first_seen: float, now: float | None = None
               ) -> float | None:
    """One pass over a rejected pod: None when done, else seconds to wait."""
    async with RecordLock(str((pod.get("metadata") or {}).get("namespace"))) as held:
        return await _step(pod, first_seen, time.time() if now is None else now, held)


async def _step(pod: Mapping[str, Any], first_seen: float, now: float, held: RecordLock
                ) -> float | None:
    meta = pod.get("metadata") or {}
    ns, name, uid = str(meta["namespace"]), str(meta["name"]), str(meta["uid"])
    node = str((pod.get("spec") or {}).get("nodeName") or "")
    key = workload_key(pod)
    data, rv = load_state(ns)
    st = WorkloadState.parse(data.get(key))
    decision = (st.handled or {}).get(uid)
    if decision is not None:
        held.release()
        if await _finish(pod, decision) == NAME_TAKEN:
            await _give_up_name_taken(pod, decision, now)
        return None
    why = refusal_to_delete(pod)
    if why is not None:  # the caller reads only rejected pods: a changed rule, a bug
        held.release()
        await give_up(pod, why, now)
        return None
    if uid in (st.gave_up or {}):
        return None
    if uid in (st.released or {}):
        return None
    governing, settings = governing_settings(pod)
    st.policy = governing
    st.expire(now)
    if not settings.enabled:
        return None
    if controller_ref(pod) is None and not RECREATE_BARE_PODS:
        st.gave_up = {**(st.gave_up or {}), uid: iso(now)}
        data[key] = st.dump()
        await save_state(ns, data, rv)
        held.release()
        metrics.REDEPLOYS.labels(outcome="gave_up").inc()
        await connection.event(pod, "Warning", reason=EVENT_REDEPLOY_GAVE_UP,
                               message=f"not redeploying {name}: it has no controller, and "
                                       "recreating bare pods is off (operator flag "
                                       "--recreate-bare-pods)")
        return None
    replicas, owner = await owner_replicas(pod)
    budget = settings.max_attempts * replicas
    st.budget = budget
    if repeats_a_counted_rejection(pod, st, node, now):
        await _clear_repeat(pod, st, data, rv, now, held)
        return None
    if st.attempts >= budget:
        st.gave_up = {**(st.gave_up or {}), uid: iso(now)}
        st.last = iso(now)
        ref = controller_ref(pod)
        gate = ref is not None and owner is not None
        if gate and not st.exhausted:
            assert ref is not None and owner is not None
            st.exhausted = iso(now)
            st.owner = {"kind": str(ref.get("kind")), "name": str(ref.get("name"))}
            st.reset = str(((owner.get("metadata") or {}).get("annotations") or {}).get(
                ANN_REDEPLOY_RESET, ""))
        data[key] = st.dump()
        await save_state(ns, data, rv)
        held.release()
        metrics.REDEPLOYS.labels(outcome="gave_up").inc()
        per = f"maxAttempts={settings.max_attempts}" + (
            f" x {replicas} replicas" if replicas != 1 else "")
        msg = (f"not redeploying {name}: {st.attempts} redeploy attempt(s) of this "
               f"workload reached its budget ({per}"
               + (f" of TopologyPolicy/{governing}" if governing else "") + ")")
        if gate:
            assert ref is not None
            msg += (f"; new pods of {ref.get('kind')}/{ref.get('name')} are held by the "
                    f"scheduling gate {REDEPLOY_GATE} until it is released: fix the policy or "
                    f"free capacity, then annotate the {ref.get('kind')} with "
                    f"{ANN_REDEPLOY_RESET}=<a new value>")
        await connection.event(pod, "Warning", reason=EVENT_REDEPLOY_GAVE_UP, message=msg)
        return None
    wait = first_seen + backoff_delay(settings.backoff_seconds, st.attempts, replicas) - now
    if wait > 0:
        return wait
    attempt = st.attempts + 1
    st.last = iso(now)
    if node:
        st.rejections = {**(st.rejections or {}), node: iso(now)}
    avoid = st.avoid_nodes(now) if settings.avoid_rejecting_nodes else []
    avoid = with_unfit(pod, avoid)
    bare = controller_ref(pod) is None
    decision = {"action": "recreate" if bare else "delete", "attempt": attempt, "node": node,
                "at": iso(now), "pod": name, "avoid": avoid if bare else [],
                "replacement": replacement_name(base_name(pod), attempt) if bare else None}
    st.handled = {**(st.handled or {}), uid: decision}
    st.attempts = attempt
    data[key] = st.dump()
    await save_state(ns, data, rv)  # durable before acting (409 -> retried by the caller)
    held.release()
    checkpoint("after-record")
    action = await _finish(pod, decision)
    if action == NAME_TAKEN:
        await _give_up_name_taken(pod, decision, now)
        return None
    metrics.REDEPLOYS.labels(outcome="recreated" if action == "recreate" else "deleted").inc()
    await connection.event(pod, "Normal", reason=EVENT_REDEPLOY,
                           message=f"attempt {attempt}/{budget}: "
                                   + (f"recreated as {decision['replacement']}" if bare
                                      else "deleted so that its controller recreates it")
                                   + (f", avoiding {', '.join(avoid)}" if avoid else ""))
    return None
