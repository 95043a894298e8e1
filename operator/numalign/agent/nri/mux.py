"""NRI's connection multiplexing: several byte streams over the one unix socket.

NRI (``pkg/net/multiplex``) carries the plugin's two ttrpc connections over the socket it
dialled: every write on a virtual connection goes out as frames of an 8-byte header
(connection id, payload length; both 32-bit big-endian) and the payload. Opening a
connection is local only; both ends agree on the ids: :data:`PLUGIN_SERVICE_CONN` carries
the runtime's calls to the plugin, :data:`RUNTIME_SERVICE_CONN` the plugin's calls to the
runtime. A frame need not hold a whole ttrpc message, so each connection is a byte stream
(an :class:`asyncio.StreamReader` fed by the trunk's reader).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from dataclasses import dataclass, field

PLUGIN_SERVICE_CONN = 1
RUNTIME_SERVICE_CONN = 2

HEADER = struct.Struct(">II")
# NRI's own bound: a ttrpc header and a ttrpc message of at most 4 MiB
MAX_PAYLOAD = 10 + (4 << 20)


class MuxError(ConnectionError):
    pass


@dataclass
class MuxConn:
    """One virtual connection: read from :attr:`reader`, write with :meth:`write`."""

    mux: Mux
    id: int
    reader: asyncio.StreamReader = field(default_factory=asyncio.StreamReader)

    async def write(self, data: bytes) -> None:
        await self.mux.write(self.id, data)


class Mux:
    """The trunk's framing. :meth:`open` the connections, then :meth:`start` reading."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._conns: dict[int, MuxConn] = {}
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None
        self.closed = asyncio.Event()

    def open(self, conn_id: int) -> MuxConn:
        if conn_id <= 0:
            raise ValueError(f"conn_id: {conn_id} is reserved (ids start at 1)")
        if conn_id not in self._conns:
            self._conns[conn_id] = MuxConn(self, conn_id)
        return self._conns[conn_id]

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._read())

    async def write(self, conn_id: int, data: bytes) -> None:
        if self.closed.is_set():
            raise MuxError(f"the trunk is closed ({self.error or 'EOF'})")
        view = memoryview(data)
        async with self._lock:
            while True:
                chunk, view = view[:MAX_PAYLOAD], view[MAX_PAYLOAD:]
                self._writer.write(HEADER.pack(conn_id, len(chunk)) + bytes(chunk))
                if not view:
                    break
            await self._writer.drain()

    async def _read(self) -> None:
        try:
            while True:
                try:
                    hdr = await self._reader.readexactly(HEADER.size)
                except asyncio.IncompleteReadError as exc:
                    if exc.partial:
                        raise MuxError("the trunk ended inside a frame header") from exc
                    break
                conn_id, size = HEADER.unpack(hdr)
                if size > MAX_PAYLOAD:
                    raise MuxError(f"frame of {size} bytes on connection {conn_id} exceeds "
                                   f"{MAX_PAYLOAD}")
                payload = await self._reader.readexactly(size)
                conn = self._conns.get(conn_id)
                if conn is not None:  # like NRI: data for a connection not open is dropped
                    conn.reader.feed_data(payload)
        except (MuxError, OSError, asyncio.IncompleteReadError) as exc:
            self.error = exc
        finally:
            self._finish()

    def _finish(self) -> None:
        self.closed.set()
        for conn in self._conns.values():
            if self.error is not None:
                conn.reader.set_exception(MuxError(f"the trunk failed: {self.error}"))
            else:
                conn.reader.feed_eof()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if not self.closed.is_set():
            self._finish()
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()
