"""``/readyz``: the operator is ready when it can serve its admission webhooks.

A replica is put behind the webhook Service only when a TLS handshake with its own
webhook server succeeds the way the API server's would: the server listens (Kopf opens it
once the cluster's resources are scanned), its certificate chains to the CA the webhook
configurations carry and names the host the API server calls (``NAME.NAMESPACE.svc``
behind a Service). Each probe makes one handshake, bounded by :data:`HANDSHAKE_TIMEOUT`.
Served on its own port (``--readiness``; Kopf's liveness server serves ``/healthz``) from
the operator's start-up handler, after the certificates and the webhook configurations
are written: until then the port is closed and the probe fails.

With ``--no-webhooks`` there is nothing to serve: ready once started.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import web

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 3.0


@dataclass(frozen=True)
class WebhookCheck:
    """Where the replica's own webhook server listens and whom it must prove to be."""
    addr: str  # the listen address; 0.0.0.0 / :: are reached on the loopback
    port: int
    server_name: str  # the host name (or IP) the API server verifies
    ca_file: Path

    def _connect_host(self) -> str:
        if self.addr in ("0.0.0.0", ""):
            return "127.0.0.1"
        if self.addr == "::":
            return "::1"
        return self.addr

    async def __call__(self) -> str | None:
        """None when a verified handshake succeeds, else why not."""
        try:
            ctx = ssl.create_default_context(cafile=str(self.ca_file))
        except (OSError, ssl.SSLError) as e:
            return f"webhook CA {self.ca_file}: {e}"
        host = self._connect_host()
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(
                host, self.port, ssl=ctx, server_hostname=self.server_name),
                HANDSHAKE_TIMEOUT)
        except (OSError, ssl.SSLError, TimeoutError) as e:
            return (f"webhook server {host}:{self.port} (as {self.server_name}): "
                    f"{e or type(e).__name__}")
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), HANDSHAKE_TIMEOUT)
        return None


async def _nothing_to_check() -> str | None:
    return None


def parse_url(url: str) -> tuple[str, int, str]:
    """``http://ADDR:PORT/PATH`` -> (addr, port, path); ValueError naming the problem."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or parts.port is None:
        raise ValueError(f"--readiness {url!r}: expected http://ADDR:PORT/PATH")
    return parts.hostname, parts.port, parts.path or "/readyz"


async def start(url: str, check: WebhookCheck | None) -> web.AppRunner:
    """Serve ``GET PATH`` at ``url`` (until the returned runner is cleaned up): 200 ``ok``
    when ``check`` passes, 503 with the reason otherwise. A taken port raises OSError."""
    addr, port, path = parse_url(url)
    probe = check or _nothing_to_check
    last: list[str | None] = ["not probed yet"]

    async def readyz(_: web.Request) -> web.Response:
        reason = await probe()
        if reason != last[0]:
            if reason:
                log.warning(f"not ready: {reason}")
            else:
                log.info("ready: the webhook server answers")
            last[0] = reason
        if reason:
            return web.Response(status=503, text=f"not ready: {reason}\n")
        return web.Response(text="ok\n")

    app = web.Application()
    app.add_routes([web.get(path, readyz)])
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, addr, port, reuse_address=True).start()
    except BaseException:
        await runner.cleanup()
        raise
    log.info(f"readiness on http://{addr}:{port}{path}")
    return runner
