"""numalign.kubeletapi: the generated kubelet API stubs are current and work over a socket."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from numalign.devcluster.build import KUBERNETES_VERSION
from numalign.kubeletapi import generate
from numalign.kubeletapi.deviceplugin_v1beta1 import api_pb2 as dp
from numalign.kubeletapi.podresources_v1 import api_pb2 as pr
from numalign.kubeletapi.podresources_v1 import api_pb2_grpc as pr_grpc

GOGO_PROTO = """syntax = "proto3";

package v9;

import "github.com/gogo/protobuf/gogoproto/gogo.proto";

option (gogoproto.goproto_stringer_all) = false;
option (gogoproto.stringer_all) =  true;
option go_package = "example.com/v9";

message Thing {
    string name = 1 [(gogoproto.customname) = "Nom"];
    repeated int64 ids = 2 [(gogoproto.nullable) = false, deprecated = true];
}
"""


def test_module_version_follows_the_control_plane() -> None:
    # k8s.io/kubelet v0.X.Y is published with Kubernetes v1.X.Y
    assert "v0" + KUBERNETES_VERSION[2:] == generate.KUBELET_MODULE_VERSION


def test_generated_modules_are_current(tmp_path: Path) -> None:
    # Go is required by the test command (the protos come from its module cache or proxy):
    # no protos is a broken setup, never a reason to skip this check.
    generate.generate(tmp_path, generate.module_dirs())
    assert generate.stale(generate.REPO_ROOT, tmp_path) == []


def test_cri_stubs_are_the_tests_not_the_packages() -> None:
    assert not (generate.PACKAGE_DIR / "runtime_v1").exists()
    assert (generate.REPO_ROOT / "tests" / "criapi" / "runtime_v1" / "api_pb2.py").is_file()


def test_stale_names_a_changed_file(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    for rel in generate.generated_files():
        (fresh / rel).parent.mkdir(parents=True, exist_ok=True)
        (fresh / rel).write_bytes((generate.REPO_ROOT / rel).read_bytes())
    assert generate.stale(generate.REPO_ROOT, fresh) == []
    rel = Path("operator", "numalign", "kubeletapi", "podresources_v1", "api_pb2_grpc.py")
    (fresh / rel).write_text((fresh / rel).read_text() + "# edited\n")
    assert generate.stale(generate.REPO_ROOT, fresh) == [str(rel)]


def test_strip_gogo_leaves_a_proto_protoc_compiles(tmp_path: Path) -> None:
    stripped = generate.strip_gogo(GOGO_PROTO)
    assert "gogo" not in stripped
    assert 'option go_package = "example.com/v9";' in stripped
    assert "string name = 1;" in stripped
    assert "repeated int64 ids = 2 [deprecated = true];" in stripped
    (tmp_path / "thing.proto").write_text(stripped)
    generate.protoc([f"-I{tmp_path}", f"--python_out={tmp_path}", str(tmp_path / "thing.proto")])
    assert (tmp_path / "thing_pb2.py").exists()


def test_bad_source_folder_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) \
        -> None:
    assert generate.main(["--check", "--source", str(tmp_path),
                          "--cri-source", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "pkg/apis/podresources/v1/api.proto: no such proto" in err


class _Lister(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def List(self, request: Any, context: Any) -> Any:
        dev = pr.ContainerDevices(resource_name="numalign.io/sample-device", device_ids=["d1"],
                                  topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=1)]))
        ctr = pr.ContainerResources(name="main", cpu_ids=[1], devices=[dev])
        return pr.ListPodResourcesResponse(pod_resources=[
            pr.PodResources(name="p", namespace="ns", containers=[ctr])])


@pytest.fixture
def socket_server(tmp_path: Path) -> Iterator[str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pr_grpc.add_PodResourcesListerServicer_to_server(_Lister(), server)
    sock = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    yield f"unix://{sock}"
    server.stop(None)


def test_podresources_round_trip_over_a_unix_socket(socket_server: str) -> None:
    with grpc.insecure_channel(socket_server) as channel:
        resp = pr_grpc.PodResourcesListerStub(channel).List(pr.ListPodResourcesRequest(),
                                                            timeout=5)
    (pod,) = resp.pod_resources
    assert (pod.namespace, pod.name) == ("ns", "p")
    (ctr,) = pod.containers
    assert list(ctr.cpu_ids) == [1]
    assert [d.ID for d in ctr.devices[0].topology.nodes] == [1]
    assert list(ctr.devices[0].device_ids) == ["d1"]


def test_deviceplugin_messages_carry_numa_topology() -> None:
    dev = dp.Device(ID="d0", health="Healthy",
                    topology=dp.TopologyInfo(nodes=[dp.NUMANode(ID=0)]))
    again = dp.Device.FromString(dev.SerializeToString())
    assert again.ID == "d0" and [n.ID for n in again.topology.nodes] == [0]
    assert dp.DESCRIPTOR.package == "v1beta1" and pr.DESCRIPTOR.package == "v1"
