"""The scheduling gate that holds a workload's new pods during a backoff or once its
budget is spent, and the passes that release them (rules: README, "TopologyPolicy")."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from numalign.api.kube import JSON_PATCH, ApiError
from numalign.api.names import (
    ANN_REDEPLOY_RESET,
    EVENT_REDEPLOY_BACKOFF,
    EVENT_REDEPLOY_EXHAUSTED,
    EVENT_REDEPLOY_RELEASED,
    REDEPLOY_GATE,
    REJECT_REASON,
)
from numalign.api.topologypolicy import RedeployPolicy

from .. import cache, connection
from ..avoidance import with_unfit
from .record import RESET_AFTER_S, WorkloadState, controller_ref, workload_key
from .rejected import governing_settings
from .store import prune_records, read_owner, update_record, workload_state

log = logging.getLogger(__name__)


@dataclass
class Workload:
    """What the mutating webhook and the release pass know of a controller's workload:
    its record, and its pods that are Failed with TopologyAffinityError right now."""

    state: WorkloadState
    failed: dict[str, str]  # pod uid -> node
    pod: Mapping[str, Any]
    _settings: RedeployPolicy | None = None

    @property
    def settings(self) -> RedeployPolicy:
        if self._settings is None:
            self._settings = governing_settings(self.pod)[1]
        return self._settings

    def waiting(self) -> list[str]:
        """Uids of its rejected pods that wait for the operator's decision (backoff)."""
        st = self.state
        decided = {**(st.handled or {}), **(st.gave_up or {}), **(st.released or {})}
        return sorted(uid for uid in self.failed if uid not in decided)

    def is_exhausted(self, now: float) -> bool:
        st = self.state
        return bool(st.exhausted) and now - st.last_rejection() <= RESET_AFTER_S

    def hold(self, now: float) -> str | None:
        """Why its new pods are held by :data:`REDEPLOY_GATE`: ``exhausted`` (the budget is
        spent), ``backoff`` (a rejected pod waits out its backoff: its controller's
        replacement must not be scheduled before), or None."""
        if not self.failed and not self.state.exhausted:
            return None
        if not self.settings.enabled:
            return None
        if self.is_exhausted(now):
            return "exhausted"
        return "backoff" if self.waiting() else None

    def avoid(self, now: float) -> list[str]:
        """Nodes its new pods should avoid: the nodes of its rejected pods now, then the
        nodes in its record, newest first (with ``avoidRejectingNodes``), plus the nodes
        that cannot fit it (:func:`~numalign.controller.avoidance.with_unfit`). Nothing until
        it was rejected once."""
        recorded = self.state.avoid_nodes(now)
        nodes = list(dict.fromkeys([*sorted(set(self.failed.values())), *recorded]))
        if not nodes or not self.settings.enabled:
            return []
        if not self.settings.avoid_rejecting_nodes:
            nodes = []
        return with_unfit(self.pod, nodes)


Rejected = dict[str, dict[str, str]]  # controller uid -> {pod uid: node}


async def _list_rejected(namespace: str) -> Rejected:
    failed = await connection.client().get(connection.ns_path(namespace, "pods"), {
        "fieldSelector": "status.phase=Failed", "resourceVersion": "0"})
    out: Rejected = {}
    for other in failed.get("items") or []:
        meta = other.get("metadata") or {}
        if (other.get("status") or {}).get("reason") != REJECT_REASON \
                or meta.get("deletionTimestamp"):
            continue
        for r in meta.get("ownerReferences") or []:
            if r.get("controller"):
                out.setdefault(str(r.get("uid")), {})[str(meta.get("uid"))] = str(
                    (other.get("spec") or {}).get("nodeName") or "")
    return out


