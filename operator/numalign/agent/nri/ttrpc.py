"""ttrpc, the small RPC protocol of containerd and NRI: unary calls over a byte stream.

Each message is a 10-byte header (payload length and stream id, 32-bit big-endian; message
type; flags) and a payload of at most 4 MiB. A call is a ``Request`` (type 1: service,
method, the request's protobuf bytes, a timeout) on a new odd stream id chosen by the
caller; its answer a ``Response`` (type 2) on the same stream id, with a status (a gRPC code
and message) and the response's bytes. The envelopes are :mod:`numalign.nriapi.ttrpc`'s
generated messages. Streaming calls (type 3, data) are not used by NRI and are refused.

An :class:`Endpoint` is both sides of one stream: :meth:`Endpoint.call` makes calls, and the
handlers given to it answer the peer's calls, each in a task of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from numalign.nriapi.ttrpc import request_pb2

HEADER = struct.Struct(">IIBB")
MAX_MESSAGE = 4 << 20
TYPE_REQUEST = 1
TYPE_RESPONSE = 2

# gRPC status codes used here
OK = 0
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
UNIMPLEMENTED = 12
UNAVAILABLE = 14

log = logging.getLogger(__name__)

Handler = Callable[[bytes], Awaitable[bytes]]


class Writer(Protocol):
    async def write(self, data: bytes) -> None: ...


class TtrpcError(Exception):
    """A call answered with a non-OK status, or one that could not be made."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"ttrpc status {code}: {message}")
        self.code = code
        self.message = message


def frame(stream_id: int, msg_type: int, payload: bytes, flags: int = 0) -> bytes:
    if len(payload) > MAX_MESSAGE:
        raise TtrpcError(8, f"message of {len(payload)} bytes exceeds {MAX_MESSAGE}")
    return HEADER.pack(len(payload), stream_id, msg_type, flags) + payload


async def read_message(reader: asyncio.StreamReader) -> tuple[int, int, int, bytes] | None:
    """(stream id, type, flags, payload), or None at a clean end of the stream."""
    try:
        hdr = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ConnectionError("ttrpc stream ended inside a message header") from exc
        return None
    length, stream_id, msg_type, flags = HEADER.unpack(hdr)
    if length > MAX_MESSAGE:
        raise ConnectionError(f"ttrpc message of {length} bytes exceeds {MAX_MESSAGE}")
    return stream_id, msg_type, flags, await reader.readexactly(length)


