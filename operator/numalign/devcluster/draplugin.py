"""A DRA kubelet plugin for the local real node's test devices (``numalign dev up
--real-node --dra``): the machine file's devices come to pods through Dynamic Resource
Allocation instead of the sample device plugin.

- Publishes the devices as ResourceSlices of driver :data:`DRIVER` (one pool named after the
  node; each device with ``resource.kubernetes.io/numaNode`` from the machine file and its
  kind as ``dra.numalign.io/resource``: the emulated driver's builder,
  :func:`numalign.api.draemulated.resource_slices`), owned by the Node. The kubelet wipes
  its node's slices when it starts and when a driver's plugin stays away, so the plugin
  publishes them once registered and puts them back whenever they are gone.
- Registers with the kubelet through its plugin watcher: a ``pluginregistration.Registration``
  server on ``<kubelet dir>/plugins_registry/dra.numalign.io-reg.sock`` answers ``GetInfo``
  with type ``DRAPlugin``, the driver's name, the endpoint
  ``<kubelet dir>/plugins/dra.numalign.io/dra.sock`` and the one gRPC service it serves
  there, :data:`SERVICE` (the kubelet picks the newest it knows; the optional health
  service is not offered).
- ``NodePrepareResources``: reads each claim (namespace, name; its uid must match), takes
  the devices its allocation gives this driver's pool and writes a CDI spec for the claim
  (:func:`cdi_spec`) into the folder containerd reads (its ``cdi_spec_dirs``); answers the
  CDI ids, which the kubelet hands the runtime with the container. Each device's CDI edits
  set ``NUMALIGN_DRA_DEVICE_<NAME>=<device>`` in the container's environment (as the
  upstream example driver names its prepared devices). ``NodeUnprepareResources`` removes
  the claim's spec. Both are idempotent: the kubelet repeats them after restarts.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from ..api.draclaims import claim_path
from ..api.draemulated import resource_slices
from ..api.kube import REQUEST_ERRORS, ApiError, SyncKube, q
from ..kubeletapi.dra_v1 import api_pb2 as dra_pb
from ..kubeletapi.dra_v1 import api_pb2_grpc as dra_grpc
from ..kubeletapi.pluginregistration_v1 import api_pb2 as reg_pb
from ..kubeletapi.pluginregistration_v1 import api_pb2_grpc as reg_grpc
from ..topology.machine import Machine

DRIVER = "dra.numalign.io"
SERVICE = "v1.DRAPlugin"  # the gRPC service (package's last part . name) the kubelet asks for
PLUGIN_TYPE = "DRAPlugin"
CDI_VERSION = "0.6.0"
CDI_CLASS = "device"
CDI_KIND = f"{DRIVER}/{CDI_CLASS}"
ENV_PREFIX = "NUMALIGN_DRA_DEVICE_"
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
SLICE_LABEL = "numalign.io/dra-plugin"
UNIX_PATH_MAX = 107

JSON = dict[str, Any]
Log = Callable[[str], None]
GetClaim = Callable[[str, str], JSON | None]  # (namespace, name) -> the claim, or None


class DraPluginError(RuntimeError):
    """The plugin cannot run as asked, or a claim cannot be prepared; the message says why."""


@dataclass(frozen=True)
class Allocated:
    """One device of a claim's allocation that this plugin prepares."""

    request: str
    pool: str
    device: str


def env_var(device: str) -> str:
    """``dev1`` -> ``NUMALIGN_DRA_DEVICE_DEV1``."""
    return ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", device).upper()


def cdi_name(claim_uid: str, device: str) -> str:
    """The CDI device name of ``device`` prepared for a claim (unique per claim)."""
    return f"{claim_uid}-{device}"


def cdi_id(claim_uid: str, device: str) -> str:
    """The fully qualified CDI device id the kubelet passes to the runtime."""
    return f"{CDI_KIND}={cdi_name(claim_uid, device)}"


