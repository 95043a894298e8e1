"""The real node's DRA kubelet plugin (numalign.devcluster.draplugin) without a kubelet:
which devices a claim's allocation gives it, the CDI spec it writes for a claim, prepare
and unprepare repeated as the kubelet repeats them, its gRPC services over real unix
sockets (registration info, NodePrepareResources, NodeUnprepareResources) and its
ResourceSlices published again after the kubelet wipes them."""

from __future__ import annotations

import copy
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from numalign.api.kube import ApiError
from numalign.devcluster.draplugin import (
    CDI_KIND,
    DRIVER,
    SERVICE,
    SLICES_PATH,
    Allocated,
    DraPlugin,
    DraPluginError,
    Preparer,
    allocated_devices,
    cdi_id,
    cdi_spec,
    env_var,
    spec_file,
)
from numalign.kubeletapi.dra_v1 import api_pb2 as dra_pb
from numalign.kubeletapi.dra_v1 import api_pb2_grpc as dra_grpc
from numalign.kubeletapi.pluginregistration_v1 import api_pb2 as reg_pb
from numalign.kubeletapi.pluginregistration_v1 import api_pb2_grpc as reg_grpc
from numalign.topology.machine import machine_from_dict

MACHINE = machine_from_dict({
    "name": "two", "numaNodes": [{"id": 0, "cpus": "0", "memory": "1Gi"},
                                 {"id": 1, "cpus": "1", "memory": "1Gi"}],
    "devices": [{"resource": "numalign.io/sample-device", "id": "dev0", "numaNode": 0},
                {"resource": "numalign.io/sample-device", "id": "dev1", "numaNode": 1}]})
CLAIM_PATH = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"