class Endpoint:
    """One ttrpc connection: outgoing calls and the handlers of incoming ones.

    ``handlers`` maps ``(service, method)`` to an async function from the request's bytes to
    the response's; a handler raising :class:`TtrpcError` answers with its status, any other
    exception with UNKNOWN. :meth:`run` reads until the stream ends; pending calls then fail
    with UNAVAILABLE. A message that breaks the protocol (too large, an answer that is not
    protobuf) closes the endpoint: :attr:`closed` is set, and whoever owns the stream
    hangs up (nothing after a bad frame can be trusted).
    """

    def __init__(self, reader: asyncio.StreamReader, writer: Writer,
                 handlers: Mapping[tuple[str, str], Handler] | None = None) -> None:
        self._reader = reader
        self._writer = writer
        self._handlers = dict(handlers or {})
        self._ids = itertools.count(1, 2)
        self._pending: dict[int, asyncio.Future[request_pb2.Response]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._write_lock = asyncio.Lock()
        self._closed: str | None = None
        self.closed = asyncio.Event()

    async def _send(self, data: bytes) -> None:
        async with self._write_lock:
            await self._writer.write(data)

    async def call(self, service: str, method: str, request: Any, response_type: type[Any],
                   timeout: float | None = None) -> Any:
        """Call service/method with a protobuf message; returns the decoded response."""
        if self._closed is not None:
            raise TtrpcError(UNAVAILABLE, f"connection closed: {self._closed}")
        stream_id = next(self._ids)
        req = request_pb2.Request(service=service, method=method,
                                  payload=request.SerializeToString(),
                                  timeout_nano=int(timeout * 1e9) if timeout else 0)
        fut: asyncio.Future[request_pb2.Response] = asyncio.get_running_loop().create_future()
        self._pending[stream_id] = fut
        try:
            await self._send(frame(stream_id, TYPE_REQUEST, req.SerializeToString()))
            try:
                resp = await asyncio.wait_for(fut, timeout)
            except TimeoutError:
                raise TtrpcError(DEADLINE_EXCEEDED,
                                 f"{service}/{method}: no answer in {timeout}s") from None
        finally:
            self._pending.pop(stream_id, None)
        if resp.HasField("status") and resp.status.code != OK:
            raise TtrpcError(resp.status.code, resp.status.message)
        try:
            return response_type.FromString(resp.payload)
        except DecodeError as exc:
            why = f"{service}/{method}: the answer is not a {response_type.__name__}: {exc}"
            self._close(why)
            raise TtrpcError(UNKNOWN, why) from None

    async def run(self) -> None:
        """Serve and dispatch until the stream ends (or fails)."""
        reason = "EOF"
        try:
            while (msg := await read_message(self._reader)) is not None:
                stream_id, msg_type, _flags, payload = msg
                if msg_type == TYPE_RESPONSE:
                    fut = self._pending.get(stream_id)
                    if fut is not None and not fut.done():
                        try:
                            resp = request_pb2.Response.FromString(payload)
                        except DecodeError as exc:
                            raise ConnectionError(f"ttrpc: an undecodable response on stream "
                                                  f"{stream_id}: {exc}") from None
                        fut.set_result(resp)
                elif msg_type == TYPE_REQUEST:
                    task = asyncio.get_running_loop().create_task(
                        self._serve(stream_id, payload))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
                else:
                    await self._answer(stream_id, status=(
                        UNIMPLEMENTED, f"ttrpc message type {msg_type} is not supported"))
        except (ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            reason = str(exc) or type(exc).__name__
            raise
        finally:
            self._close(reason)

    def _close(self, reason: str) -> None:
        if self._closed is None:
            log.info("ttrpc: connection closed: %s", reason)
        self._closed = self._closed or reason
        self.closed.set()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(TtrpcError(UNAVAILABLE, f"connection closed: {reason}"))
        for task in self._tasks:
            task.cancel()

    async def _answer(self, stream_id: int, payload: bytes = b"",
                      status: tuple[int, str] = (OK, "")) -> None:
        resp = request_pb2.Response(payload=payload)
        resp.status.code, resp.status.message = status
        with contextlib.suppress(ConnectionError, OSError):
            await self._send(frame(stream_id, TYPE_RESPONSE, resp.SerializeToString()))

    async def _serve(self, stream_id: int, payload: bytes) -> None:
        if stream_id % 2 != 1:
            await self._answer(stream_id, status=(
                INVALID_ARGUMENT, "StreamID must be odd for client initiated streams"))
            return
        try:
            req = request_pb2.Request.FromString(payload)
        except Exception as exc:
            await self._answer(stream_id, status=(INVALID_ARGUMENT, f"bad request: {exc}"))
            return
        handler = self._handlers.get((req.service, req.method))
        if handler is None:
            await self._answer(stream_id, status=(
                UNIMPLEMENTED, f"{req.service}/{req.method} is not implemented"))
            return
        timeout = req.timeout_nano / 1e9 if req.timeout_nano > 0 else None
        try:
            out = await asyncio.wait_for(handler(req.payload), timeout)
        except TtrpcError as exc:
            await self._answer(stream_id, status=(exc.code, exc.message))
        except TimeoutError:
            await self._answer(stream_id, status=(DEADLINE_EXCEEDED, "handler timed out"))
        except Exception as exc:
            log.exception("ttrpc handler %s/%s failed", req.service, req.method)
            await self._answer(stream_id, status=(UNKNOWN, f"{type(exc).__name__}: {exc}"))
        else:
            await self._answer(stream_id, out)