class FreshLists:
    """The namespace's pods Failed with TopologyAffinityError, by controller: each caller
    gets the answer of a LIST that started after it asked, and the callers that ask while
    one is in flight share the next (one LIST per namespace at a time, at most one
    waiting). Read from the API server's watch cache (resourceVersion "0": no etcd read):
    a controller learnt of its Failed pod from there before creating the replacement
    the mutating webhook asks for; the operator's own watch may lag behind, so a cached
    answer, or one from a LIST started earlier, could miss it. A burst of N creations in
    a namespace costs about N / (creations during one LIST) LISTs instead of N."""

    def __init__(self) -> None:
        self._running: dict[str, asyncio.Future[Rejected]] = {}
        self._queued: dict[str, asyncio.Future[Rejected]] = {}
        self.lists = 0  # LISTs made (the bench and the tests read it)

    async def get(self, namespace: str) -> Rejected:
        queued = self._queued.get(namespace)
        if queued is None:
            running = self._running.get(namespace)
            queued = asyncio.ensure_future(self._after(namespace, running))
            if running is not None:
                self._queued[namespace] = queued
            else:
                self._running[namespace] = queued
        return dict(await asyncio.shield(queued))

    async def _after(self, namespace: str, running: asyncio.Future[Rejected] | None
                     ) -> Rejected:
        if running is not None:
            with contextlib.suppress(Exception):
                await running  # its failure is its own callers'
            # from here on, a new caller waits for the next LIST, not for this one
            self._running[namespace] = self._queued.pop(namespace)
        me = self._running[namespace]
        try:
            self.lists += 1
            return await _list_rejected(namespace)
        finally:
            if self._running.get(namespace) is me:
                del self._running[namespace]


REJECTED = FreshLists()


async def _rejected_by_owner(namespace: str) -> Rejected:
    """Controller uid -> {pod uid: node} of the namespace's pods Failed with
    TopologyAffinityError, from a LIST started after this call (:class:`FreshLists`)."""
    return await REJECTED.get(namespace)


async def workload_of(pod: Mapping[str, Any], namespace: str,
                      rejected: Rejected | None = None) -> Workload | None:
    """The workload of a controller-owned pod (None for bare pods). Its rejected pods are
    read only when its governing policy redeploys (else nothing holds or steers it)."""
    ref = controller_ref(pod)
    if ref is None:
        return None
    await cache.ready()
    await cache.know_namespace(namespace)
    owner = str(ref.get("uid"))
    settings = governing_settings(pod)[1]
    if not settings.enabled:
        return Workload(workload_state(namespace, workload_key(pod)), {}, pod, settings)
    if rejected is None:
        rejected = await _rejected_by_owner(namespace)
    failed = {uid: node for uid, node in rejected.get(owner, {}).items()}
    for p in cache.FAILED.values():  # seen by the operator's watch, maybe not there yet
        if p.get("owner") == owner and p["metadata"].get("namespace") == namespace:
            failed.setdefault(str(p["metadata"].get("uid")), str(p.get("node") or ""))
    return Workload(workload_state(namespace, workload_key(pod)),
                    {u: n for u, n in failed.items() if n}, pod, settings)


def gate_message(pod: Mapping[str, Any], st: WorkloadState) -> str:
    """The Warning on a pod held because its workload spent its redeploy budget."""
    ref = controller_ref(pod) or {}
    kind, owner = str(ref.get("kind", "")), str(ref.get("name", ""))
    name = str((pod.get("metadata") or {}).get("name", ""))
    ns = str((pod.get("metadata") or {}).get("namespace", ""))
    spent = (f"{st.attempts} redeploy attempt(s) (budget {st.budget or st.attempts}"
             + (f", TopologyPolicy/{st.policy}" if st.policy else "") + ")")
    return (f"held by the scheduling gate {REDEPLOY_GATE}: {kind}/{owner} was rejected with "
            f"TopologyAffinityError and spent {spent}, so its new pods are not scheduled. "
            f"Fix the policy or free capacity, then release them all with `kubectl annotate "
            f"-n {ns} {kind.lower()}/{owner} {ANN_REDEPLOY_RESET}=$(date +%s) --overwrite`, or let "
            f"this one try once more by removing the gate (`kubectl patch -n {ns} pod/{name} "
            f"--type=json -p '[{{\"op\":\"remove\",\"path\":\"/spec/schedulingGates\"}}]'`"
            f"); released by itself {int(RESET_AFTER_S // 60)} minutes after the last "
            f"rejection")


def backoff_message(pod: Mapping[str, Any]) -> str:
    ref = controller_ref(pod) or {}
    return (f"held by the scheduling gate {REDEPLOY_GATE} while a pod of {ref.get('kind', '')}/"
            f"{ref.get('name', '')} rejected with TopologyAffinityError waits out its "
            f"redeploy backoff; released when the operator has redeployed it")


