"""The operator's admission webhook server, over TLS on a real socket, as any client that
reaches its port sees it: a review whose object is in another namespace than the review
names is refused before any handler reads anything; a body over the size limit is
refused unread; a review not answered in time (a slow handler, a body sent slowly) is
given up with a 503 within the bound, its work cancelled."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from numalign.controller import webhookconfig, webhooks

Fn = Callable[..., Awaitable[Any]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _certs(cert_dir: Path) -> Path:
    now = dt.datetime.now(dt.UTC)
    ca, ca_key = webhooks.make_ca(now)
    cert, key = webhooks.make_serving(ca, ca_key, ["127.0.0.1"], now)
    cert_dir.mkdir()
    for name, data in ((webhooks.CA_FILE, ca), (webhooks.CERT_FILE, cert),
                       (webhooks.KEY_FILE, key)):
        (cert_dir / name).write_bytes(data)
    return cert_dir


@asynccontextmanager
async def serving(cert_dir: Path, fn: Fn) -> AsyncIterator[tuple[int, ssl.SSLContext]]:
    port = _free_port()
    server = webhooks.server("127.0.0.1", port, "127.0.0.1", cert_dir)
    served: Any = server(fn)  # an async generator: closed below
    await served.__anext__()  # listening
    try:
        yield port, ssl.create_default_context(cafile=str(cert_dir / webhooks.CA_FILE))
    finally:
        await served.aclose()


def review(namespace: str | None, object_namespace: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p", "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "controller": True,
         "uid": "0b3c5d8e-0000-4000-8000-000000000001"}]}
    if object_namespace is not None:
        meta["namespace"] = object_namespace
    req: dict[str, Any] = {
        "uid": "review-1", "operation": "CREATE",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "userInfo": {"username": "attacker"},
        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                   "spec": {"containers": [{"name": "c", "image": "i"}]}}}
    if namespace is not None:
        req["namespace"] = namespace
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


class Recorder:
    """A stand-in for Kopf's admission handling: records what it was given."""

    def __init__(self, delay: float = 0.0) -> None:
        self.seen: list[dict[str, Any]] = []
        self.cancelled = False
        self.delay = delay

    async def __call__(self, data: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.seen.append(data)
        try:
            await asyncio.sleep(self.delay)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": data["request"]["uid"], "allowed": True}}


async def _post(port: int, ctx: ssl.SSLContext, body: bytes) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(
            f"https://127.0.0.1:{port}/resolve", data=body, ssl=ctx,
            headers={"Content-Type": "application/json"}) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


@pytest.mark.parametrize(("namespace", "object_namespace"), [
    ("attacker", "victim"),   # the object claims another namespace
    (None, "victim"),         # a namespaced object, the review names none
])
def test_a_review_about_another_namespace_is_refused_unread(
        tmp_path: Path, namespace: str | None, object_namespace: str) -> None:
    handler = Recorder()

    async def run() -> tuple[int, Any]:
        async with serving(_certs(tmp_path / "certs"), handler) as (port, ctx):
            return await _post(port, ctx, json.dumps(review(namespace, object_namespace))
                               .encode())

    status, answer = asyncio.run(run())
    assert status == 200
    assert answer["response"]["uid"] == "review-1"
    assert answer["response"]["allowed"] is False
    message = answer["response"]["status"]["message"]
    assert "request.object.metadata.namespace 'victim'" in message
    assert f"request.namespace {namespace or ''!r}" in message
    assert handler.seen == [], "the handlers ran for a review about another namespace"


def test_a_review_in_its_own_namespace_reaches_the_handlers(tmp_path: Path) -> None:
    """The object of a controller's pod (generateName) arrives without a namespace: it
    is the review's; a cluster-scoped object has none at all."""
    handler = Recorder()

    async def run() -> list[int]:
        async with serving(_certs(tmp_path / "certs"), handler) as (port, ctx):
            out = []
            for ns, obj_ns in (("team-a", None), ("team-a", "team-a"), (None, None)):
                status, answer = await _post(port, ctx, json.dumps(review(ns, obj_ns))
                                             .encode())
                assert answer["response"]["allowed"] is True, answer
                out.append(status)
            return out

    assert asyncio.run(run()) == [200, 200, 200]
    namespaces = [r["request"]["object"]["metadata"].get("namespace") for r in handler.seen]
    assert namespaces == ["team-a", "team-a", None]


def test_a_body_over_the_limit_is_refused_unread(tmp_path: Path) -> None:
    handler = Recorder()
    big = review("team-a", None)
    big["request"]["object"]["metadata"]["annotations"] = {
        "x": "y" * webhooks.MAX_REVIEW_BYTES}

    async def run() -> tuple[int, Any]:
        async with serving(_certs(tmp_path / "certs"), handler) as (port, ctx):
            return await _post(port, ctx, json.dumps(big).encode())

    status, _ = asyncio.run(run())
    assert status == 413
    assert handler.seen == []
    # The bound holds for a pod's review: a pod is far below it.
    assert json.dumps(review("team-a", None)).encode().__len__() < webhooks.MAX_REVIEW_BYTES


def test_a_slow_review_is_given_up_within_the_bound(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """What the API server would no longer wait for is not worked on: the handler is
    cancelled and the client gets a 503 (which failurePolicy Ignore treats as a time-out)
    once the bound passed."""
    monkeypatch.setattr(webhooks, "REVIEW_TIMEOUT_S", 0.5)
    handler = Recorder(delay=30)

    async def run() -> tuple[int, float]:
        async with serving(_certs(tmp_path / "certs"), handler) as (port, ctx):
            t0 = time.monotonic()
            status, _ = await _post(port, ctx, json.dumps(review("team-a", None)).encode())
            return status, time.monotonic() - t0

    status, took = asyncio.run(run())
    assert status == 503
    assert took < 3, f"answered after {took:.1f}s"
    assert len(handler.seen) == 1 and handler.cancelled
    # The real bound is the webhooks' own timeout: no later than the API server waits.
    assert webhooks.MAX_REVIEW_BYTES == 1024 ** 2
    assert 0 < float(webhookconfig.TIMEOUT_SECONDS) <= 5


def test_a_body_sent_slowly_holds_the_server_no_longer_than_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webhooks, "REVIEW_TIMEOUT_S", 0.5)
    handler = Recorder()

    async def run() -> tuple[bytes, float]:
        async with serving(_certs(tmp_path / "certs"), handler) as (port, ctx):
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1")
            t0 = time.monotonic()
            writer.write(b"POST /resolve HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
            await writer.drain()
            line = await asyncio.wait_for(reader.readline(), 10)
            took = time.monotonic() - t0
            writer.close()
            return line, took

    line, took = asyncio.run(run())
    assert line.startswith(b"HTTP/1.1 503"), line
    assert took < 3, f"answered after {took:.1f}s"
    assert handler.seen == []
