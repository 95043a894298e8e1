"""agent.nri.plugin against an NRI runtime written here on the same transport: the order of
calls NRI's runtime makes (register, configure, synchronize in parts, create), the answers,
and reconnecting when the runtime goes away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from numalign.agent.nri import mux, ttrpc
from numalign.agent.nri.plugin import (
    PLUGIN_SERVICE,
    RUNTIME_SERVICE,
    SUBSCRIBED,
    CpuSet,
    NriPlugin,
    Placement,
    Rejected,
    event_mask,
)
from numalign.nriapi.ttrpc import request_pb2
from numalign.nriapi.v1alpha1 import api_pb2


class Recorder:
    def __init__(self) -> None:
        self.synced: tuple[list[str], list[str]] | None = None
        self.gone: list[tuple[str, str | None]] = []

    def synchronize(self, pods: list[Any], containers: list[Any]) -> Mapping[str, CpuSet]:
        self.synced = ([p.id for p in pods], [c.id for c in containers])
        return {c.id: CpuSet("0") for c in containers}

    def create(self, pod: Any, container: Any) -> Placement:
        if container.name == "refused":
            raise Rejected("TopologyAffinityError: nope")
        return Placement(CpuSet("1", "0"), {"other": CpuSet("0")})

    def released(self, pod: Any, container: Any | None) -> Mapping[str, CpuSet]:
        self.gone.append((pod.id, container.id if container is not None else None))
        return {"other": CpuSet("0-1")}


class FakeRuntime:
    """The runtime's side of NRI: accepts one plugin connection at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.registered: list[tuple[str, str]] = []
        self.updates: list[list[str]] = []
        self.connected = asyncio.Event()
        self.client: ttrpc.Endpoint | None = None
        self.trunk: mux.Mux | None = None
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_unix_server(self._accept, str(self.path))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        trunk = mux.Mux(reader, writer)
        to_plugin = trunk.open(mux.PLUGIN_SERVICE_CONN)
        from_plugin = trunk.open(mux.RUNTIME_SERVICE_CONN)

        async def register(payload: bytes) -> bytes:
            req = api_pb2.RegisterPluginRequest.FromString(payload)
            self.registered.append((req.plugin_name, req.plugin_idx))
            self.connected.set()
            return api_pb2.Empty().SerializeToString()

        async def update(payload: bytes) -> bytes:
            req = api_pb2.UpdateContainersRequest.FromString(payload)
            self.updates.append([u.container_id for u in req.update])
            return api_pb2.UpdateContainersResponse().SerializeToString()

        server = ttrpc.Endpoint(from_plugin.reader, from_plugin, {
            (RUNTIME_SERVICE, "RegisterPlugin"): register,
            (RUNTIME_SERVICE, "UpdateContainers"): update})
        self.client = ttrpc.Endpoint(to_plugin.reader, to_plugin)
        self.trunk = trunk
        trunk.start()
        with contextlib.suppress(Exception):
            await asyncio.gather(server.run(), self.client.run())

    async def call(self, method: str, req: Any, resp: type[Any]) -> Any:
        assert self.client is not None
        return await self.client.call(PLUGIN_SERVICE, method, req, resp, timeout=5)

    async def drop(self) -> None:
        self.connected.clear()
        if self.trunk is not None:
            await self.trunk.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def test_subscription_mask_and_bad_settings() -> None:
    # NRI's EventMask: bit (event - 1): CREATE_CONTAINER=4, STOP_CONTAINER=10,
    # REMOVE_CONTAINER=11, REMOVE_POD_SANDBOX=3
    assert event_mask(SUBSCRIBED) == (1 << 3) | (1 << 9) | (1 << 10) | (1 << 2)
    with pytest.raises(ValueError, match="events: 'NOPE' is not an NRI event"):
        event_mask(["NOPE"])
    with pytest.raises(ValueError, match="index: '5' must be two digits"):
        NriPlugin(Recorder(), index="5")
    with pytest.raises(ValueError, match="name: ''"):
        NriPlugin(Recorder(), name="")


