"""List then watch, forever, through the one client: the informer loop every long-running
reader needs (a full listing, then the events from its resourceVersion; a watch that ends
resumes where it stopped; ``410 Gone``, an error event or a failed request lists again).
The agent (emulated nodes, the real node's pods and NodeTopology, the NRI node's Node)
and the scheduler extender all read through it."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .client import JSON, TRANSPORT_ERRORS, ApiError, Kube

log = logging.getLogger("numalign.kube")

OnList = Callable[[list[JSON]], Awaitable[None] | None]
OnEvent = Callable[[str, JSON], None]


async def list_watch(kube: Kube, path: str, on_list: OnList, on_event: OnEvent, *,
                     params: Mapping[str, str] | None = None, since: str | None = None,
                     metadata_only: bool = False, retry: float = 1.0,
                     max_retry: float | None = None, timeout_seconds: int = 300) -> None:
    """Run until cancelled: ``on_list(items)`` (a function or a coroutine function) after
    each full listing, ``on_event(type, object)`` for each ADDED/MODIFIED/DELETED event
    (bookmarks only move the resourceVersion on). ``since``: the resourceVersion of a
    listing the caller made itself (the first one is skipped). ``metadata_only``: watch
    PartialObjectMetadata. Errors are logged and retried after ``retry`` seconds, doubled
    while they go on up to ``max_retry`` (default: ``retry``); an exception from
    ``on_event`` is logged with the object's name and the watch goes on."""
    base = dict(params or {})
    rv: str | None = since
    wait = retry
    while True:
        try:
            if rv is None:
                items, rv = await kube.list_all(path, base)
                done = on_list(items)
                if inspect.isawaitable(done):
                    await done
            async for ev in kube.watch(path, {**base, "resourceVersion": rv},
                                       timeout_seconds=timeout_seconds,
                                       metadata_only=metadata_only):
                wait = retry
                typ = str(ev.get("type") or "")
                obj: Any = ev.get("object") or {}
                if typ == "ERROR":
                    code = obj.get("code") if isinstance(obj, Mapping) else None
                    raise ApiError(int(code or 500), obj, "WATCH", path)
                meta = obj.get("metadata") if isinstance(obj, Mapping) else None
                new_rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
                if new_rv:
                    rv = str(new_rv)
                if typ != "BOOKMARK" and isinstance(obj, Mapping):
                    try:
                        on_event(typ, dict(obj))
                    except Exception:  # one bad object must not stop the watch
                        m = meta if isinstance(meta, Mapping) else {}
                        log.exception("watch %s: %s event of %s/%s not handled; skipped",
                                      path, typ, m.get("namespace"), m.get("name"))
                # one event at a time: a chunk of the stream can hold hundreds, and
                # whoever shares the loop (the extender's verbs, inside a pod's
                # scheduling cycle) must not wait for all of them
                await asyncio.sleep(0)
            continue
        except asyncio.CancelledError:
            raise
        except ApiError as e:
            if e.status == 410:
                rv = None  # too old: list again at once
                continue
            log.warning("watch %s: %s; listing again in %.0fs", path, e, wait)
            rv = None
        except (*TRANSPORT_ERRORS, ValueError) as e:
            log.warning("watch %s interrupted: %s; again in %.0fs", path, e, wait)
        await asyncio.sleep(wait)
        wait = min(max_retry if max_retry is not None else retry, wait * 2)
