"""A small asyncio Kubernetes API client on aiohttp, for the node agent.

The agent needs few verbs (get, list, create, patch, delete, watch) but many of them at
once: one process plays the kubelet for a hundred emulated nodes. aiohttp with a shared
connection pool keeps that cheap; the credentials come from the official client's
kubeconfig / in-cluster loaders so every kubeconfig form they support works here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp

log = logging.getLogger(__name__)

JSON = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
# Objects as their metadata alone (plain JSON where a server cannot do that).
METADATA_ONLY = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"


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
        if isinstance(self.body, dict):
            return str(self.body.get("reason") or "")
        return ""


@dataclass
class KubeConfig:
    host: str
    ssl_context: ssl.SSLContext | bool
    token_source: Any = None  # callable returning "Bearer ..." or None
    extra_headers: dict[str, str] = field(default_factory=dict)

    def auth_header(self) -> str | None:
        if self.token_source is None:
            return None
        value = self.token_source()
        return str(value) if value else None


def load_config(kubeconfig: str | None = None, context: str | None = None) -> KubeConfig:
    """Credentials from ``kubeconfig``, else $KUBECONFIG / ~/.kube/config, else in-cluster."""
    from kubernetes import client as kclient
    from kubernetes import config as kconfig

    conf = kclient.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
    default = os.path.expanduser("~/.kube/config")
    if path is None and os.path.exists(default):
        path = default
    if path is not None:
        kconfig.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, context=context, client_configuration=conf)
    else:
        kconfig.load_incluster_config(client_configuration=conf)  # type: ignore[no-untyped-call]
    ctx: ssl.SSLContext | bool
    if conf.verify_ssl:
        ctx = ssl.create_default_context(cafile=conf.ssl_ca_cert)
    else:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if conf.cert_file and isinstance(ctx, ssl.SSLContext):
        ctx.load_cert_chain(conf.cert_file, conf.key_file)

    def token() -> str | None:
        value = conf.get_api_key_with_prefix("authorization")
        return str(value) if value else None

    return KubeConfig(host=conf.host.rstrip("/"), ssl_context=ctx, token_source=token)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class Kube:
    """The API calls the agent makes. Paths are absolute API paths (``/api/v1/...``)."""

    def __init__(self, config: KubeConfig, *, max_connections: int = 32,
                 user_agent: str = "numalign-agent") -> None:
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
            conn = aiohttp.TCPConnector(ssl=self.config.ssl_context, limit=self._max_connections)
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

    async def request(self, method: str, path: str, *, body: Any = None,
                      params: Mapping[str, str] | None = None,
                      content_type: str = "application/json",
                      timeout: float = 30.0, decode: bool = True) -> JSON:
        """One request; the response's JSON object (``{}`` without ``decode``: a write
        whose answer is not needed skips parsing the whole object it returns)."""
        data = _dumps(body) if body is not None else None
        self._requests += 1
        async with self.session.request(
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
                if e.status not in (429, 500, 502, 503, 504) or attempt == retries:
                    raise
            except (TimeoutError, aiohttp.ClientError):
                if attempt == retries:
                    raise
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> JSON:
        return await self.call("GET", path, params=params)

    async def list_all(self, path: str, params: Mapping[str, str] | None = None,
                       page: int = 500) -> tuple[list[JSON], str]:
        """Every item of a list, paged; also the list's resourceVersion."""
        items: list[JSON] = []
        p = dict(params or {})
        p["limit"] = str(page)
        rv = ""
        while True:
            doc = await self.get(path, p)
            items.extend(doc.get("items") or [])
            meta = doc.get("metadata") or {}
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
        async with self.session.get(
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
