"""List then watch, forever, through the one client: the informer loop every long-running
reader needs (a full listing, then the events from its resourceVersion; a watch that ends
resumes where it stopped; ``410 Gone`` or a failed listing lists again)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from .client import JSON, TRANSPORT_ERRORS, ApiError, Kube

log = logging.getLogger("numalign.kube")

OnList = Callable[[list[JSON]], None]
OnEvent = Callable[[str, JSON], None]


async def list_watch(kube: Kube, path: str, on_list: OnList, on_event: OnEvent, *,
                     params: Mapping[str, str] | None = None, retry: float = 1.0,
                     timeout_seconds: int = 300) -> None:
    """Run until cancelled: ``on_list(items)`` after each full listing, ``on_event(type,
    object)`` for each ADDED/MODIFIED/DELETED event (bookmarks only move the
    resourceVersion on). Errors are logged and retried after ``retry`` seconds; an
    exception from ``on_event`` is logged and the watch goes on."""
    base = dict(params or {})
    rv: str | None = None
    while True:
        try:
            if rv is None:
                items, rv = await kube.list_all(path, base)
                on_list(items)
            async for ev in kube.watch(path, {**base, "resourceVersion": rv},
                                       timeout_seconds=timeout_seconds):
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
                        log.exception("watch %s: %s event not handled", path, typ)
        except asyncio.CancelledError:
            raise
        except ApiError as e:
            if e.status == 410:
                rv = None  # too old: list again
                continue
            log.warning("watch %s: %s", path, e)
            rv = None
            await asyncio.sleep(retry)
        except (*TRANSPORT_ERRORS, ValueError) as e:
            log.warning("watch %s interrupted: %s", path, e)
            await asyncio.sleep(retry)