def cdi_spec(claim_uid: str, devices: Iterable[Allocated]) -> JSON:
    """The CDI spec of a prepared claim: one CDI device per allocated device, its container
    edits naming the device in the environment."""
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": [{"name": cdi_name(claim_uid, d.device),
                     "containerEdits": {"env": [f"{env_var(d.device)}={d.device}"]}}
                    for d in devices],
    }


def spec_file(cdi_dir: Path, claim_uid: str) -> Path:
    return cdi_dir / f"{DRIVER}-{re.sub(r'[^A-Za-z0-9-]', '_', claim_uid)}.json"


def allocated_devices(claim: Mapping[str, Any], uid: str, pool: str,
                      driver: str = DRIVER) -> list[Allocated]:
    """The devices ``claim`` (a ResourceClaim) was allocated of ``driver``'s ``pool``, in
    allocation order. Raises DraPluginError when the claim is another one than the kubelet
    asked for (uid), is not allocated, or was given another node's devices of this
    driver."""
    meta = claim.get("metadata") or {}
    if meta.get("uid") != uid:
        raise DraPluginError(f"claim {meta.get('namespace')}/{meta.get('name')}: uid "
                             f"{meta.get('uid')}, the kubelet asked for {uid}")
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        raise DraPluginError(f"claim {meta.get('namespace')}/{meta.get('name')} is not "
                             "allocated")
    results = (allocation.get("devices") or {}).get("results") or []
    out: list[Allocated] = []
    for r in results:
        if not isinstance(r, Mapping) or r.get("driver") != driver:
            continue
        if r.get("pool") != pool:
            raise DraPluginError(f"claim {meta.get('namespace')}/{meta.get('name')}: device "
                                 f"{r.get('device')} of pool {r.get('pool')}, not this node's "
                                 f"({pool})")
        out.append(Allocated(str(r.get("request") or ""), pool, str(r.get("device") or "")))
    return out


