"""The Kopf handlers of redeploy: one worker per rejected pod, and the held pods' watch."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from .. import cache, kube, metrics
from .decide import step
from .gating import release_held, tell_once, warned, workload_of
from .record import has_gate, is_topology_rejected

# ---------------------------------------------------------------------------
# Kopf handler
#
# Not a kopf daemon: daemons (and timers) make Kopf put a finalizer on every object they
# serve, and a finalizer on pods would block their deletion while the operator is down.
# An event handler schedules one worker per rejected pod uid instead; on restart (or
# when a standby takes over) the initial listing schedules the pending ones again, and
# the durable decision in the ConfigMap makes a replay harmless.

_workers: dict[str, asyncio.Task[None]] = {}


def _run_worker(pod: Mapping[str, Any], stop: threading.Event,
                log: logging.Logger | logging.LoggerAdapter[Any]) -> None:
    first_seen = time.time()
    meta = pod.get("metadata") or {}
    while not stop.is_set():
        wait: float | None
        try:
            fresh = kube.to_dict(kube.core().read_namespaced_pod(meta["name"], meta["namespace"]))
            if fresh["metadata"].get("uid") != meta.get("uid") or not is_topology_rejected(fresh):
                wait = None
            else:
                wait = step(fresh, first_seen)
        except ApiException as e:
            if e.status == 404:
                wait = None
            else:
                log.info(f"redeploy of {meta.get('name')}: API error {e.status}, "
                         f"retrying: {e.reason}")
                wait = 1.0
        except Exception as e:  # a malformed object must not end the retries silently
            log.exception(f"redeploy of {meta.get('name')} failed, retrying: {e}")
            wait = 5.0
        if wait is None:
            break
        stop.wait(min(wait, 60.0))
    else:
        return
    # Decided: the replacements its controller made meanwhile may go (or, the budget
    # spent, learn why they stay held). The periodic pass catches what this misses.
    try:
        release_held(str(meta.get("namespace") or ""))
    except ApiException as e:
        log.info(f"releasing held pods after {meta.get('name')}: API error {e.status}")


async def _worker(pod: dict[str, Any], uid: str, log: kopf.Logger) -> None:
    stop = threading.Event()
    try:
        await asyncio.to_thread(_run_worker, pod, stop, log)
    except asyncio.CancelledError:
        stop.set()
        raise
    finally:
        _workers.pop(uid, None)


def _rejected(body: kopf.Body, **_: Any) -> bool:
    return is_topology_rejected(body) and not (body.get("metadata") or {}).get(
        "deletionTimestamp")


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

    def tell() -> None:
        wl = workload_of(pod, ns)
        why = wl.hold(time.time()) if wl is not None else None
        if wl is not None and why is not None:
            tell_once(pod, why, wl.state)

    await asyncio.to_thread(tell)


async def stop_workers() -> None:
    tasks = list(_workers.values())
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
