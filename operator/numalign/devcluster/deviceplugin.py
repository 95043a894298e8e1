"""A sample device plugin (device plugin API v1beta1 over gRPC) for the local real node:
it advertises a machine file's devices to the kubelet with their NUMA node as
``TopologyInfo``, so the kubelet's Topology Manager gets real device hints.

One plugin server per extended resource, each on its own socket in the kubelet's
``device-plugins/`` folder, registered with the kubelet's ``Registration`` service on
``device-plugins/kubelet.sock``. A machine file without devices gets one sample device
per NUMA node (``numalign.io/sample-device``, ids ``sample-<numa id>``).

- ``ListAndWatch``: every device, ``Healthy``, with its NUMA node (none when the machine
  file says ``numaNode: null``); the stream stays open until the plugin stops.
- ``GetPreferredAllocation``: the required devices, then devices of their NUMA nodes,
  then the NUMA node that fits the rest best.
- ``Allocate``: an environment variable ``NUMALIGN_DEVICES_<RESOURCE>`` (resource name
  upper-cased, other characters as ``_``) naming the devices, comma-separated.
- ``PreStartContainer``: required, so the kubelet calls it; it checks the ids and logs.

When the kubelet restarts it removes the plugins' sockets and creates a new
``kubelet.sock``: the plugin notices (it polls), serves again and re-registers.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from ..kubeletapi.deviceplugin_v1beta1 import api_pb2 as pb
from ..kubeletapi.deviceplugin_v1beta1 import api_pb2_grpc as pb_grpc
from ..topology.machine import Machine

API_VERSION = "v1beta1"
DEFAULT_RESOURCE = "numalign.io/sample-device"
KUBELET_SOCKET = "kubelet.sock"
HEALTHY = "Healthy"
UNIX_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL

Log = Callable[[str], None]


class DevicePluginError(RuntimeError):
    """The plugin cannot run as asked; the message names the option or field."""


@dataclass(frozen=True)
class PluginDevice:
    id: str
    numa_node: int | None


def devices_by_resource(machine: Machine) -> dict[str, list[PluginDevice]]:
    """What to advertise: the machine file's devices by resource, or one sample device per
    NUMA node when it lists none."""
    if not machine.devices:
        return {DEFAULT_RESOURCE: [PluginDevice(f"sample-{n.id}", n.id)
                                   for n in machine.numa_nodes]}
    out: dict[str, list[PluginDevice]] = {}
    for d in machine.devices:
        out.setdefault(d.resource, []).append(PluginDevice(d.id, d.numa_node))
    return out


def env_var(resource: str) -> str:
    """``numalign.io/sample-device`` -> ``NUMALIGN_DEVICES_NUMALIGN_IO_SAMPLE_DEVICE``."""
    return "NUMALIGN_DEVICES_" + re.sub(r"[^A-Za-z0-9]", "_", resource).upper()


def socket_name(resource: str) -> str:
    """A short socket name per resource (``numalign-<8 hex>.sock``): unix socket paths
    hold 107 bytes, and the kubelet's folder may already be deep."""
    return f"numalign-{hashlib.sha256(resource.encode()).hexdigest()[:8]}.sock"


def preferred_allocation(devices: Sequence[PluginDevice], available: Sequence[str],
                         must_include: Sequence[str], size: int) -> list[str]:
    """``size`` devices out of ``available``: ``must_include`` first, then the devices on
    their NUMA nodes, then the NUMA node where the rest fits most tightly (or the one with
    the most devices when none fits), devices without a NUMA node last."""
    numa = {d.id: d.numa_node for d in devices}
    chosen = [i for i in dict.fromkeys(must_include) if i in available][:size]
    rest = [i for i in dict.fromkeys(available) if i not in chosen]
    need = size - len(chosen)
    home: Counter[int] = Counter()
    free: Counter[int] = Counter()
    for ids, counter in ((chosen, home), (rest, free)):
        for i in ids:
            node = numa.get(i)
            if node is not None:
                counter[node] += 1

    def node_rank(node: int) -> tuple[int, int, int]:
        if node in home:
            return (0, -home[node], node)
        if free[node] >= need:
            return (1, free[node], node)  # the tightest fit keeps big nodes whole
        return (2, -free[node], node)

    order = {n: r for r, n in enumerate(sorted(free, key=node_rank))}

    def device_rank(i: str) -> tuple[int, str]:
        node = numa.get(i)
        return (len(order) if node is None else order[node], i)

    rest.sort(key=device_rank)
    return chosen + rest[:max(need, 0)]


class _Servicer(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, plugin: ResourcePlugin) -> None:
        self.plugin = plugin

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return self.plugin.options()

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        p = self.plugin
        p.log(f"{p.resource}: ListAndWatch: advertising {len(p.devices)} devices")
        yield p.list_response()
        stopping = p.stopping
        while context.is_active() and not stopping.wait(0.5):
            pass

    def GetPreferredAllocation(self, request: pb.PreferredAllocationRequest,
                               context: Any) -> pb.PreferredAllocationResponse:
        p = self.plugin
        responses = []
        for creq in request.container_requests:
            ids = preferred_allocation(p.devices, list(creq.available_deviceIDs),
                                       list(creq.must_include_deviceIDs), creq.allocation_size)
            responses.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        p = self.plugin
        responses = []
        for creq in request.container_requests:
            ids = list(creq.devices_ids)
            unknown = [i for i in ids if i not in p.by_id]
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{p.resource}: unknown devices {unknown}")
            p.log(f"{p.resource}: Allocate {ids}")
            responses.append(pb.ContainerAllocateResponse(
                envs={env_var(p.resource): ",".join(ids)}))
        return pb.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request: pb.PreStartContainerRequest,
                          context: Any) -> pb.PreStartContainerResponse:
        p = self.plugin
        unknown = [i for i in request.devices_ids if i not in p.by_id]
        if unknown:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{p.resource}: unknown devices {unknown}")
        p.log(f"{p.resource}: PreStartContainer {list(request.devices_ids)}")
        return pb.PreStartContainerResponse()