async def release_budgets(now: float) -> None:
    """Release exhausted records whose controller's :data:`ANN_REDEPLOY_RESET` changed (or that
    expired, or whose controller is gone)."""
    for cm in cache.all_states():
        ns = str(cm["metadata"].get("namespace") or "")
        for key, text in (cm.get("data") or {}).items():
            st = WorkloadState.parse(text)
            if not st.exhausted:
                continue
            why = None
            if now - st.last_rejection() > RESET_AFTER_S:
                why = "expired"
            elif st.owner:
                owner = await read_owner(st.owner.get("kind", ""), st.owner.get("name", ""),
                                         ns)
                if owner is None:
                    why = "controller gone"
                else:
                    token = str(((owner.get("metadata") or {}).get("annotations") or {}).get(
                        ANN_REDEPLOY_RESET, ""))
                    if token != (st.reset or ""):
                        why = f"{ANN_REDEPLOY_RESET}={token}"

            if why is None:
                continue

            def change(s: WorkloadState) -> bool:
                if not s.exhausted:
                    return False
                s.release(now)
                return True

            if await update_record(ns, key, change) is not None:
                log.info(f"redeploy budget of {ns}/{key} released ({why})")


warned: dict[str, set[str]] = {}


async def tell_once(pod: Mapping[str, Any], why: str, st: WorkloadState) -> None:
    """One event per held pod and reason: Normal for a backoff, Warning when the budget
    is spent."""
    uid = str((pod.get("metadata") or {}).get("uid", ""))
    seen = warned.setdefault(uid, set())
    if why in seen:
        return
    if len(warned) > 100_000:
        warned.clear()
    seen.add(why)
    if why == "exhausted":
        await connection.event(pod, "Warning", reason=EVENT_REDEPLOY_EXHAUSTED,
                               message=gate_message(pod, st))
    else:
        await connection.event(pod, "Normal", reason=EVENT_REDEPLOY_BACKOFF,
                               message=backoff_message(pod))


async def release_held(namespace: str | None = None, now: float | None = None) -> None:
    """Remove :data:`REDEPLOY_GATE` from held pods whose workload has no reason to hold them any
    more (its rejected pods were redeployed, its budget released); tell the others why
    they are held. One LIST of Failed pods per namespace with held pods. Idempotent."""
    now = time.time() if now is None else now
    by_ns: dict[str, list[Mapping[str, Any]]] = {}
    for pod in cache.GATED.values():
        ns = str((pod.get("metadata") or {}).get("namespace") or "")
        if ns and (namespace is None or ns == namespace):
            by_ns.setdefault(ns, []).append(pod)
    for ns, held in by_ns.items():
        rejected = await _rejected_by_owner(ns)
        for one in held:
            wl = await workload_of(one, ns, rejected)
            why = wl.hold(now) if wl is not None else None
            if wl is None or why is None:
                await ungate(one)
            else:
                await tell_once(one, why, wl.state)


async def periodic_release(now: float | None = None) -> None:
    """The periodic pass: release budgets, then held pods, then prune quiet records."""
    now = time.time() if now is None else now
    await cache.ready()
    await release_budgets(now)
    await release_held(now=now)
    await prune_records(now)


async def ungate(pod: Mapping[str, Any]) -> None:
    meta = pod.get("metadata") or {}
    gates = list((pod.get("spec") or {}).get("schedulingGates") or [])
    idx = next((i for i, g in enumerate(gates) if g.get("name") == REDEPLOY_GATE), None)
    if idx is None:
        return
    try:
        await connection.client().patch(connection.ns_path(str(meta["namespace"]), "pods",
                                                           str(meta["name"])), [
            {"op": "test", "path": f"/spec/schedulingGates/{idx}/name", "value": REDEPLOY_GATE},
            {"op": "remove", "path": f"/spec/schedulingGates/{idx}"}], JSON_PATCH)
    except ApiError as e:
        if e.status == 404:  # gone
            cache.GATED.remove(pod)
            return
        if e.status in (409, 422):  # the gate moved or was removed already: next pass
            return
        raise
    cache.GATED.remove(pod)
    warned.pop(str(meta.get("uid", "")), None)
    await connection.event(pod, "Normal", reason=EVENT_REDEPLOY_RELEASED,
                           message=f"scheduling gate {REDEPLOY_GATE} removed: the workload's "
                                   "rejected pods were redeployed or its redeploy budget was "
                                   "released")