def claim(uid: str = "u-1", results: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    if results is None:
        results = [{"request": "dev", "driver": DRIVER, "pool": "localhost", "device": "dev1"}]
    return {"metadata": {"namespace": "ns", "name": "c", "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}}}


class FakeKube:
    """The API server's objects by path, as the plugin reads and writes them."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {
            "/api/v1/nodes/localhost": {"metadata": {"name": "localhost", "uid": "node-uid"}}}
        self.writes = 0

    def get_or_none(self, path: str, params: Any = None) -> dict[str, Any] | None:
        obj = self.objects.get(path)
        return copy.deepcopy(obj) if obj is not None else None

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        key = f"{path}/{body['metadata']['name']}"
        if key in self.objects:
            raise ApiError(409, "AlreadyExists", "exists")
        self.writes += 1
        self.objects[key] = dict(body, metadata=dict(body["metadata"], resourceVersion="1"))
        return body

    def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.writes += 1
        self.objects[path] = body
        return body


# ------------------------------------------------------------------ pure parts


def test_a_claims_allocation_gives_this_drivers_devices_of_this_node() -> None:
    results = [{"request": "a", "driver": DRIVER, "pool": "localhost", "device": "dev1"},
               {"request": "b", "driver": "gpu.example.com", "pool": "x", "device": "g0"},
               {"request": "c", "driver": DRIVER, "pool": "localhost", "device": "dev0"}]
    assert allocated_devices(claim(results=results), "u-1", "localhost") == [
        Allocated("a", "localhost", "dev1"), Allocated("c", "localhost", "dev0")]
    # only another driver's devices: nothing to prepare here
    assert allocated_devices(claim(results=results[1:2]), "u-1", "localhost") == []


@pytest.mark.parametrize("body, uid, words", [
    (claim(uid="other"), "u-1", "uid other"),
    ({"metadata": {"uid": "u-1", "namespace": "ns", "name": "c"}, "status": {}}, "u-1",
     "not allocated"),
    (claim(results=[{"request": "a", "driver": DRIVER, "pool": "node-b", "device": "dev1"}]),
     "u-1", "pool node-b"),
])
def test_a_claim_it_cannot_prepare_says_why(body: dict[str, Any], uid: str, words: str) -> None:
    with pytest.raises(DraPluginError, match=words):
        allocated_devices(body, uid, "localhost")


def test_the_cdi_spec_names_each_prepared_device_in_the_environment() -> None:
    devices = [Allocated("dev", "localhost", "dev1"), Allocated("dev", "localhost", "gpu-0.a")]
    spec = cdi_spec("u-1", devices)
    assert spec == {"cdiVersion": "0.6.0", "kind": "dra.numalign.io/device", "devices": [
        {"name": "u-1-dev1", "containerEdits": {"env": ["NUMALIGN_DRA_DEVICE_DEV1=dev1"]}},
        {"name": "u-1-gpu-0.a",
         "containerEdits": {"env": ["NUMALIGN_DRA_DEVICE_GPU_0_A=gpu-0.a"]}}]}
    assert cdi_id("u-1", "dev1") == f"{CDI_KIND}=u-1-dev1"
    # CDI's rules: vendor a domain, class and device names of [A-Za-z0-9_.:-]
    vendor, cls = CDI_KIND.split("/")
    assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_.-]*[A-Za-z0-9]", vendor)
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", cls)
    for d in spec["devices"]:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.:-]*[A-Za-z0-9]", d["name"])
    assert env_var("a/b-c") == "NUMALIGN_DRA_DEVICE_A_B_C"


def test_prepare_and_unprepare_are_idempotent(tmp_path: Path) -> None:
    claims = {("ns", "c"): claim()}
    logged: list[str] = []
    p = Preparer(tmp_path / "cdi", "localhost", lambda ns, n: claims.get((ns, n)),
                 logged.append)
    first = p.prepare("ns", "c", "u-1")
    spec = spec_file(tmp_path / "cdi", "u-1")
    text = spec.read_text()
    assert json.loads(text) == cdi_spec("u-1", [Allocated("dev", "localhost", "dev1")])
    again = p.prepare("ns", "c", "u-1")  # the kubelet asks again (after its restart)
    assert again == first and spec.read_text() == text
    assert [(d.pool_name, d.device_name, list(d.cdi_device_ids), list(d.request_names))
            for d in first] == [("localhost", "dev1", [cdi_id("u-1", "dev1")], ["dev"])]
    assert sorted(x.name for x in (tmp_path / "cdi").iterdir()) == [spec.name]  # no temp
    p.unprepare("ns", "c", "u-1")
    assert not spec.exists()
    p.unprepare("ns", "c", "u-1")  # again: nothing left, no error
    with pytest.raises(DraPluginError, match="not found"):
        p.prepare("ns", "gone", "u-2")


# ------------------------------------------------------------------ over sockets


@pytest.fixture
def kubelet_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="nal-dra-"))  # short: unix socket paths
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def plugin(kubelet_dir: Path) -> Iterator[tuple[DraPlugin, FakeKube]]:
    kube = FakeKube()
    p = DraPlugin(MACHINE, "localhost", kubelet_dir, kubelet_dir / "cdi", kube)  # type: ignore[arg-type]
    p.serve()
    yield p, kube
    p.stop_servers()


def test_it_registers_as_a_dra_plugin_and_prepares_over_grpc(
        plugin: tuple[DraPlugin, FakeKube], kubelet_dir: Path) -> None:
    p, kube = plugin
    registry = kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock"
    assert registry.is_socket()
    with grpc.insecure_channel(f"unix://{registry}") as ch:
        reg = reg_grpc.RegistrationStub(ch)  # type: ignore[no-untyped-call]
        info = reg.GetInfo(reg_pb.InfoRequest(), timeout=10)
        assert (info.type, info.name, list(info.supported_versions)) == (
            "DRAPlugin", DRIVER, [SERVICE])
        assert Path(info.endpoint) == kubelet_dir / "plugins" / DRIVER / "dra.sock"
        assert not p.registered.is_set()
        reg.NotifyRegistrationStatus(reg_pb.RegistrationStatus(plugin_registered=True),
                                     timeout=10)
        assert p.registered.is_set()
    kube.objects[CLAIM_PATH] = claim()
    req = [dra_pb.Claim(namespace="ns", name="c", uid="u-1"),
           dra_pb.Claim(namespace="ns", name="missing", uid="u-9")]
    with grpc.insecure_channel(f"unix://{info.endpoint}") as ch:
        dra = dra_grpc.DRAPluginStub(ch)  # type: ignore[no-untyped-call]
        out = dra.NodePrepareResources(dra_pb.NodePrepareResourcesRequest(claims=req),
                                       timeout=10)
        ok, missing = out.claims["u-1"], out.claims["u-9"]
        assert not ok.error
        assert [list(d.cdi_device_ids) for d in ok.devices] == [[cdi_id("u-1", "dev1")]]
        assert "not found" in missing.error
        assert spec_file(kubelet_dir / "cdi", "u-1").is_file()
        gone = dra.NodeUnprepareResources(dra_pb.NodeUnprepareResourcesRequest(claims=req),
                                          timeout=10)
        assert set(gone.claims) == {"u-1", "u-9"}
        assert not any(r.error for r in gone.claims.values())
        assert not spec_file(kubelet_dir / "cdi", "u-1").exists()


def test_slices_published_again_after_the_kubelet_wipes_them(
        plugin: tuple[DraPlugin, FakeKube]) -> None:
    p, kube = plugin
    assert p.publish() == 1
    (path,) = [k for k in kube.objects if k.startswith(SLICES_PATH)]
    obj = kube.objects[path]
    assert obj["spec"]["driver"] == DRIVER and obj["spec"]["nodeName"] == "localhost"
    assert obj["metadata"]["ownerReferences"][0]["uid"] == "node-uid"
    numa = {d["name"]: d["attributes"]["resource.kubernetes.io/numaNode"]["int"]
            for d in obj["spec"]["devices"]}
    assert numa == {"dev0": 0, "dev1": 1}
    assert {d["attributes"][f"{DRIVER}/resource"]["string"] for d in obj["spec"]["devices"]} \
        == {"numalign.io/sample-device"}
    assert p.publish() == 0  # unchanged: nothing written
    del kube.objects[path]  # the kubelet's wipe (at its start, or the plugin away)
    assert p.publish() == 1 and path in kube.objects


def test_a_socket_path_too_long_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(DraPluginError, match="--kubelet-dir"):
        DraPlugin(MACHINE, "n", tmp_path / ("x" * 120), tmp_path, FakeKube())  # type: ignore[arg-type]


def test_the_command_refuses_a_machine_without_devices(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from numalign.devcluster import command as dev

    machine = tmp_path / "bare.yaml"
    machine.write_text("name: bare\nnumaNodes:\n  - {id: 0, cpus: '0', memory: 1Gi}\n")
    argv = ["dra-plugin", "--machine", str(machine), "--kubelet-dir", str(tmp_path),
            "--cdi-dir", str(tmp_path / "cdi")]
    assert dev.main(argv) == 1
    assert "--machine: machine bare lists no devices" in capsys.readouterr().err


def test_the_real_node_runs_the_plugin_where_containerd_reads_cdi_specs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import tomllib

    from numalign.devcluster import command as dev
    from numalign.devcluster import realnode_dra
    from numalign.devcluster.cluster import DevCluster
    from numalign.devcluster.realnode import RealNode

    node = RealNode(DevCluster(tmp_path / "state", name="t"), None, mode="nri", dra=True)
    node.dir.mkdir(parents=True)
    node._write_containerd_config()
    config = tomllib.loads((node.containerd_dir / "config.toml").read_text())
    cdi_dirs = config["plugins"]["io.containerd.cri.v1.runtime"]["cdi_spec_dirs"]
    argv = realnode_dra.plugin_argv(["numalign"], tmp_path / "m.yaml", node.kubelet_dir,
                                    node.containerd_dir / "cdi", node.name)
    assert argv[argv.index("--cdi-dir") + 1] in cdi_dirs  # its specs are containerd's
    assert argv[argv.index("--kubelet-dir") + 1] == str(node.kubelet_dir)
    assert argv[argv.index("--node") + 1] == "localhost"
    # dev status says the devices come through DRA
    node._save_state({"name": "localhost", "mode": "nri", "dra": True})
    assert dev.main(["status", "--state-dir", str(node.cluster.state_dir)]) == 1
    assert "devices through DRA (dra.numalign.io)" in capsys.readouterr().out
