"""What one client may cost the extender: time to send a request, connections held, and
the size and shape of a body.

- A connection that has not sent a whole request head within ``header_timeout`` seconds
  (from when it opened, or since its last answer) is closed: aiohttp's idle timeout
  (``keepalive_timeout``), which also runs from the connection's start. A body has
  ``body_timeout`` seconds to arrive (:meth:`Limits.read`); a TLS handshake
  ``handshake_timeout``.
- At most ``max_connections`` connections are served at once per listener; one more
  closes the oldest of the client address holding the most (handshaking ones are
  bounded by their deadline).
- A body is refused before it is parsed when it is larger than ``max_body`` bytes or
  holds more JSON values than ``max_body / BYTES_PER_VALUE``: a small body of tiny
  values (``[[],[],...]``) would otherwise parse to ~20 times its size.

The probes and ``/metrics`` are served on a listener of their own (plain HTTP: the
kubelet and Prometheus present no client certificate), so a client holding the verbs'
connections cannot starve the liveness probe.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web

DEFAULT_MAX_BODY = 4 << 20  # Pod + NodeNames (nodeCacheCapable) of a 5,000-node cluster
BYTES_PER_VALUE = 16  # real ExtenderArgs average more (names, quoted keys and values)


class BodyRefused(Exception):
    """The body is refused (``status``: 408 too slow, 413 too large); ``message`` says
    why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Limits:
    max_body: int = DEFAULT_MAX_BODY
    header_timeout: float = 10.0
    body_timeout: float = 10.0
    handshake_timeout: float = 10.0
    max_connections: int = 128

    @property
    def max_values(self) -> int:
        return max(1024, self.max_body // BYTES_PER_VALUE)

    def runner_args(self) -> dict[str, Any]:
        """aiohttp's handler arguments: the request-head deadline, and no lingering
        (reading what is left of a refused body) after an answer."""
        return {"keepalive_timeout": self.header_timeout, "lingering_time": 0}

    async def read(self, request: web.Request, what: str) -> bytes:
        """The request's body within the limits; :class:`BodyRefused` otherwise."""
        if request.content_length is not None and request.content_length > self.max_body:
            raise BodyRefused(413, f"{what}: the body is over {self.max_body} bytes")
        try:
            async with asyncio.timeout(self.body_timeout):
                body = await request.read()
        except TimeoutError:
            raise BodyRefused(408, f"{what}: the body did not arrive within "
                                   f"{self.body_timeout:g}s") from None
        except web.HTTPRequestEntityTooLarge:
            raise BodyRefused(413, f"{what}: the body is over {self.max_body} bytes") from None
        values = (body.count(b",") + body.count(b":") + body.count(b"[")
                  + body.count(b"{"))
        if values > self.max_values:
            raise BodyRefused(413, f"{what}: the body holds over {self.max_values} JSON "
                                   f"values ({values}; at most one per {BYTES_PER_VALUE} "
                                   "bytes of --max-body-bytes)")
        return body


def _peer(handler: Any) -> str:
    transport = handler.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return str(peer[0]) if peer else ""


class GuardedSite(web.TCPSite):
    """A TCP site serving at most ``limits.max_connections`` connections at once, with a
    deadline on TLS handshakes. A connection past the limit is served and the oldest
    connection of the client address holding the most is closed instead: a client
    holding many connections cannot keep another (the scheduler) out."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, limits: Limits,
                 ssl_context: Any = None) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context)
        self.limits = limits
        self.evicted = 0

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        cap = self.limits.max_connections

        def factory() -> asyncio.BaseProtocol:
            live = [h for h in server.connections
                    if h.transport is not None and not h.transport.is_closing()]
            if len(live) >= cap:
                by_peer: dict[str, list[Any]] = {}
                for h in live:  # oldest first
                    by_peer.setdefault(_peer(h), []).append(h)
                max(by_peer.values(), key=len)[0].force_close()
                self.evicted += 1
            return server()

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            factory, self._host, self._port, ssl=self._ssl_context,
            ssl_handshake_timeout=self.limits.handshake_timeout if self._ssl_context else None,
            backlog=self._backlog, reuse_address=self._reuse_address,
            reuse_port=self._reuse_port)
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port
