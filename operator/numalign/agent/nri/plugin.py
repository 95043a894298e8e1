"""numalign as an NRI plugin: the runtime asks it for each container's cpuset.

The plugin dials the runtime's NRI socket, multiplexes it (:mod:`.mux`), serves NRI's
``Plugin`` service on one connection and calls the ``Runtime`` service on the other
(:mod:`.ttrpc`), as NRI's own Go stub does. It registers with a name and a two-digit index
(plugins are called in index order), subscribes at ``Configure`` to the events it handles,
and then:

- ``Synchronize``: the runtime's pods and containers when the plugin (re)connects, handed to
  :meth:`Placer.synchronize`, which may answer with updates (a restarted agent rebuilds its
  ledger from these).
- ``CreateContainer``: :meth:`Placer.create` decides the container's cpuset; the answer
  adjusts ``linux.resources.cpu.cpus`` and ``.mems`` of the container being created, and
  updates other containers (the shared pool shrinking when exclusive CPUs are taken).
  :class:`Rejected` fails the creation: the container never starts.
- ``StopContainer`` / ``RemoveContainer`` / ``RemovePodSandbox``: :meth:`Placer.released`,
  whose updates (the shared pool growing again) go back to the runtime.

:meth:`NriPlugin.run` keeps the plugin registered: when the runtime goes away (restarted) it
reconnects and registers again. It knows no Kubernetes: the placer is given NRI's pods and
containers, with their names, namespaces, labels and annotations.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from numalign.agent.nri import mux, ttrpc
from numalign.nriapi.v1alpha1 import api_pb2

PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
DEFAULT_SOCKET = Path("/var/run/nri/nri.sock")
NRI_VERSION = "v0.12.3"  # the NRI module whose protos numalign.nriapi holds

log = logging.getLogger(__name__)

# NRI's events (api.Event); a plugin subscribes with a mask of bit (event - 1)
EVENTS: dict[str, int] = dict(api_pb2.Event.items())
# pods and containers one Synchronize may carry in all its parts (bounded memory)
MAX_SYNC_ITEMS = 1 << 16
SUBSCRIBED = ("CREATE_CONTAINER", "STOP_CONTAINER", "REMOVE_CONTAINER", "REMOVE_POD_SANDBOX")


def event_mask(names: Iterable[str]) -> int:
    mask = 0
    for name in names:
        if name not in EVENTS or name in ("UNKNOWN", "LAST"):
            raise ValueError(f"events: {name!r} is not an NRI event")
        mask |= 1 << (EVENTS[name] - 1)
    return mask


@dataclass(frozen=True)
class CpuSet:
    """A container's cpuset.cpus and cpuset.mems in the kernel's list format ("0-3,8")."""

    cpus: str
    mems: str = ""


@dataclass
class Placement:
    """The answer for one event: the container's own cpuset (None: leave it as the runtime
    made it) and new cpusets for other containers, by container id."""

    cpuset: CpuSet | None = None
    updates: dict[str, CpuSet] = field(default_factory=dict)


class Rejected(Exception):
    """Raised by :meth:`Placer.create`: the container must not be created (the message is the
    error the runtime reports)."""


class Placer(Protocol):
    """The decisions: what numalign wants each container's cpuset to be. A placer may also
    have ``async def prepare(pod)``, awaited before :meth:`create` (it may raise
    :class:`Rejected` too)."""

    def synchronize(self, pods: list[Any], containers: list[Any]) -> Mapping[str, CpuSet]: ...

    def create(self, pod: Any, container: Any) -> Placement: ...

    def released(self, pod: Any, container: Any | None) -> Mapping[str, CpuSet]: ...


def _resources(cpuset: CpuSet) -> Any:
    res = api_pb2.LinuxResources()
    res.cpu.cpus = cpuset.cpus
    if cpuset.mems:
        res.cpu.mems = cpuset.mems
    return res


def container_updates(updates: Mapping[str, CpuSet]) -> list[Any]:
    out = []
    for cid, cpuset in sorted(updates.items()):
        upd = api_pb2.ContainerUpdate(container_id=cid)
        upd.linux.resources.CopyFrom(_resources(cpuset))
        out.append(upd)
    return out


_IDX = re.compile(r"^[0-9]{2}$")


class NriPlugin:
    """One registration with one runtime; :meth:`run` keeps it alive across runtime restarts."""

    def __init__(self, placer: Placer, name: str = "numalign", index: str = "50",
                 socket_path: Path = DEFAULT_SOCKET, retry_s: float = 1.0,
                 register_timeout_s: float = 5.0) -> None:
        if not _IDX.match(index):
            raise ValueError(f"index: {index!r} must be two digits (00-99)")
        if not name or "/" in name:
            raise ValueError(f"name: {name!r} must be a non-empty name without '/'")
        self.placer = placer
        self.name = name
        self.index = index
        self.socket_path = socket_path
        self.retry_s = retry_s
        self.register_timeout_s = register_timeout_s
        self.registrations = 0  # successful registrations so far (one per connection)
        self.synchronized = asyncio.Event()
        self.runtime: tuple[str, str] | None = None  # (name, version) from Configure
        self._client: ttrpc.Endpoint | None = None
        self._sync: tuple[list[Any], list[Any]] = ([], [])
        self._handlers: dict[tuple[str, str], ttrpc.Handler] = {
            (PLUGIN_SERVICE, method): self._typed(method, fn) for method, fn in (
                ("Configure", self._configure),
                ("Synchronize", self._synchronize),
                ("CreateContainer", self._create),
                ("StopContainer", self._stop),
                ("RemoveContainer", self._removed),
                ("RemovePodSandbox", self._pod_removed),
                ("StateChange", self._state_change),
                ("Shutdown", self._shutdown),
            )}

    @staticmethod
    def _typed(method: str, fn: Callable[[Any], Awaitable[Any]]) -> ttrpc.Handler:
        desc = api_pb2.DESCRIPTOR.services_by_name["Plugin"].methods_by_name[method]
        from google.protobuf.message_factory import GetMessageClass

        request_type = GetMessageClass(desc.input_type)

        async def handle(payload: bytes) -> bytes:
            out = await fn(request_type.FromString(payload))
            return bytes(out.SerializeToString())

        return handle

    # -- the runtime's calls --------------------------------------------------------------

    async def _configure(self, req: Any) -> Any:
        self.runtime = (req.runtime_name, req.runtime_version)
        log.info("NRI: configured by %s %s (NRI %s)", req.runtime_name, req.runtime_version,
                 req.NRI_version)
        return api_pb2.ConfigureResponse(events=event_mask(SUBSCRIBED))

    async def _synchronize(self, req: Any) -> Any:
        pods, ctrs = self._sync
        pods, ctrs = pods + list(req.pods), ctrs + list(req.containers)
        if len(pods) + len(ctrs) > MAX_SYNC_ITEMS:
            self._sync = ([], [])
            raise ttrpc.TtrpcError(ttrpc.INVALID_ARGUMENT,
                                   f"Synchronize: more than {MAX_SYNC_ITEMS} pods and "
                                   "containers")
        if req.more:  # the runtime sends its state in parts; answer when it has all
            self._sync = (pods, ctrs)
            return api_pb2.SynchronizeResponse(more=True)
        self._sync = ([], [])
        updates = self.placer.synchronize(pods, ctrs)
        self.synchronized.set()
        return api_pb2.SynchronizeResponse(update=container_updates(updates))

    async def _create(self, req: Any) -> Any:
        prepare = getattr(self.placer, "prepare", None)
        try:
            if prepare is not None:  # an async hook: the placer may wait for the pod, decide
                await prepare(req.pod)  # and record its decision before the answer
            placement = self.placer.create(req.pod, req.container)
        except Rejected as exc:
            raise ttrpc.TtrpcError(ttrpc.UNKNOWN, str(exc)) from None
        resp = api_pb2.CreateContainerResponse(update=container_updates(placement.updates))
        if placement.cpuset is not None:
            resp.adjust.linux.resources.CopyFrom(_resources(placement.cpuset))
        return resp

    async def _stop(self, req: Any) -> Any:
        return api_pb2.StopContainerResponse(
            update=container_updates(self.placer.released(req.pod, req.container)))

    async def _released_updates(self, pod: Any, container: Any | None) -> None:
        updates = self.placer.released(pod, container)
        if updates:
            asyncio.get_running_loop().create_task(self.update_quietly(updates))

    async def _removed(self, req: Any) -> Any:
        await self._released_updates(req.pod, req.container)
        return api_pb2.RemoveContainerResponse()

    async def _pod_removed(self, req: Any) -> Any:
        await self._released_updates(req.pod, None)
        return api_pb2.RemovePodSandboxResponse()

    async def _state_change(self, req: Any) -> Any:
        # only events without a dedicated call of their own arrive here
        return api_pb2.Empty()

    async def _shutdown(self, req: Any) -> Any:
        log.info("NRI: the runtime asked the plugin to shut down")
        return api_pb2.Empty()

    # -- the plugin's calls ---------------------------------------------------------------

    async def update_containers(self, updates: Mapping[str, CpuSet]) -> list[str]:
        """Ask the runtime to set other containers' cpusets; returns the ids that failed."""
        if self._client is None:
            raise ttrpc.TtrpcError(ttrpc.UNAVAILABLE, "not connected to the runtime")
        resp = await self._client.call(
            RUNTIME_SERVICE, "UpdateContainers",
            api_pb2.UpdateContainersRequest(update=container_updates(updates)),
            api_pb2.UpdateContainersResponse, timeout=self.register_timeout_s)
        return [u.container_id for u in resp.failed]

    async def update_quietly(self, updates: Mapping[str, CpuSet]) -> None:
        try:
            failed = await self.update_containers(updates)
        except ttrpc.TtrpcError as exc:
            log.warning("NRI: updating %d containers failed: %s", len(updates), exc)
            return
        if failed:
            log.warning("NRI: the runtime failed to update containers %s", failed)

    # -- connection -----------------------------------------------------------------------

    async def serve_once(self) -> None:
        """Connect, register, and serve until the runtime closes the connection."""
        self._sync = ([], [])  # a Synchronize in parts belongs to its connection
        reader, writer = await asyncio.open_unix_connection(str(self.socket_path))
        trunk = mux.Mux(reader, writer)
        srv = trunk.open(mux.PLUGIN_SERVICE_CONN)
        cli = trunk.open(mux.RUNTIME_SERVICE_CONN)
        server = ttrpc.Endpoint(srv.reader, srv, self._handlers)
        client = ttrpc.Endpoint(cli.reader, cli)
        trunk.start()
        tasks = [asyncio.create_task(server.run()), asyncio.create_task(client.run())]
        try:
            self.synchronized.clear()
            self._client = client
            await client.call(RUNTIME_SERVICE, "RegisterPlugin", api_pb2.RegisterPluginRequest(
                plugin_name=self.name, plugin_idx=self.index, NRI_version=NRI_VERSION),
                api_pb2.Empty, timeout=self.register_timeout_s)
            self.registrations += 1
            log.info("NRI: registered as %s-%s on %s", self.index, self.name, self.socket_path)
            # until the runtime hangs up, or either ttrpc connection breaks (a bad frame:
            # nothing after it can be trusted, so the plugin hangs up and dials again)
            waits = [asyncio.create_task(e.wait())
                     for e in (trunk.closed, server.closed, client.closed)]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
        finally:
            self._client = None
            self._sync = ([], [])
            for t in tasks:
                t.cancel()
            for t in tasks:  # how a connection broke is logged where it broke
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
            await trunk.close()

    async def run(self) -> None:
        """Stay registered: reconnect whenever the runtime goes away or the connection
        breaks, until cancelled."""
        while True:
            try:
                await self.serve_once()
                log.info("NRI: the connection to the runtime ended; reconnecting")
            except (OSError, ttrpc.TtrpcError) as exc:
                log.info("NRI: no runtime at %s (%s); retrying in %ss", self.socket_path, exc,
                         self.retry_s)
            except Exception as exc:  # whatever the runtime sent, the plugin dials again
                log.warning("NRI: the connection to the runtime failed: %s: %s; retrying in "
                            "%ss", type(exc).__name__, exc, self.retry_s)
            await asyncio.sleep(self.retry_s)