def write_atomically(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (containerd may read the folder meanwhile)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Preparer:
    """Prepares and unprepares claims: CDI specs in ``cdi_dir``."""

    def __init__(self, cdi_dir: Path, pool: str, get_claim: GetClaim, log: Log,
                 driver: str = DRIVER) -> None:
        self.cdi_dir = cdi_dir
        self.pool = pool
        self.get_claim = get_claim
        self.log = log
        self.driver = driver
        self.lock = threading.Lock()

    def prepare(self, namespace: str, name: str, uid: str) -> list[dra_pb.Device]:
        """The claim's devices with their CDI ids; its spec written. Raises DraPluginError."""
        claim = self.get_claim(namespace, name)
        if claim is None:
            raise DraPluginError(f"claim {namespace}/{name} not found")
        devices = allocated_devices(claim, uid, self.pool, self.driver)
        if devices:
            with self.lock:
                write_atomically(spec_file(self.cdi_dir, uid),
                                 json.dumps(cdi_spec(uid, devices), indent=2) + "\n")
        self.log(f"prepared claim {namespace}/{name} ({uid}): "
                 f"{', '.join(d.device for d in devices) or 'no devices of ' + self.driver}")
        return [dra_pb.Device(request_names=[d.request] if d.request else [],
                              pool_name=d.pool, device_name=d.device,
                              cdi_device_ids=[cdi_id(uid, d.device)]) for d in devices]

    def unprepare(self, namespace: str, name: str, uid: str) -> None:
        with self.lock:
            spec_file(self.cdi_dir, uid).unlink(missing_ok=True)
        self.log(f"unprepared claim {namespace}/{name} ({uid})")


class _DraServicer(dra_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, preparer: Preparer) -> None:
        self.p = preparer

    def NodePrepareResources(self, request: dra_pb.NodePrepareResourcesRequest,
                             context: Any) -> dra_pb.NodePrepareResourcesResponse:
        out: dict[str, dra_pb.NodePrepareResourceResponse] = {}
        for c in request.claims:
            try:
                devices = self.p.prepare(c.namespace, c.name, c.uid)
                out[c.uid] = dra_pb.NodePrepareResourceResponse(devices=devices)
            except (DraPluginError, OSError, *REQUEST_ERRORS) as e:
                self.p.log(f"prepare {c.namespace}/{c.name}: {e}")
                out[c.uid] = dra_pb.NodePrepareResourceResponse(error=str(e))
        return dra_pb.NodePrepareResourcesResponse(claims=out)

    def NodeUnprepareResources(self, request: dra_pb.NodeUnprepareResourcesRequest,
                               context: Any) -> dra_pb.NodeUnprepareResourcesResponse:
        out: dict[str, dra_pb.NodeUnprepareResourceResponse] = {}
        for c in request.claims:
            try:
                self.p.unprepare(c.namespace, c.name, c.uid)
                out[c.uid] = dra_pb.NodeUnprepareResourceResponse()
            except OSError as e:
                out[c.uid] = dra_pb.NodeUnprepareResourceResponse(error=str(e))
        return dra_pb.NodeUnprepareResourcesResponse(claims=out)


class _RegistrationServicer(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, plugin: DraPlugin) -> None:
        self.plugin = plugin

    def GetInfo(self, request: reg_pb.InfoRequest, context: Any) -> reg_pb.PluginInfo:
        return reg_pb.PluginInfo(type=PLUGIN_TYPE, name=self.plugin.driver,
                                 endpoint=str(self.plugin.dra_socket),
                                 supported_versions=[SERVICE])

    def NotifyRegistrationStatus(self, request: reg_pb.RegistrationStatus,
                                 context: Any) -> reg_pb.RegistrationStatusResponse:
        self.plugin.registration_status(request.plugin_registered, request.error)
        return reg_pb.RegistrationStatusResponse()


class DraPlugin:
    """The plugin of one node: its two gRPC servers and its ResourceSlices."""

    def __init__(self, machine: Machine, node: str, kubelet_dir: Path, cdi_dir: Path,
                 kube: SyncKube, log: Log | None = None, driver: str = DRIVER,
                 poll: float = 2.0) -> None:
        self.machine = machine
        self.node = node
        self.driver = driver
        self.kube = kube
        self.log: Log = log or (lambda _m: None)
        self.poll = poll
        self.registry_socket = Path(kubelet_dir) / "plugins_registry" / f"{driver}-reg.sock"
        self.dra_socket = Path(kubelet_dir) / "plugins" / driver / "dra.sock"
        for s in (self.registry_socket, self.dra_socket):
            if len(str(s).encode()) > UNIX_PATH_MAX:
                raise DraPluginError(f"--kubelet-dir: the socket path {s} is longer than a "
                                     f"unix socket allows ({UNIX_PATH_MAX} bytes)")
        self.preparer = Preparer(cdi_dir, node, self._claim, self.log, driver)
        self.registered = threading.Event()
        self._servers: list[grpc.Server] = []

    def _claim(self, namespace: str, name: str) -> JSON | None:
        return self.kube.get_or_none(claim_path(namespace, name))

    def registration_status(self, registered: bool, error: str) -> None:
        if registered:
            self.log(f"registered with the kubelet as DRA driver {self.driver}")
            self.registered.set()
        else:
            self.log(f"the kubelet refused the registration: {error}")

    def slices(self, node_uid: str | None) -> list[JSON]:
        out = resource_slices(self.machine, self.node, driver=self.driver)
        for obj in out:
            obj["metadata"]["labels"] = {SLICE_LABEL: "true"}
            if node_uid:
                obj["metadata"]["ownerReferences"] = [{
                    "apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node_uid}]
        return out

    def publish(self) -> int:
        """Create the node's slices that are missing (the kubelet wiped them, or they never
        were) or differ; how many were written."""
        node = self.kube.get_or_none(f"/api/v1/nodes/{q(self.node)}")
        if node is None:
            return 0
        written = 0
        for obj in self.slices((node.get("metadata") or {}).get("uid")):
            path = f"{SLICES_PATH}/{q(obj['metadata']['name'])}"
            old = self.kube.get_or_none(path)
            if old is None:
                try:
                    self.kube.create(SLICES_PATH, obj)
                except ApiError as e:
                    if e.status != 409:
                        raise
                    continue
            elif old.get("spec") != obj["spec"]:
                obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                self.kube.put(path, obj)
            else:
                continue
            written += 1
        if written:
            self.log(f"published {written} ResourceSlice(s) of {len(self.machine.devices)} "
                     f"devices for node {self.node}")
        return written

    def serve(self) -> None:
        self.stop_servers()
        self.dra_socket.parent.mkdir(parents=True, exist_ok=True)
        self.registry_socket.parent.mkdir(parents=True, exist_ok=True)
        for socket in (self.dra_socket, self.registry_socket):
            socket.unlink(missing_ok=True)
            server = grpc.server(futures.ThreadPoolExecutor(
                max_workers=4, thread_name_prefix="dra-plugin"))
            if socket == self.dra_socket:
                dra_grpc.add_DRAPluginServicer_to_server(  # type: ignore[no-untyped-call]
                    _DraServicer(self.preparer), server)
            else:
                reg_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
                    _RegistrationServicer(self), server)
            if server.add_insecure_port(f"unix://{socket}") == 0:
                raise DraPluginError(f"cannot listen on {socket}")
            server.start()
            self._servers.append(server)

    def stop_servers(self) -> None:
        for server in self._servers:
            server.stop(grace=1.0).wait()
        self._servers = []
        # the registration socket last gone: the kubelet deregisters the driver
        for s in (self.registry_socket, self.dra_socket):
            s.unlink(missing_ok=True)

    def run(self, stop: threading.Event) -> None:
        """Serve until ``stop`` is set; keep the slices published once registered; serve
        again when a socket disappears."""
        self.serve()
        self.log(f"serving {SERVICE} on {self.dra_socket}, registration on "
                 f"{self.registry_socket}")
        try:
            while not stop.is_set():
                if not (self.dra_socket.exists() and self.registry_socket.exists()):
                    self.log("a socket disappeared: serving again")
                    self.serve()
                if self.registered.is_set():
                    try:
                        self.publish()
                    except REQUEST_ERRORS as e:
                        self.log(f"publishing the ResourceSlices failed: {e}; retrying")
                stop.wait(self.poll)
        finally:
            self.stop_servers()


def check(machine: Machine, kubelet_dir: Path) -> None:
    """Raise DraPluginError when the plugin cannot serve ``machine`` there."""
    if kubelet_dir.exists() and not kubelet_dir.is_dir():
        raise DraPluginError(f"--kubelet-dir: {kubelet_dir} is not a folder")
    if not machine.devices:
        raise DraPluginError(f"--machine: machine {machine.name} lists no devices to publish")


def run_dra_plugin(machine: Machine, node: str, kubelet_dir: Path, cdi_dir: Path,
                   kube: SyncKube, stop: threading.Event, log: Log | None = None) -> None:
    """``numalign dev dra-plugin``: serve ``machine``'s devices until ``stop`` is set."""
    check(machine, kubelet_dir)
    DraPlugin(machine, node, kubelet_dir, cdi_dir, kube, log=log).run(stop)


__all__ = [
    "CDI_KIND",
    "DRIVER",
    "SERVICE",
    "Allocated",
    "DraPlugin",
    "DraPluginError",
    "Preparer",
    "allocated_devices",
    "cdi_id",
    "cdi_spec",
    "check",
    "env_var",
    "run_dra_plugin",
    "spec_file",
]