class ResourcePlugin:
    """The plugin server of one resource, on ``<plugin_dir>/<socket_name(resource)>``."""

    def __init__(self, resource: str, devices: Sequence[PluginDevice], plugin_dir: Path,
                 log: Log) -> None:
        self.resource = resource
        self.devices = list(devices)
        self.by_id = {d.id: d for d in self.devices}
        self.endpoint = socket_name(resource)
        self.socket = plugin_dir / self.endpoint
        self.log = log
        self.stopping = threading.Event()
        self._server: grpc.Server | None = None

    def options(self) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=True,
                                      get_preferred_allocation_available=True)

    def list_response(self) -> pb.ListAndWatchResponse:
        out = []
        for d in self.devices:
            topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa_node)]
                                   if d.numa_node is not None else [])
            out.append(pb.Device(ID=d.id, health=HEALTHY, topology=topo))
        return pb.ListAndWatchResponse(devices=out)

    def serve(self) -> None:
        """(Re)start the server on a fresh socket file."""
        self.stop()
        self.stopping = threading.Event()
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8,
                                                        thread_name_prefix="device-plugin"))
        pb_grpc.add_DevicePluginServicer_to_server(  # type: ignore[no-untyped-call]
            _Servicer(self), server)
        if server.add_insecure_port(f"unix://{self.socket}") == 0:
            raise DevicePluginError(f"{self.resource}: cannot listen on {self.socket}")
        server.start()
        self._server = server

    def stop(self) -> None:
        self.stopping.set()
        if self._server is not None:
            self._server.stop(grace=1.0).wait()
            self._server = None
            self.socket.unlink(missing_ok=True)

    def register(self, kubelet_socket: Path, timeout: float = 10.0) -> None:
        request = pb.RegisterRequest(version=API_VERSION, endpoint=self.endpoint,
                                     resource_name=self.resource, options=self.options())
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            stub = pb_grpc.RegistrationStub(channel)  # type: ignore[no-untyped-call]
            stub.Register(request, timeout=timeout)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns


class DevicePlugin:
    """All resources of a machine, kept registered with the kubelet under ``kubelet_dir``."""

    def __init__(self, devices: Mapping[str, Sequence[PluginDevice]], kubelet_dir: Path,
                 log: Log | None = None, poll: float = 0.5) -> None:
        self.plugin_dir = Path(kubelet_dir) / "device-plugins"
        self.kubelet_socket = self.plugin_dir / KUBELET_SOCKET
        self.log: Log = log or (lambda _m: None)
        self.poll = poll
        self.plugins = [ResourcePlugin(r, devs, self.plugin_dir, self.log)
                        for r, devs in sorted(devices.items())]
        for p in self.plugins:
            if len(str(p.socket).encode()) > UNIX_PATH_MAX:
                raise DevicePluginError(
                    f"--kubelet-dir: the socket path {p.socket} is longer than a unix "
                    f"socket allows ({UNIX_PATH_MAX} bytes): use a shorter kubelet folder")
        self.registrations = 0  # how many times every resource was registered

    def run(self, stop: threading.Event) -> None:
        """Serve and keep registered until ``stop`` is set; then remove the sockets."""
        registered_with: tuple[int, int] | None = None
        retry_at = 0.0
        delay = self.poll
        waiting_logged = False
        try:
            while not stop.is_set():
                kubelet = _identity(self.kubelet_socket)
                lost = any(not p.socket.exists() for p in self.plugins)
                if kubelet is None:
                    if not waiting_logged:
                        self.log(f"waiting for the kubelet's {self.kubelet_socket}")
                        waiting_logged = True
                elif (kubelet != registered_with or lost) and time.monotonic() >= retry_at:
                    if self._register_all(again=registered_with is not None):
                        registered_with, delay, waiting_logged = kubelet, self.poll, False
                    else:
                        retry_at = time.monotonic() + delay
                        delay = min(delay * 2, 10.0)
                stop.wait(self.poll)
        finally:
            for p in self.plugins:
                p.stop()

    def _register_all(self, again: bool) -> bool:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        try:
            for p in self.plugins:
                p.serve()
                p.register(self.kubelet_socket)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            details = e.details() if hasattr(e, "details") else str(e)
            self.log(f"registration with {self.kubelet_socket} failed ({code}: {details}); "
                     "retrying")
            return False
        self.registrations += 1
        self.log(("re-registered " if again else "registered ") + ", ".join(
            f"{p.resource} ({len(p.devices)} devices on {p.endpoint})" for p in self.plugins))
        return True


def run_device_plugin(machine: Machine, kubelet_dir: Path, stop: threading.Event,
                      log: Log | None = None) -> None:
    """``numalign dev device-plugin``: serve ``machine``'s devices until ``stop`` is set.
    The kubelet may start later (its folder may not exist yet): the plugin waits for it."""
    if kubelet_dir.exists() and not kubelet_dir.is_dir():
        raise DevicePluginError(f"--kubelet-dir: {kubelet_dir} is not a folder")
    DevicePlugin(devices_by_resource(machine), kubelet_dir, log=log).run(stop)


__all__ = [
    "API_VERSION",
    "DEFAULT_RESOURCE",
    "DevicePlugin",
    "DevicePluginError",
    "PluginDevice",
    "ResourcePlugin",
    "devices_by_resource",
    "env_var",
    "preferred_allocation",
    "run_device_plugin",
    "socket_name",
]
