"""The sample device plugin against an in-process kubelet registry (the device plugin
API v1beta1 over real unix sockets): what it registers, what it advertises (devices and
their NUMA nodes), how it answers Allocate, GetPreferredAllocation and PreStartContainer,
and that it registers again when the kubelet restarts."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from numalign.devcluster.deviceplugin import (
    DEFAULT_RESOURCE,
    DevicePlugin,
    DevicePluginError,
    PluginDevice,
    devices_by_resource,
    env_var,
    preferred_allocation,
    run_device_plugin,
)
from numalign.kubeletapi.deviceplugin_v1beta1 import api_pb2 as pb
from numalign.kubeletapi.deviceplugin_v1beta1 import api_pb2_grpc as pb_grpc
from numalign.topology.machine import load_machine, machine_from_dict

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "machines"
TIMEOUT = 15.0


class FakeKubelet(pb_grpc.RegistrationServicer):  # type: ignore[misc]
    """The kubelet's Registration service on ``device-plugins/kubelet.sock``."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        self.requests: queue.Queue[pb.RegisterRequest] = queue.Queue()
        self.server: grpc.Server | None = None

    def Register(self, request: pb.RegisterRequest, context: Any) -> pb.Empty:
        self.requests.put(request)
        return pb.Empty()

    def start(self) -> None:
        """Start as a kubelet does: remove the plugins' sockets, serve a new kubelet.sock."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        for entry in self.plugin_dir.iterdir():
            entry.unlink()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{self.plugin_dir / 'kubelet.sock'}")
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(grace=None).wait()
            self.server = None
        (self.plugin_dir / "kubelet.sock").unlink(missing_ok=True)

    def next_request(self) -> pb.RegisterRequest:
        try:
            return self.requests.get(timeout=TIMEOUT)
        except queue.Empty:
            raise AssertionError("the plugin did not register") from None


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    # unix socket paths are limited to 107 bytes: pytest's tmp_path can be too long
    d = Path(tempfile.mkdtemp(prefix="dp-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


class Running:
    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.plugin.run(self.stop)
        except BaseException as e:  # reported by the test
            self.errors.append(e)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=TIMEOUT)
        assert not self.thread.is_alive(), "the plugin did not stop"
        assert not self.errors, self.errors


@pytest.fixture
def running(kubelet_dir: Path) -> Iterator[Any]:
    started: list[Running] = []

    def start(devices: dict[str, list[PluginDevice]]) -> Running:
        r = Running(DevicePlugin(devices, kubelet_dir, poll=0.1))
        started.append(r)
        return r

    yield start
    for r in started:
        r.close()


def _registered(r: Running, times: int) -> None:
    """Wait until the plugin has counted ``times`` completed registrations (it counts one
    once the kubelet has answered every resource's Register call), then check the count."""
    deadline = time.monotonic() + TIMEOUT
    while r.plugin.registrations < times and time.monotonic() < deadline:
        time.sleep(0.02)
    assert r.plugin.registrations == times


def _stub(kubelet_dir: Path, endpoint: str) -> tuple[grpc.Channel, Any]:
    channel = grpc.insecure_channel(f"unix://{kubelet_dir / 'device-plugins' / endpoint}")
    return channel, pb_grpc.DevicePluginStub(channel)


def _advertised(stub: Any) -> dict[str, tuple[str, list[int]]]:
    stream = stub.ListAndWatch(pb.Empty(), timeout=TIMEOUT)
    first = next(stream)
    stream.cancel()
    return {d.ID: (d.health, [n.ID for n in d.topology.nodes]) for d in first.devices}


def test_registers_and_advertises_the_machines_devices(kubelet_dir: Path, running: Any) -> None:
    kubelet = FakeKubelet(kubelet_dir / "device-plugins")
    kubelet.start()
    try:
        machine = load_machine(FIXTURES / "group4-gpu.yaml")
        running(devices_by_resource(machine))
        req = kubelet.next_request()
        assert req.version == "v1beta1"
        assert req.resource_name == "nvidia.com/gpu"
        assert req.options.get_preferred_allocation_available
        assert req.options.pre_start_required
        # the endpoint is a socket file in the kubelet's device-plugins folder
        assert "/" not in req.endpoint
        assert (kubelet_dir / "device-plugins" / req.endpoint).is_socket()
        channel, stub = _stub(kubelet_dir, req.endpoint)
        with channel:
            opts = stub.GetDevicePluginOptions(pb.Empty(), timeout=TIMEOUT)
            assert opts.pre_start_required and opts.get_preferred_allocation_available
            assert _advertised(stub) == {
                d.id: ("Healthy", [d.numa_node]) for d in machine.devices}

            alloc = stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=["gpu2", "gpu3"]),
                pb.ContainerAllocateRequest(devices_ids=["gpu0"])]), timeout=TIMEOUT)
            envs = [dict(r.envs) for r in alloc.container_responses]
            assert envs == [{"NUMALIGN_DEVICES_NVIDIA_COM_GPU": "gpu2,gpu3"},
                            {"NUMALIGN_DEVICES_NVIDIA_COM_GPU": "gpu0"}]
            with pytest.raises(grpc.RpcError) as err:
                stub.Allocate(pb.AllocateRequest(container_requests=[
                    pb.ContainerAllocateRequest(devices_ids=["gpu9"])]), timeout=TIMEOUT)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "gpu9" in (err.value.details() or "")

            pref = stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=["gpu0", "gpu1", "gpu2", "gpu3"],
                    must_include_deviceIDs=["gpu3"], allocation_size=2)]), timeout=TIMEOUT)
            assert list(pref.container_responses[0].deviceIDs) == ["gpu3", "gpu2"]

            stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["gpu1"]),
                                   timeout=TIMEOUT)
            with pytest.raises(grpc.RpcError):
                stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=["nope"]),
                                       timeout=TIMEOUT)
    finally:
        kubelet.stop()


