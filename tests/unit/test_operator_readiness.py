"""The operator's /readyz (the StatefulSet's readinessProbe): ready only while its webhook
server answers a TLS handshake that verifies against the webhook CA for the host name the
API server calls; 503 with the reason otherwise. Real sockets and real certificates."""

from __future__ import annotations

import asyncio
import datetime as dt
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from numalign.controller import readiness, webhooks

HOST = "numalign-webhook.numalign-system.svc"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _certs(tmp_path: Path, hosts: list[str]) -> Path:
    now = dt.datetime.now(dt.UTC)
    ca, ca_key = webhooks.make_ca(now)
    cert, key = webhooks.make_serving(ca, ca_key, hosts, now)
    for name, data in ((webhooks.CA_FILE, ca), (webhooks.CERT_FILE, cert),
                       (webhooks.KEY_FILE, key)):
        (tmp_path / name).write_bytes(data)
    return tmp_path


@asynccontextmanager
async def tls_server(cert_dir: Path, port: int) -> AsyncIterator[None]:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_dir / webhooks.CERT_FILE, cert_dir / webhooks.KEY_FILE)

    async def answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", port, ssl=ctx)
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


def test_ready_only_while_the_webhook_server_answers_as_the_service_host(
        tmp_path: Path) -> None:
    certs = _certs(tmp_path, [HOST])
    port = _free_port()
    check = readiness.WebhookCheck("0.0.0.0", port, HOST, certs / webhooks.CA_FILE)
    wrong_name = readiness.WebhookCheck("0.0.0.0", port, "other.numalign-system.svc",
                                        certs / webhooks.CA_FILE)
    (tmp_path / "other").mkdir()
    other_ca = _certs(tmp_path / "other", [HOST])  # the same name, another CA
    wrong_ca = readiness.WebhookCheck("0.0.0.0", port, HOST, other_ca / webhooks.CA_FILE)

    async def run() -> None:
        reason = await check()
        assert reason and f"127.0.0.1:{port}" in reason  # nothing listens yet
        async with tls_server(certs, port):
            assert await check() is None
            bad = await wrong_name()
            assert bad and "other.numalign-system.svc" in bad
            assert await wrong_ca() is not None
        assert await check() is not None  # stopped: not ready again

    asyncio.run(run())


def test_readyz_answers_200_or_503_with_the_reason(tmp_path: Path) -> None:
    certs = _certs(tmp_path, [HOST])
    webhook_port, ready_port = _free_port(), _free_port()
    check = readiness.WebhookCheck("127.0.0.1", webhook_port, HOST, certs / webhooks.CA_FILE)
    url = f"http://127.0.0.1:{ready_port}/readyz"

    async def get() -> tuple[int, str]:
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            return r.status, await r.text()

    async def run() -> None:
        runner = await readiness.start(url, check)
        try:
            status, text = await get()
            assert status == 503 and "not ready" in text and str(webhook_port) in text
            async with tls_server(certs, webhook_port):
                assert await get() == (200, "ok\n")
            # A second server on the same port is refused at start, not later.
            with pytest.raises(OSError):
                await readiness.start(url, check)
        finally:
            await runner.cleanup()

    asyncio.run(run())


def test_without_webhooks_it_is_ready_once_started() -> None:
    port = _free_port()
    url = f"http://127.0.0.1:{port}/readyz"

    async def run() -> None:
        runner = await readiness.start(url, None)
        try:
            async with aiohttp.ClientSession() as s, s.get(url) as r:
                assert r.status == 200
        finally:
            await runner.cleanup()

    asyncio.run(run())


@pytest.mark.parametrize("url", ["https://0.0.0.0:8081/readyz", "http://0.0.0.0/readyz",
                                 "0.0.0.0:8081"])
def test_a_bad_readiness_url_is_refused_naming_it(url: str) -> None:
    with pytest.raises(ValueError, match="--readiness"):
        readiness.parse_url(url)