async def test_the_runtime_calls_in_nri_order_and_the_plugin_reconnects(tmp_path: Path) -> None:
    runtime = FakeRuntime(tmp_path / "nri.sock")
    await runtime.start()
    placer = Recorder()
    plugin = NriPlugin(placer, name="numalign", index="42",
                       socket_path=runtime.path, retry_s=0.05)
    run = asyncio.create_task(plugin.run())
    try:
        await asyncio.wait_for(runtime.connected.wait(), 5)
        assert runtime.registered == [("numalign", "42")]
        cfg = await runtime.call("Configure", api_pb2.ConfigureRequest(
            runtime_name="fake", runtime_version="1"), api_pb2.ConfigureResponse)
        assert cfg.events == event_mask(SUBSCRIBED) and plugin.runtime == ("fake", "1")
        # the runtime's state in two parts: the plugin answers once it has all of it
        part = await runtime.call("Synchronize", api_pb2.SynchronizeRequest(
            pods=[api_pb2.PodSandbox(id="p1")], containers=[api_pb2.Container(id="c1")],
            more=True), api_pb2.SynchronizeResponse)
        assert part.more and list(part.update) == [] and placer.synced is None
        done = await runtime.call("Synchronize", api_pb2.SynchronizeRequest(
            pods=[api_pb2.PodSandbox(id="p2")], containers=[api_pb2.Container(id="c2")]),
            api_pb2.SynchronizeResponse)
        assert placer.synced == (["p1", "p2"], ["c1", "c2"])
        assert [(u.container_id, u.linux.resources.cpu.cpus) for u in done.update] == [
            ("c1", "0"), ("c2", "0")]
        created = await runtime.call("CreateContainer", api_pb2.CreateContainerRequest(
            pod=api_pb2.PodSandbox(id="p1"), container=api_pb2.Container(id="c3", name="x")),
            api_pb2.CreateContainerResponse)
        cpu = created.adjust.linux.resources.cpu
        assert (cpu.cpus, cpu.mems) == ("1", "0")
        assert [u.container_id for u in created.update] == ["other"]
        with pytest.raises(ttrpc.TtrpcError, match="TopologyAffinityError: nope"):
            await runtime.call("CreateContainer", api_pb2.CreateContainerRequest(
                container=api_pb2.Container(id="c4", name="refused")),
                api_pb2.CreateContainerResponse)
        stopped = await runtime.call("StopContainer", api_pb2.StopContainerRequest(
            pod=api_pb2.PodSandbox(id="p1"), container=api_pb2.Container(id="c3")),
            api_pb2.StopContainerResponse)
        assert [u.linux.resources.cpu.cpus for u in stopped.update] == ["0-1"]
        # a removed pod's freed CPUs reach the others through UpdateContainers
        await runtime.call("RemovePodSandbox", api_pb2.RemovePodSandboxRequest(
            pod=api_pb2.PodSandbox(id="p1")), api_pb2.RemovePodSandboxResponse)
        for _ in range(50):
            if runtime.updates:
                break
            await asyncio.sleep(0.02)
        assert runtime.updates == [["other"]]
        await asyncio.sleep(0.1)  # let the plugin take the answer before the runtime goes
        assert placer.gone == [("p1", "c3"), ("p1", None)]

        # the runtime goes away and comes back: the plugin registers again
        await runtime.drop()
        await runtime.start()
        await asyncio.wait_for(runtime.connected.wait(), 5)
        assert runtime.registered == [("numalign", "42")] * 2
        for _ in range(100):
            if plugin.registrations == 2:
                break
            await asyncio.sleep(0.02)
        assert plugin.registrations == 2
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await runtime.drop()


