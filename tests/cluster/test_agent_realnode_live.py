"""``numalign agent --node NAME --pod-resources SOCKET --kubelet-config FILE`` against the
real API server: the kubelet's allocations (a PodResources server in this test process,
answering as a kubelet would) are what ``kubectl get nt NAME`` shows, container by
container, through the CRD's schema; a restarted agent publishes the same; ``numalign
explain`` compares the kubelet's decision with the engine's."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

import testdata
from numalign.kubeletapi.podresources_v1 import api_pb2 as pr
from numalign.kubeletapi.podresources_v1 import api_pb2_grpc as pr_grpc
from numalign.topology.quantity import parse_cpulist

pytestmark = pytest.mark.cluster

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
SAMPLE = "numalign.io/sample-device"
DUMP = "16amd64-8n2c"  # 8 NUMA nodes, CPUs 2i and 2i+1 on node i
CONFIG = """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cpuManagerPolicy: static
reservedSystemCPUs: "0"
topologyManagerPolicy: single-numa-node
topologyManagerScope: container
"""


def dev(ids: list[str], node: int) -> Any:
    return pr.ContainerDevices(resource_name=SAMPLE, device_ids=ids,
                               topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=node)]))


class Kubelet(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, ns: str) -> None:
        # What the static CPU manager and device manager give, in this order, under
        # single-numa-node with CPU 0 reserved: b (2 CPUs) on NUMA node 1, then a
        # (1 CPU + 1 device) on NUMA node 0.
        self.pods = [
            pr.PodResources(namespace=ns, name="b", containers=[
                pr.ContainerResources(name="main", cpu_ids=[2, 3])]),
            pr.PodResources(namespace=ns, name="a", containers=[
                pr.ContainerResources(name="main", cpu_ids=[1], devices=[dev(["dev-0"], 0)]),
                pr.ContainerResources(name="log")]),
        ]

    def List(self, request: Any, context: Any) -> Any:
        return pr.ListPodResourcesResponse(pod_resources=self.pods)

    def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        return pr.AllocatableResourcesResponse(cpu_ids=list(range(1, 16)),
                                               devices=[dev(["dev-0"], 0), dev(["dev-1"], 1)])


def guaranteed(name: str, node: str, cpus: str, device: bool) -> dict[str, Any]:
    res = {"cpu": cpus, "memory": "64Mi", **({SAMPLE: "1"} if device else {})}
    containers = [{"name": "main", "image": "numalign.local/workload:dev",
                   "resources": {"requests": res, "limits": res}}]
    if name == "a":
        small = {"cpu": "100m", "memory": "16Mi"}  # Guaranteed, on the shared CPUs
        containers.append({"name": "log", "image": "numalign.local/workload:dev",
                           "resources": {"requests": small, "limits": small}})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": containers}}


@pytest.fixture
def kubelet_socket(tmp_path: Path, namespace: str) -> Iterator[tuple[Kubelet, Path]]:
    k = Kubelet(namespace)
    sock = tmp_path / "kubelet" / "pod-resources" / "kubelet.sock"
    sock.parent.mkdir(parents=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pr_grpc.add_PodResourcesListerServicer_to_server(k, server)
    server.add_insecure_port(f"unix://{sock}")
    server.start()
    yield k, sock
    server.stop(None)


def test_nodetopology_equals_podresources(kubeconfig: Path, kubectl: Kubectl,
                                          wait: Callable[..., Any], tmp_path: Path,
                                          namespace: str,
                                          kubelet_socket: tuple[Kubelet, Path]) -> None:
    k, sock = kubelet_socket
    with tarfile.open(testdata.SYSFS / f"{DUMP}.tar.bz2") as tar:
        tar.extractall(tmp_path / "root", filter="data")
    root = next(p.parent.parent for p in (tmp_path / "root").rglob("sys/devices"))
    (tmp_path / "kubelet-config.yaml").write_text(CONFIG)
    name = f"real-{uuid.uuid4().hex[:6]}"
    for pod in (guaranteed("a", name, "1", True), guaranteed("b", name, "2", False)):
        kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))
    uids = {n: json.loads(kubectl("get", "pod", n, "-n", namespace, "-o", "json").stdout)
            ["metadata"]["uid"] for n in ("a", "b")}
    cmd = [sys.executable, "-m", "numalign.cli", "agent", "--kubeconfig", str(kubeconfig),
           "--node", name, "--root", str(root), "--pod-resources", str(sock),
           "--kubelet-config", str(tmp_path / "kubelet-config.yaml")]
    log = tmp_path / "agent.log"

    def nt() -> Any:
        p = kubectl("get", "nodetopology", name, "-o", "json", check=False)
        doc = json.loads(p.stdout) if p.returncode == 0 else None
        status = (doc or {}).get("status") or {}
        # both pods, and the node's ResourceSlices read (none: an empty list), which the
        # agent lists beside PodResources and may publish a moment later
        return doc if len(status.get("admitted") or []) == 2 and all(
            e.get("uid") for e in status["admitted"]) and status.get("draDevices") == [] \
            else None

    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        doc = wait(nt, 60, "the kubelet's two pods in NodeTopology status")
        status = doc["status"]
        listed = {p.name: p for p in k.pods}
        for entry in status["admitted"]:
            pod = listed[entry["pod"]]
            assert entry["namespace"] == namespace and entry["uid"] == uids[entry["pod"]]
            assert [c["name"] for c in entry["containers"]] == [c.name for c in pod.containers]
            for shown, ctr in zip(entry["containers"], pod.containers, strict=True):
                assert parse_cpulist(shown.get("cpus", "")) == sorted(ctr.cpu_ids)
                assert shown.get("devices", {}) == {
                    d.resource_name: list(d.device_ids) for d in ctr.devices}
            assert (entry["policy"], entry["source"]) == ("single-numa-node", "kubelet")
        by_pod = {e["pod"]: e for e in status["admitted"]}
        assert by_pod["a"]["numaNodes"] == [0] and by_pod["b"]["numaNodes"] == [1]
        assert status["kubelet"]["reservedSystemCPUs"] == "0"
        zones = {z["id"]: z for z in status["zones"]}
        assert (zones[0]["allocatable"]["cpu"], zones[0]["available"]["cpu"]) == (1, 0)
        assert (zones[1]["allocatable"]["cpu"], zones[1]["available"]["cpu"]) == (2, 0)
        assert status["summary"]["cpus"] == "12/15"

        # restarted, the agent publishes the same
        proc.terminate()
        proc.wait(15)
        before = {k: v for k, v in status.items() if k != "conditions"}
        kubectl("patch", "nodetopology", name, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"admitted": []}}))
        proc = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT)
        again = wait(nt, 60, "the restarted agent's status")["status"]
        assert {k: v for k, v in again.items() if k != "conditions"} == before

        # explain: the kubelet's decision for a, and the engine's on the same state
        out = subprocess.run([sys.executable, "-m", "numalign.cli", "explain", "a", "-n",
                              namespace, "--kubeconfig", str(kubeconfig), "-o", "json"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        ex = json.loads(out.stdout)
        assert ex["kubelet"]["admit"] is True and ex["kubelet"]["agree"] is True, ex["notes"]
        assert ex["allocation"]["containers"]["main"]["cpus"] == [1]
    finally:
        proc.terminate()
        proc.wait(15)
        kubectl("delete", "nodetopology", name, "--ignore-not-found", check=False)
        sys.stderr.write(log.read_text()[-3000:])
