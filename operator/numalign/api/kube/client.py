"""The one Kubernetes API client of numalign: asyncio on aiohttp.

Agent, operator, dev cluster and ``explain`` all talk to the API server through
:class:`Kube` (the synchronous code through :mod:`numalign.api.kube.sync`, a facade over
it). Few verbs (get, list, create, patch, delete, watch, events), many of them at once:
one agent process plays the kubelet for a hundred emulated nodes, so a shared connection
pool keeps that cheap. Every non-2xx answer is an :class:`ApiError`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any
from urllib.parse import quote

import aiohttp

from .config import KubeConfig

log = logging.getLogger(__name__)

JSON = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
# Objects as their metadata alone (plain JSON where a server cannot do that).
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
RETRY_STATUSES = (429, 500, 502, 503, 504)
# What a request raises when the API server cannot be reached (or does not answer in time).
TRANSPORT_ERRORS = (OSError, TimeoutError, aiohttp.ClientError)


class ApiError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, body: Any, method: str = "", path: str = "") -> None:
        self.status = status
        self.body = body
        self.method = method
        self.path = path
        msg = body.get("message") if isinstance(body, dict) else str(body)[:300]
        super().__init__(f"{method} {path}: {status} {msg}")

    @property
    def reason(self) -> str:
        """The Status reason (``NotFound``, ``AlreadyExists``, ``Conflict``...), or ""."""
        if isinstance(self.body, dict):
            return str(self.body.get("reason") or "")
        return ""

    @property
    def message(self) -> str:
        if isinstance(self.body, dict):
            return str(self.body.get("message") or "")
        return str(self.body)[:300]


# Everything a request may raise: an answer that is an error, or no answer.
REQUEST_ERRORS = (ApiError, *TRANSPORT_ERRORS)


def is_status(e: BaseException, *codes: int) -> bool:
    """Whether ``e`` is an API answer with one of these HTTP statuses."""
    return isinstance(e, ApiError) and e.status in codes


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class Kube:
    """An API client on one connection pool. Paths are absolute API paths
    (``/api/v1/...``); bodies and answers are the API's JSON."""

    def __init__(self, config: KubeConfig, *, max_connections: int = 32,
                 user_agent: str = "numalign") -> None:
        self.config = config
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._user_agent = user_agent
        self._requests = 0
        self._lanes: list[Kube] = []

    def lane(self, max_connections: int) -> Kube:
        """Another client on the same credentials with its own connection pool, opened
        and closed with this one: work on it cannot take connections from this one's
        (background writes next to latency-critical ones). Its requests count in
        ``requests``."""
        other = Kube(self.config, max_connections=max_connections,
                     user_agent=self._user_agent)
        self._lanes.append(other)
        return other

    @property
    def requests(self) -> int:
        """API requests made so far (lanes included)."""
        return self._requests + sum(lane.requests for lane in self._lanes)

    async def __aenter__(self) -> Kube:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        if self._session is None:
            conn = aiohttp.TCPConnector(ssl=self.config.ssl_context(),
                                        limit=self._max_connections)
            self._session = aiohttp.ClientSession(
                connector=conn, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10))
        for lane in self._lanes:
            await lane.open()

    async def close(self) -> None:
        for lane in self._lanes:
            await lane.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _headers(self, content_type: str | None = None,
                 accept: str = "application/json") -> dict[str, str]:
        h = {"Accept": accept, "User-Agent": self._user_agent}
        h.update(self.config.extra_headers)
        auth = self.config.auth_header()
        if auth:
            h["Authorization"] = auth
        if content_type:
            h["Content-Type"] = content_type
        return h

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("Kube client is not open")
        return self._session

    async def _open_session(self) -> aiohttp.ClientSession:
        """The session, opened on first use (in the event loop that uses it)."""
        if self._session is None:
            await self.open()
        return self.session

    async def request(self, method: str, path: str, *, body: Any = None,
                      params: Mapping[str, str] | None = None,
                      content_type: str = "application/json",
                      timeout: float = 30.0, decode: bool = True) -> JSON:
        """One request; the response's JSON object (``{}`` without ``decode``: a write
        whose answer is not needed skips parsing the whole object it returns)."""
        data = _dumps(body) if body is not None else None
        self._requests += 1
        session = await self._open_session()
        async with session.request(
            method, self.config.host + path, params=params, data=data,
            headers=self._headers(content_type if data is not None else None),
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as resp:
            raw = await resp.read()
            if not decode and resp.status < 300:
                return {}
            try:
                doc: Any = json.loads(raw) if raw else {}
            except ValueError:
                doc = raw.decode(errors="replace")
            if resp.status >= 300:
                raise ApiError(resp.status, doc, method, path)
            return doc if isinstance(doc, dict) else {}

    async def call(self, method: str, path: str, *, retries: int = 5, **kw: Any) -> JSON:
        """``request`` with retries on throttling, server errors and connection trouble."""
        delay = 0.2
        for attempt in range(retries + 1):
            try:
                return await self.request(method, path, **kw)
            except ApiError as e:
                if e.status not in RETRY_STATUSES or attempt == retries:
                    raise
            except (TimeoutError, aiohttp.ClientError):
                if attempt == retries:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> JSON:
        return await self.call("GET", path, params=params)

    async def get_or_none(self, path: str, params: Mapping[str, str] | None = None
                          ) -> JSON | None:
        """GET; None when the object (or its kind) does not exist (404)."""
        try:
            return await self.get(path, params)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def list_all(self, path: str, params: Mapping[str, str] | None = None,
                       page: int = 500, keep: Callable[[JSON], JSON | None] | None = None
                       ) -> tuple[list[JSON], str]:
        """Every item of a list, paged; also the list's resourceVersion. ``keep``: what is
        kept of each item (None drops it), applied page by page, so that a large list is
        never held whole."""
        items: list[JSON] = []
        p = dict(params or {})
        p["limit"] = str(page)
        rv = ""
        while True:
            doc = await self.get(path, p)
            batch = doc.get("items") or []
            items.extend(batch if keep is None else
                         (k for k in map(keep, batch) if k is not None))
            meta = doc.get("metadata") or {}
            del doc, batch  # the next page is read without this one
            rv = str(meta.get("resourceVersion") or rv)
            cont = meta.get("continue")
            if not cont:
                return items, rv
            p["continue"] = str(cont)

    async def create(self, path: str, body: JSON) -> JSON:
        return await self.call("POST", path, body=body)

    async def patch(self, path: str, body: Any, kind: str = MERGE_PATCH, *,
                    decode: bool = True) -> JSON:
        return await self.call("PATCH", path, body=body, content_type=kind, decode=decode)

    async def put(self, path: str, body: JSON) -> JSON:
        return await self.call("PUT", path, body=body)

    async def delete(self, path: str, body: JSON | None = None) -> JSON:
        return await self.call("DELETE", path, body=body)

    async def event(self, obj: Mapping[str, Any], type_: str, *, reason: str, message: str,
                    component: str = "numalign", instance: str | None = None) -> bool:
        """Post a core/v1 Event about ``obj`` (``instance``: the reporting replica, e.g.
        its pod's name). Best effort: False (logged) when it could not be posted, never
        raises for an API or connection error."""
        meta = obj.get("metadata") or {}
        ns = str(meta.get("namespace") or "default")
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta.get('name', 'numalign')}.{uuid.uuid4().hex[:12]}",
                         "namespace": ns},
            "involvedObject": {"apiVersion": obj.get("apiVersion", "v1"),
                               "kind": obj.get("kind", "Pod"), "name": meta.get("name"),
                               "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": component},
            "reportingComponent": f"numalign.io/{component.removeprefix('numalign-')}",
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        if instance:
            body["reportingInstance"] = instance
        try:
            await self.create(f"/api/v1/namespaces/{q(ns)}/events", body)
        except REQUEST_ERRORS as e:
            log.debug(f"cannot post event {reason}: {e}")
            return False
        return True

    async def watch(self, path: str, params: Mapping[str, str] | None = None,
                    timeout_seconds: int = 300, *,
                    metadata_only: bool = False) -> AsyncIterator[JSON]:
        """Events of one watch request (ends when the server closes it). With
        ``metadata_only`` the objects are PartialObjectMetadata (metadata alone: no spec,
        no status), where the server can send that."""
        p = dict(params or {})
        p["watch"] = "1"
        p.setdefault("allowWatchBookmarks", "true")
        p["timeoutSeconds"] = str(timeout_seconds)
        self._requests += 1
        accept = METADATA_ONLY if metadata_only else "application/json"
        session = await self._open_session()
        async with session.get(
            self.config.host + path, params=p, headers=self._headers(accept=accept),
            timeout=aiohttp.ClientTimeout(total=timeout_seconds + 30,
                                          sock_read=timeout_seconds + 30),
        ) as resp:
            if resp.status >= 300:
                raw = await resp.read()
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                raise ApiError(resp.status, body, "WATCH", path)
            buf = b""
            async for chunk in resp.content.iter_any():
                if b"\n" not in chunk:
                    buf += chunk
                    continue
                lines = (buf + chunk).split(b"\n")
                buf = lines.pop()
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
            if buf.strip():
                yield json.loads(buf)


def q(name: str) -> str:
    return quote(name, safe="")


def pod_path(namespace: str, name: str, sub: str = "") -> str:
    base = f"/api/v1/namespaces/{q(namespace)}/pods/{q(name)}"
    return f"{base}/{sub}" if sub else base


NT_BASE = "/apis/numalign.io/v1alpha1/nodetopologies"


def nt_path(name: str, sub: str = "") -> str:
    base = f"{NT_BASE}/{q(name)}"
    return f"{base}/{sub}" if sub else base