class GarbageRuntime(FakeRuntime):
    """A runtime whose first connection goes wrong (``kind``): the answer to RegisterPlugin
    is not protobuf, or its envelope is not; or, once registered, it announces a ttrpc
    message larger than ttrpc allows. Later connections are served as usual."""

    def __init__(self, path: Path, kind: str) -> None:
        super().__init__(path)
        self.kind = kind
        self.accepts = 0
        self.garbage_sent = asyncio.Event()
        self.first_closed = asyncio.Event()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepts += 1
        if self.accepts > 1:
            await super()._accept(reader, writer)
            return
        trunk = mux.Mux(reader, writer)
        from_plugin = trunk.open(mux.RUNTIME_SERVICE_CONN)
        trunk.start()
        msg = await ttrpc.read_message(from_plugin.reader)  # the plugin's RegisterPlugin
        assert msg is not None
        stream_id = msg[0]
        ok = request_pb2.Response(payload=api_pb2.Empty().SerializeToString())
        if self.kind == "undecodable answer":
            bad = request_pb2.Response(payload=b"\xff\xff\xff")
            await trunk.write(mux.RUNTIME_SERVICE_CONN, ttrpc.frame(
                stream_id, ttrpc.TYPE_RESPONSE, bad.SerializeToString()))
        elif self.kind == "undecodable envelope":
            await trunk.write(mux.RUNTIME_SERVICE_CONN,
                              ttrpc.frame(stream_id, ttrpc.TYPE_RESPONSE, b"\xff\xff\xff"))
        else:  # registered, then a header announcing more than ttrpc's 4 MiB
            await trunk.write(mux.RUNTIME_SERVICE_CONN, ttrpc.frame(
                stream_id, ttrpc.TYPE_RESPONSE, ok.SerializeToString()))
            await asyncio.sleep(0.1)
            await trunk.write(mux.PLUGIN_SERVICE_CONN, ttrpc.HEADER.pack(
                ttrpc.MAX_MESSAGE + 1, 1, ttrpc.TYPE_REQUEST, 0))
        self.garbage_sent.set()
        await trunk.closed.wait()  # the plugin must hang up
        self.first_closed.set()
        await trunk.close()


@pytest.mark.parametrize("kind", ["undecodable answer", "undecodable envelope",
                                  "oversized message"])
async def test_garbage_from_the_runtime_makes_the_plugin_reconnect(tmp_path: Path,
                                                                   kind: str) -> None:
    """Finding 5: one bad frame closes the connection; the plugin dials again and
    registers within seconds (never waits forever, never stops)."""
    runtime = GarbageRuntime(tmp_path / "nri.sock", kind)
    await runtime.start()
    plugin = NriPlugin(Recorder(), name="numalign", index="42", socket_path=runtime.path,
                       retry_s=0.2)
    run = asyncio.create_task(plugin.run())
    try:
        await asyncio.wait_for(runtime.garbage_sent.wait(), 5)
        loop = asyncio.get_running_loop()
        sent = loop.time()
        await asyncio.wait_for(runtime.first_closed.wait(), 5)
        await asyncio.wait_for(runtime.connected.wait(), 5)
        assert loop.time() - sent < 5
        assert runtime.registered == [("numalign", "42")] and runtime.accepts == 2
        assert not run.done()
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await runtime.drop()


async def test_a_partial_synchronize_does_not_reach_the_next_connection(
        tmp_path: Path) -> None:
    """Finding 6: the runtime sent part of its state and went away: the next connection's
    Synchronize is the new runtime's state only (no ghost pods held forever)."""
    runtime = FakeRuntime(tmp_path / "nri.sock")
    await runtime.start()
    placer = Recorder()
    plugin = NriPlugin(placer, name="numalign", index="42", socket_path=runtime.path,
                       retry_s=0.05)
    run = asyncio.create_task(plugin.run())
    try:
        await asyncio.wait_for(runtime.connected.wait(), 5)
        part = await runtime.call("Synchronize", api_pb2.SynchronizeRequest(
            pods=[api_pb2.PodSandbox(id="ghost")], containers=[api_pb2.Container(id="cg")],
            more=True), api_pb2.SynchronizeResponse)
        assert part.more
        await runtime.drop()
        await runtime.start()
        await asyncio.wait_for(runtime.connected.wait(), 5)
        await runtime.call("Synchronize", api_pb2.SynchronizeRequest(
            pods=[api_pb2.PodSandbox(id="p2")], containers=[api_pb2.Container(id="c2")]),
            api_pb2.SynchronizeResponse)
        assert placer.synced == (["p2"], ["c2"])
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await runtime.drop()
