"""The NRI transport: ttrpc calls both ways over NRI's multiplexed unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest

from numalign.agent.nri import mux, ttrpc
from numalign.nriapi.ttrpc import request_pb2
from numalign.nriapi.v1alpha1 import api_pb2

PLUGIN = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME = "nri.pkg.api.v1alpha1.Runtime"


async def _pair() -> tuple[mux.Mux, mux.Mux]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ra, wa = await asyncio.open_unix_connection(sock=a)
    rb, wb = await asyncio.open_unix_connection(sock=b)
    return mux.Mux(ra, wa), mux.Mux(rb, wb)


@contextlib.asynccontextmanager
async def connected() -> AsyncIterator[tuple[mux.Mux, mux.Mux]]:
    left, right = await _pair()
    try:
        yield left, right
    finally:
        await left.close()
        await right.close()


async def test_calls_go_both_ways_on_their_own_connections() -> None:
    async with connected() as trunks:
        plugin_side, runtime_side = trunks
        registered: list[tuple[str, str]] = []

        async def register(payload: bytes) -> bytes:
            req = api_pb2.RegisterPluginRequest.FromString(payload)
            registered.append((req.plugin_name, req.plugin_idx))
            return api_pb2.Empty().SerializeToString()

        async def create(payload: bytes) -> bytes:
            req = api_pb2.CreateContainerRequest.FromString(payload)
            resp = api_pb2.CreateContainerResponse()
            resp.adjust.linux.resources.cpu.cpus = f"cpus-for-{req.container.name}"
            return resp.SerializeToString()

        # the plugin serves on PLUGIN_SERVICE_CONN and calls on RUNTIME_SERVICE_CONN; the runtime
        # the other way round
        p_srv, p_cli = (plugin_side.open(mux.PLUGIN_SERVICE_CONN),
                        plugin_side.open(mux.RUNTIME_SERVICE_CONN))
        r_cli, r_srv = (runtime_side.open(mux.PLUGIN_SERVICE_CONN),
                        runtime_side.open(mux.RUNTIME_SERVICE_CONN))
        plugin_server = ttrpc.Endpoint(p_srv.reader, p_srv,
                                       {(PLUGIN, "CreateContainer"): create})
        plugin_client = ttrpc.Endpoint(p_cli.reader, p_cli)
        runtime_server = ttrpc.Endpoint(r_srv.reader, r_srv,
                                        {(RUNTIME, "RegisterPlugin"): register})
        runtime_client = ttrpc.Endpoint(r_cli.reader, r_cli)
        for m in trunks:
            m.start()
        tasks = [asyncio.create_task(e.run())
                 for e in (plugin_server, plugin_client, runtime_server, runtime_client)]

        await plugin_client.call(RUNTIME, "RegisterPlugin",
                                 api_pb2.RegisterPluginRequest(plugin_name="numalign",
                                                               plugin_idx="10"),
                                 api_pb2.Empty, timeout=5)
        assert registered == [("numalign", "10")]
        # concurrent calls are matched to their answers by stream id
        answers = await asyncio.gather(*(
            runtime_client.call(PLUGIN, "CreateContainer",
                                api_pb2.CreateContainerRequest(container=api_pb2.Container(name=n)),
                                api_pb2.CreateContainerResponse, timeout=5)
            for n in ("a", "b", "c")))
        assert [a.adjust.linux.resources.cpu.cpus for a in answers] == [
            "cpus-for-a", "cpus-for-b", "cpus-for-c"]
        for t in tasks:
            t.cancel()


async def test_errors_come_back_as_status() -> None:
    async with connected() as trunks:
        left, right = trunks

        async def refuse(payload: bytes) -> bytes:
            raise ttrpc.TtrpcError(ttrpc.INVALID_ARGUMENT, "no cpus for you")

        async def crash(payload: bytes) -> bytes:
            raise RuntimeError("boom")

        lc, rc = left.open(1), right.open(1)
        client = ttrpc.Endpoint(lc.reader, lc)
        server = ttrpc.Endpoint(rc.reader, rc,
                                {(PLUGIN, "Refuse"): refuse, (PLUGIN, "Crash"): crash})
        left.start()
        right.start()
        tasks = [asyncio.create_task(client.run()), asyncio.create_task(server.run())]
        with pytest.raises(ttrpc.TtrpcError) as refused:
            await client.call(PLUGIN, "Refuse", api_pb2.Empty(), api_pb2.Empty, timeout=5)
        assert (refused.value.code, refused.value.message) == (ttrpc.INVALID_ARGUMENT,
                                                               "no cpus for you")
        with pytest.raises(ttrpc.TtrpcError) as crashed:
            await client.call(PLUGIN, "Crash", api_pb2.Empty(), api_pb2.Empty, timeout=5)
        assert crashed.value.code == ttrpc.UNKNOWN and "RuntimeError: boom" in crashed.value.message
        with pytest.raises(ttrpc.TtrpcError) as missing:
            await client.call(PLUGIN, "Shutdown", api_pb2.Empty(), api_pb2.Empty, timeout=5)
        assert missing.value.code == ttrpc.UNIMPLEMENTED
        for t in tasks:
            t.cancel()


async def test_wire_format_and_split_frames() -> None:
    async with connected() as trunks:
        """A ttrpc message split over several mux frames, written byte by byte as NRI frames it."""
        left, right = trunks
        answered = asyncio.Event()

        async def handler(payload: bytes) -> bytes:
            answered.set()
            return b"\x08\x01"

        rc = right.open(2)
        server = ttrpc.Endpoint(rc.reader, rc, {("svc", "M"): handler})
        right.start()
        task = asyncio.create_task(server.run())
        req = request_pb2.Request(service="svc", method="M", payload=b"").SerializeToString()
        msg = len(req).to_bytes(4, "big") + (7).to_bytes(4, "big") + bytes([1, 0]) + req
        assert msg == ttrpc.frame(7, ttrpc.TYPE_REQUEST, req)
        raw = left._writer  # the trunk itself: hand-made NRI frames, 3 bytes of payload each
        for i in range(0, len(msg), 3):
            chunk = msg[i:i + 3]
            raw.write(len(chunk).to_bytes(4, "big").rjust(4, b"\0").rjust(4, b"\0")
                      if False else (2).to_bytes(4, "big") + len(chunk).to_bytes(4, "big") + chunk)
        await raw.drain()
        # the answer: conn 2, a ttrpc Response on stream 7
        hdr = await asyncio.wait_for(left._reader.readexactly(8), 5)
        conn_id, size = int.from_bytes(hdr[:4], "big"), int.from_bytes(hdr[4:], "big")
        body = await left._reader.readexactly(size)
        assert conn_id == 2 and answered.is_set()
        length, stream_id, msg_type, flags = ttrpc.HEADER.unpack(body[:10])
        assert (stream_id, msg_type, flags, length) == (7, ttrpc.TYPE_RESPONSE, 0, len(body) - 10)
        resp = request_pb2.Response.FromString(body[10:])
        assert resp.status.code == ttrpc.OK and resp.payload == b"\x08\x01"
        task.cancel()


async def test_a_closed_trunk_fails_pending_and_new_calls() -> None:
    left, right = await _pair()
    lc = left.open(1)
    right.open(1)  # the peer never answers
    client = ttrpc.Endpoint(lc.reader, lc)
    left.start()
    right.start()
    run = asyncio.create_task(client.run())
    call = asyncio.create_task(client.call("s", "m", api_pb2.Empty(), api_pb2.Empty, timeout=5))
    await asyncio.sleep(0.05)
    await right.close()
    with pytest.raises(ttrpc.TtrpcError) as pending:
        await call
    assert pending.value.code == ttrpc.UNAVAILABLE
    await run
    with pytest.raises(ttrpc.TtrpcError) as later:
        await client.call("s", "m", api_pb2.Empty(), api_pb2.Empty, timeout=5)
    assert later.value.code == ttrpc.UNAVAILABLE
    await left.close()


async def test_a_call_not_answered_in_time_times_out() -> None:
    async with connected() as trunks:
        left, right = trunks
        lc = left.open(1)
        right.open(1)
        client = ttrpc.Endpoint(lc.reader, lc)
        left.start()
        right.start()
        run = asyncio.create_task(client.run())
        with pytest.raises(ttrpc.TtrpcError) as late:
            await client.call("s", "m", api_pb2.Empty(), api_pb2.Empty, timeout=0.2)
        assert late.value.code == ttrpc.DEADLINE_EXCEEDED
        run.cancel()


def test_reserved_connection_id_is_refused() -> None:
    m = mux.Mux.__new__(mux.Mux)
    m._conns = {}
    with pytest.raises(ValueError, match="conn_id: 0 is reserved"):
        m.open(0)