def test_without_devices_one_sample_device_per_numa_node(kubelet_dir: Path,
                                                         running: Any) -> None:
    machine = load_machine(FIXTURES / "fragmented-8numa.yaml")
    assert not machine.devices
    kubelet = FakeKubelet(kubelet_dir / "device-plugins")
    kubelet.start()
    try:
        running(devices_by_resource(machine))
        req = kubelet.next_request()
        assert req.resource_name == DEFAULT_RESOURCE == "numalign.io/sample-device"
        channel, stub = _stub(kubelet_dir, req.endpoint)
        with channel:
            assert _advertised(stub) == {
                f"sample-{n}": ("Healthy", [n]) for n in machine.numa_ids}
            alloc = stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=[f"sample-{machine.numa_ids[-1]}"])]),
                timeout=TIMEOUT)
            assert dict(alloc.container_responses[0].envs) == {
                "NUMALIGN_DEVICES_NUMALIGN_IO_SAMPLE_DEVICE": f"sample-{machine.numa_ids[-1]}"}
    finally:
        kubelet.stop()


def test_one_registration_per_resource_and_devices_without_numa(kubelet_dir: Path,
                                                                running: Any) -> None:
    machine = machine_from_dict({
        "numaNodes": [{"id": 0, "cpus": "0", "memory": "1Gi"},
                      {"id": 1, "cpus": "1", "memory": "1Gi"}],
        "devices": [{"resource": "example.com/nic", "id": "nic0", "numaNode": 1},
                    {"resource": "example.com/fpga", "id": "f0", "numaNode": None},
                    {"resource": "example.com/nic", "id": "nic1", "numaNode": 0}],
    })
    kubelet = FakeKubelet(kubelet_dir / "device-plugins")
    kubelet.start()
    try:
        running(devices_by_resource(machine))
        reqs = {r.resource_name: r for r in (kubelet.next_request(), kubelet.next_request())}
        assert set(reqs) == {"example.com/nic", "example.com/fpga"}
        assert reqs["example.com/nic"].endpoint != reqs["example.com/fpga"].endpoint
        ch1, nic = _stub(kubelet_dir, reqs["example.com/nic"].endpoint)
        ch2, fpga = _stub(kubelet_dir, reqs["example.com/fpga"].endpoint)
        with ch1, ch2:
            assert _advertised(nic) == {"nic0": ("Healthy", [1]), "nic1": ("Healthy", [0])}
            assert _advertised(fpga) == {"f0": ("Healthy", [])}
    finally:
        kubelet.stop()


def test_waits_for_the_kubelet_and_registers_again_after_its_restart(
        kubelet_dir: Path, running: Any) -> None:
    kubelet_dir.rmdir()  # not even the kubelet's folder exists yet
    plugin_dir = kubelet_dir / "device-plugins"
    machine = load_machine(FIXTURES / "group4-gpu.yaml")
    r = running(devices_by_resource(machine))
    time.sleep(0.5)
    assert r.thread.is_alive() and not r.errors
    kubelet = FakeKubelet(plugin_dir)  # the kubelet comes up after the plugin
    kubelet.start()
    try:
        first = kubelet.next_request()
        # the kubelet's answer reached the plugin (stopping the kubelet before that fails
        # the call, which the plugin retries: a registration of its own, not a restart)
        _registered(r, 1)
        kubelet.stop()  # the kubelet restarts: its socket and the plugins' sockets go
        restarted = FakeKubelet(plugin_dir)
        restarted.start()
        try:
            again = restarted.next_request()
            assert (again.resource_name, again.endpoint) == (first.resource_name,
                                                             first.endpoint)
            channel, stub = _stub(kubelet_dir, again.endpoint)
            with channel:  # served again on a new socket
                assert set(_advertised(stub)) == {"gpu0", "gpu1", "gpu2", "gpu3"}
            _registered(r, 2)
        finally:
            restarted.stop()
    finally:
        kubelet.stop()
    r.close()
    assert [p.name for p in plugin_dir.iterdir()] == [], "sockets left behind"


