"""A synchronous facade over :class:`~numalign.api.kube.client.Kube`, for code that is
synchronous by nature (the dev cluster's bring-up, the ``explain`` command line).

Not a second client: each call runs the async client's coroutine on a private event
loop in a daemon thread (so it works from plain code and from inside another event
loop alike), with the same credentials, verbs, retries and :class:`ApiError`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

from .client import JSON, MERGE_PATCH, REQUEST_ERRORS, Kube
from .config import KubeConfig

T = TypeVar("T")


class SyncKube:
    """``Kube``'s verbs, blocking. Open on first use; :meth:`close` (or ``with``) ends
    the connection pool and the loop thread."""

    def __init__(self, config: KubeConfig, *, max_connections: int = 8,
                 user_agent: str = "numalign") -> None:
        self.kube = Kube(config, max_connections=max_connections, user_agent=user_agent)
        self.config = config
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> SyncKube:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="numalign-kube",
                                          daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
                self._submit(loop, self.kube.open()).result()
            return self._loop

    @staticmethod
    def _submit(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine of :attr:`kube` and wait for its result."""
        try:
            loop = self._start()
        except BaseException:
            coro.close()
            raise
        return self._submit(loop, coro).result()

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            self._submit(loop, self.kube.close()).result(timeout=10)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            loop.close()

    # -- the verbs ----------------------------------------------------------------------

    def request(self, method: str, path: str, **kw: Any) -> JSON:
        """One request, no retries (a readiness probe wants the first answer)."""
        return self.run(self.kube.request(method, path, **kw))

    def get(self, path: str, params: Mapping[str, str] | None = None) -> JSON:
        return self.run(self.kube.get(path, params))

    def get_or_none(self, path: str, params: Mapping[str, str] | None = None) -> JSON | None:
        return self.run(self.kube.get_or_none(path, params))

    def list_all(self, path: str, params: Mapping[str, str] | None = None
                 ) -> tuple[list[JSON], str]:
        return self.run(self.kube.list_all(path, params))

    def create(self, path: str, body: JSON) -> JSON:
        return self.run(self.kube.create(path, body))

    def put(self, path: str, body: JSON) -> JSON:
        return self.run(self.kube.put(path, body))

    def patch(self, path: str, body: Any, kind: str = MERGE_PATCH) -> JSON:
        return self.run(self.kube.patch(path, body, kind))

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        return self.run(self.kube.delete(path, body))

    def get_quiet(self, path: str, timeout: float = 5.0) -> JSON | None:
        """GET ``path`` once; None on any API or connection error (a poll's "not yet")."""
        try:
            return self.request("GET", path, timeout=timeout)
        except REQUEST_ERRORS:
            return None

    def ok(self, path: str, timeout: float = 5.0) -> bool:
        """Whether GET ``path`` answers 2xx now (False on any error)."""
        try:
            self.request("GET", path, timeout=timeout)
        except Exception:  # any failure means "not yet"
            return False
        return True
