"""The Kopf handlers of redeploy: one worker per rejected pod, and the held pods' watch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import kopf

from numalign.api.kube import ApiError

from .. import cache, connection, metrics
from .gating import release_held, tell_once, warned, workload_of
from .guard import PROTECTED_NAMESPACES, RedeployRefused
from .record import has_gate, is_topology_rejected
from .rejected import give_up, step

# ---------------------------------------------------------------------------
# Kopf handler
#
# Not a kopf daemon: daemons (and timers) make Kopf put a finalizer on every object they
# serve, and a finalizer on pods would block their deletion while the operator is down.
# An event handler schedules one worker per rejected pod uid instead; on restart (or
# when a standby takes over) the initial listing schedules the pending ones again, and
# the durable decision in the ConfigMap makes a replay harmless.

_workers: dict[str, asyncio.Task[None]] = {}

# API errors other than a conflict (quota, a terminating namespace, a webhook refusing
# the replacement, an API server in trouble) are retried with a doubling delay, and the
# redeploy gives up with an event after API_GIVE_UP_AFTER of them in a row.
API_RETRY_FIRST = 1.0
API_RETRY_MAX = 60.0
API_GIVE_UP_AFTER = 8
# The longest single sleep of a worker (a backoff wait is re-checked at least this often).
MAX_SLEEP = 60.0


async def _one_pass(meta: Mapping[str, Any], first_seen: float) -> float | None:
    """Read the pod and take one step."""
    fresh = await connection.client().get(connection.ns_path(meta["namespace"], "pods",
                                                             meta["name"]))
    if fresh["metadata"].get("uid") != meta.get("uid") or not is_topology_rejected(fresh):
        return None
    await cache.ready()
    await cache.know_namespace(str(meta["namespace"]))
    return await step(fresh, first_seen)


async def _release_after(meta: Mapping[str, Any],
                         log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    # Decided: the replacements its controller made meanwhile may go (or, the budget
    # spent, learn why they stay held). The periodic pass catches what this misses.
    try:
        await release_held(str(meta.get("namespace") or ""))
    except ApiError as e:
        log.info(f"releasing held pods after {meta.get('name')}: API error {e.status}")


async def _worker(pod: dict[str, Any], uid: str,
                  log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    """One rejected pod until it is decided. Waits (backoff, retries) are asyncio sleeps
    on the operator's event loop: any number of pods waiting out a backoff hold no
    thread and block nothing."""
    first_seen = time.time()
    meta = pod.get("metadata") or {}
    failures = 0
    try:
        while True:
            wait: float | None
            try:
                wait = await _one_pass(meta, first_seen)
                failures = 0
            except ApiError as e:
                if e.status == 404:
                    wait = None
                elif e.status == 409:  # a stale record: read again and retry at once
                    wait = 0.2
                else:
                    failures += 1
                    if failures >= API_GIVE_UP_AFTER:
                        log.warning(f"redeploy of {meta.get('name')}: giving up after "
                                    f"{failures} API errors: {e.status} {e.reason}")
                        try:
                            await give_up(pod, f"{failures} API errors in a row, the last: "
                                          f"{e.status} {e.reason} {e.message}", time.time())
                        except Exception as e2:  # the record stays: the next start retries
                            log.warning(f"redeploy of {meta.get('name')}: cannot record "
                                        f"giving up: {e2}")
                        wait = None
                    else:
                        wait = min(API_RETRY_MAX, API_RETRY_FIRST * 2 ** (failures - 1))
                        log.info(f"redeploy of {meta.get('name')}: API error {e.status}, "
                                 f"retrying in {wait:.0f}s: {e.reason} {e.message}")
            except RedeployRefused as e:  # the operator's own checks: never retried
                log.warning(f"redeploy of {meta.get('name')} refused: {e}")
                wait = None
            except Exception as e:  # a malformed object must not end the retries silently
                log.exception(f"redeploy of {meta.get('name')} failed, retrying: {e}")
                wait = 5.0
            if wait is None:
                break
            await asyncio.sleep(min(wait, MAX_SLEEP))
        await _release_after(meta, log)
    finally:
        _workers.pop(uid, None)


def _rejected(body: kopf.Body, **_: Any) -> bool:
    meta = body.get("metadata") or {}
    return (is_topology_rejected(body) and not meta.get("deletionTimestamp")
            and meta.get("namespace") not in PROTECTED_NAMESPACES)


@kopf.on.event("", "v1", "pods", id="redeploy", when=_rejected)
async def rejected_pod(body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
    uid = str(body.get("metadata", {}).get("uid", ""))
    if not uid or uid in _workers:
        return
    metrics.REJECTIONS.labels(node=str((body.get("spec") or {}).get("nodeName") or "")).inc()
    _workers[uid] = asyncio.create_task(_worker(dict(body), uid, logger))


@kopf.on.event("", "v1", "pods", id="redeploy-gate")
async def gated_pod(body: kopf.Body, type: str | None, **_: Any) -> None:
    """Remember held pods (for :func:`release_held`) and tell each why it is held."""
    meta = body.get("metadata") or {}
    uid = str(meta.get("uid", ""))
    if not has_gate(body):
        if cache.GATED.get(uid) is not None:
            cache.GATED.remove(body)
        return
    cache.feed(cache.GATED, body, type, cache.slim_gated)
    if type == "DELETED" or not uid:
        warned.pop(uid, None)
        return
    if warned.get(uid):
        return
    ns = str(meta.get("namespace") or "")
    pod = dict(body)
    wl = await workload_of(pod, ns)
    why = wl.hold(time.time()) if wl is not None else None
    if wl is not None and why is not None:
        await tell_once(pod, why, wl.state)


async def stop_workers() -> None:
    tasks = list(_workers.values())
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
