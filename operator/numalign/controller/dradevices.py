"""The cluster's ResourceSlices and DeviceClasses as the ``numa-constraint`` webhook
reads them (:mod:`numalign.controller.claims`): one paged LIST of each, kept
:data:`TTL_SECONDS` and shared by the claims created meanwhile.

Cheap and bounded: a burst of claims (a Job's pods, a Deployment scaled up) costs one
LIST of each kind per :data:`TTL_SECONDS`, not one per claim; pages of :data:`PAGE`, at
most :data:`MAX_SLICES` slices and :data:`MAX_CLASSES` classes (past them the listing is
incomplete, which gives no constraint); the whole read is bounded by
:data:`READ_TIMEOUT_SECONDS`, well within the webhook's own timeout. One LIST of all
slices rather than one per driver the classes name: a class whose selectors are outside
the CEL subset names no driver, and then every slice is needed anyway.

A failed read is kept for the same time (as None: the claims go unchanged), so that an
API server in trouble is not asked again by every claim, and the webhook answers at once.
A slice or class published less than :data:`TTL_SECONDS` ago may not be seen yet: a class
not seen gives no constraint; a new slice without the attribute, behind a class whose
other devices all publish it, could be left out by the constraint for those seconds (the
claim is still allocated on the others).

Needs RBAC ``list`` on ``resourceslices`` and ``deviceclasses`` (resource.k8s.io), in
config/rbac/operator_role.yaml and the chart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp

from numalign.api.draclaims import DRA_API
from numalign.api.draconstraint import MAX_CLASSES, ClusterDevices, cluster_devices
from numalign.api.kube import ApiError

from . import connection

log = logging.getLogger(__name__)

SLICES_PATH = f"{DRA_API}/resourceslices"
CLASSES_PATH = f"{DRA_API}/deviceclasses"
TTL_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 2.0
PAGE = 500
MAX_SLICES = 4_000

JSON = dict[str, Any]


class _Kept:
    """The last read (None: it failed), when it was made, and on which event loop."""

    def __init__(self) -> None:
        self.value: ClusterDevices | None = None
        self.at = -1e9
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lock: asyncio.Lock | None = None


_kept = _Kept()


def forget() -> None:
    """Drop what was read (the next claim reads afresh)."""
    global _kept
    _kept = _Kept()


async def _list(path: str, bound: int) -> tuple[list[JSON], bool]:
    """The items of ``path``, paged; False second when there were more than ``bound``."""
    kube = connection.client()
    params = {"limit": str(PAGE)}
    items: list[JSON] = []
    while True:
        doc = await kube.get(path, params)
        got = doc.get("items")
        if isinstance(got, list):
            items.extend(i for i in got if isinstance(i, dict))
        meta = doc.get("metadata")
        cont = meta.get("continue") if isinstance(meta, dict) else None
        if not cont:
            return items, True
        if len(items) >= bound:
            return items[:bound], False
        params["continue"] = str(cont)


async def _read() -> ClusterDevices:
    slices, whole_slices = await _list(SLICES_PATH, MAX_SLICES)
    classes, whole_classes = await _list(CLASSES_PATH, MAX_CLASSES)
    return cluster_devices(slices, classes, whole_slices and whole_classes)


async def cluster() -> ClusterDevices | None:
    """The cluster's devices and classes, read at most :data:`TTL_SECONDS` ago; None
    when that read failed (logged)."""
    loop = asyncio.get_running_loop()
    kept = _kept
    if kept.loop is not loop:
        kept.loop, kept.lock, kept.at = loop, asyncio.Lock(), -1e9
    assert kept.lock is not None
    async with kept.lock:
        if time.monotonic() - kept.at < TTL_SECONDS:
            return kept.value
        try:
            kept.value = await asyncio.wait_for(_read(), READ_TIMEOUT_SECONDS)
        except (ApiError, OSError, TimeoutError, ValueError, aiohttp.ClientError) as e:
            log.warning("numa-constraint: ResourceSlices and DeviceClasses not read (%s); "
                        "claims created in the next %.0f s get no NUMA constraint",
                        str(e) or type(e).__name__, TTL_SECONDS)
            kept.value = None
        kept.at = time.monotonic()
        return kept.value


__all__ = ["CLASSES_PATH", "SLICES_PATH", "TTL_SECONDS", "cluster", "forget"]