def test_socket_path_too_long_names_the_option(tmp_path: Path) -> None:
    deep = tmp_path / ("k" * 100)
    with pytest.raises(DevicePluginError, match="--kubelet-dir"):
        DevicePlugin({"example.com/x": [PluginDevice("x0", 0)]}, deep)
    machine = load_machine(FIXTURES / "group4-gpu.yaml")
    (tmp_path / "file").write_text("")
    with pytest.raises(DevicePluginError, match="--kubelet-dir"):
        run_device_plugin(machine, tmp_path / "file", threading.Event())


def test_env_var_names() -> None:
    assert env_var("numalign.io/sample-device") == "NUMALIGN_DEVICES_NUMALIGN_IO_SAMPLE_DEVICE"
    assert env_var("nvidia.com/gpu") == "NUMALIGN_DEVICES_NVIDIA_COM_GPU"


DEVS = [PluginDevice("a0", 0), PluginDevice("a1", 0), PluginDevice("b0", 1),
        PluginDevice("b1", 1), PluginDevice("b2", 1), PluginDevice("x", None)]


@pytest.mark.parametrize(("available", "must", "size", "want"), [
    # the required device's NUMA node first
    (["a0", "a1", "b0", "b1", "b2"], ["b1"], 2, ["b1", "b0"]),
    (["a0", "a1", "b0", "b1", "b2"], ["a1"], 2, ["a1", "a0"]),
    # nothing required: the tightest node that fits the whole request
    (["a0", "a1", "b0", "b1", "b2"], [], 2, ["a0", "a1"]),
    (["a0", "a1", "b0", "b1", "b2"], [], 3, ["b0", "b1", "b2"]),
    # nothing fits on one node: the fullest node first, devices without NUMA last
    (["a0", "b0", "b1", "x"], [], 4, ["b0", "b1", "a0", "x"]),
    # only what is available
    (["a1", "b2"], [], 1, ["a1"]),
])
def test_preferred_allocation(available: list[str], must: list[str], size: int,
                              want: list[str]) -> None:
    assert preferred_allocation(DEVS, available, must, size) == want


def test_command_serves_until_sigterm(kubelet_dir: Path, tmp_path: Path) -> None:
    machine_file = tmp_path / "m.yaml"
    machine_file.write_text(yaml.safe_dump({
        "name": "two", "numaNodes": [{"id": 0, "cpus": "0", "memory": "1Gi"},
                                     {"id": 1, "cpus": "1", "memory": "1Gi"}]}))
    kubelet = FakeKubelet(kubelet_dir / "device-plugins")
    kubelet.start()
    proc = subprocess.Popen(
        [sys.executable, "-m", "numalign.cli", "dev", "device-plugin",
         "--machine", str(machine_file), "--kubelet-dir", str(kubelet_dir)],
        stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        req = kubelet.next_request()
        assert req.resource_name == "numalign.io/sample-device"
        channel, stub = _stub(kubelet_dir, req.endpoint)
        with channel:
            assert _advertised(stub) == {"sample-0": ("Healthy", [0]),
                                         "sample-1": ("Healthy", [1])}
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, err
        assert "registered numalign.io/sample-device" in err
        assert not (kubelet_dir / "device-plugins" / req.endpoint).exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        kubelet.stop()


def test_command_bad_machine_file_names_the_field(kubelet_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"numaNodes": [{"id": 0, "cpus": "0"}]}))
    proc = subprocess.run(
        [sys.executable, "-m", "numalign.cli", "dev", "device-plugin",
         "--machine", str(bad), "--kubelet-dir", str(kubelet_dir)],
        capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert proc.returncode == 1
    assert "numaNodes[0].memory" in proc.stderr


def test_socket_names_are_short_and_distinct() -> None:
    from numalign.devcluster.deviceplugin import socket_name

    names = {socket_name(r) for r in ("numalign.io/sample-device", "nvidia.com/gpu",
                                      "example.com/a-rather-long-resource-name-for-a-nic")}
    assert len(names) == 3
    assert all(len(n) <= 22 and n.endswith(".sock") for n in names)
