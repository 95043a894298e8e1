"""The agent on a real node: the kubelet's allocations (PodResources API, served here by an
in-process gRPC server on a unix socket) and configuration, published in NodeTopology status
container by container; a missing socket or a bad answer is reported, never fatal."""

from __future__ import annotations

import asyncio
import copy
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import pytest_asyncio

import testdata
from numalign.agent.kubelet_config import load_kubelet_config, parse_kubelet_config
from numalign.agent.node import NodeAgent
from numalign.api.kube import JSON_PATCH
from numalign.api.nodetopology import NodeTopologyStatus
from numalign.kubeletapi.podresources_v1 import api_pb2 as pr
from numalign.kubeletapi.podresources_v1 import api_pb2_grpc as pr_grpc
from numalign.topology.errors import TopologyError
from numalign.topology.machine import load_machine
from numalign.topology.quantity import parse_cpulist

MACHINE = load_machine(testdata.MACHINES / "seed-figure1.yaml")  # CPUs 0-3 on 0, 4-7 on 1
SAMPLE = "numalign.io/sample-device"
CONFIG = """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cpuManagerPolicy: static
reservedSystemCPUs: "0"
topologyManagerPolicy: single-numa-node
topologyManagerScope: pod
topologyManagerPolicyOptions:
  prefer-closest-numa-nodes: "true"
"""


def topo(*nodes: int) -> Any:
    return pr.TopologyInfo(nodes=[pr.NUMANode(ID=n) for n in nodes])


def devices(resource: str, ids: list[str], *nodes: int) -> Any:
    return pr.ContainerDevices(resource_name=resource, device_ids=ids, topology=topo(*nodes))


class Kubelet(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """What the kubelet answers (replaceable between calls); ``fail`` makes List fail."""

    def __init__(self) -> None:
        self.pods: list[Any] = []
        self.allocatable = pr.AllocatableResourcesResponse(
            cpu_ids=[7, 1, 2, 3, 4, 5, 6],
            devices=[devices(SAMPLE, ["dev-0"], 0), devices(SAMPLE, ["dev-1"], 1)])
        self.fail: grpc.StatusCode | None = None
        self.calls = 0

    async def List(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if self.fail is not None:
            await context.abort(self.fail, "kubelet says no")
        return pr.ListPodResourcesResponse(pod_resources=self.pods)

    async def GetAllocatableResources(self, request: Any, context: Any) -> Any:
        return self.allocatable


class FakeKube:
    """Keeps the NodeTopology status the agent writes (whole or merge-patched)."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {}
        self.rv = 1

    async def get(self, path: str) -> Any:
        return {"metadata": {"resourceVersion": str(self.rv)}, "status": copy.deepcopy(self.status)}

    async def patch(self, path: str, body: Any, kind: str = "", *, decode: bool = True) -> Any:
        if kind == JSON_PATCH:
            self.status = copy.deepcopy(body[0]["value"])
        else:
            want = (body.get("metadata") or {}).get("resourceVersion")
            assert want in (None, str(self.rv)), "a write against a stale resourceVersion"
            self.status = merge(self.status, copy.deepcopy(body["status"]))
        self.rv += 1
        return {"metadata": {"resourceVersion": str(self.rv)}}

    async def create(self, path: str, body: Any) -> Any:
        return body


def merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


async def start_server(kubelet: Kubelet, sock: Path) -> grpc.aio.Server:
    server = grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{sock}")
    await server.start()
    return server


@pytest_asyncio.fixture(loop_scope="function")  # the loop the test runs in
async def kubelet(tmp_path: Path) -> AsyncIterator[tuple[Kubelet, Path]]:
    k = Kubelet()
    sock = tmp_path / "pod-resources" / "kubelet.sock"
    sock.parent.mkdir()
    server = await start_server(k, sock)
    yield k, sock
    await server.stop(None)


def make_node(sock: Path, tmp_path: Path, config: str = CONFIG) -> tuple[NodeAgent, FakeKube]:
    (tmp_path / "kubelet-config.yaml").write_text(config)
    kube = FakeKube()
    node = NodeAgent(kube, "real-1", MACHINE, pod_resources=str(sock),  # type: ignore[arg-type]
                    kubelet_config=str(tmp_path / "kubelet-config.yaml"), debounce=0.01,
                    refresh=30.0)
    return node, kube


async def publish(node: NodeAgent, kube: FakeKube) -> dict[str, Any]:
    node.publisher.mark(node.state.name)
    await node.publisher.flush()
    NodeTopologyStatus.model_validate(kube.status)  # what the CRD schema accepts
    return kube.status


def two_pods() -> list[Any]:
    return [
        pr.PodResources(namespace="ns", name="a", containers=[
            pr.ContainerResources(name="main", cpu_ids=[5, 4],
                                  devices=[devices(SAMPLE, ["dev-1"], 1)]),
            pr.ContainerResources(name="sidecar")]),
        pr.PodResources(namespace="ns", name="b", containers=[
            pr.ContainerResources(name="main", cpu_ids=[1],
                                  devices=[devices(SAMPLE, ["dev-0"], 0)],
                                  memory=[pr.ContainerMemory(memory_type="memory",
                                                             size=1 << 30, topology=topo(0))])]),
    ]


async def test_status_shows_what_podresources_says(kubelet: tuple[Kubelet, Path],
                                                   tmp_path: Path) -> None:
    k, sock = kubelet
    k.pods = two_pods()
    node, kube = make_node(sock, tmp_path)
    node.on_pod("ADDED", {"metadata": {"namespace": "ns", "name": "a", "uid": "uid-a"}})
    assert await node.refresh()
    status = await publish(node, kube)

    # container by container, as the kubelet reports it
    listed = {(p.namespace, p.name): p for p in k.pods}
    assert {(e["namespace"], e["pod"]) for e in status["admitted"]} == set(listed)
    for entry in status["admitted"]:
        pod = listed[(entry["namespace"], entry["pod"])]
        assert [c["name"] for c in entry["containers"]] == [c.name for c in pod.containers]
        for shown, ctr in zip(entry["containers"], pod.containers, strict=True):
            assert parse_cpulist(shown.get("cpus", "")) == sorted(ctr.cpu_ids)
            want_devices: dict[str, list[str]] = {}
            for d in ctr.devices:
                want_devices.setdefault(d.resource_name, []).extend(d.device_ids)
            assert shown.get("devices", {}) == want_devices
        assert entry["policy"] == "single-numa-node" and entry["scope"] == "pod"
        assert entry["source"] == "kubelet"
        assert entry["options"] == {"preferClosestNumaNodes": True}

    a = next(e for e in status["admitted"] if e["pod"] == "a")
    b = next(e for e in status["admitted"] if e["pod"] == "b")
    assert a["uid"] == "uid-a" and b["uid"] == ""  # b is not known to the API server (yet)
    # affinity from the CPUs' and devices' NUMA nodes; nothing exclusive: no affinity
    assert a["numaNodes"] == [1] and a["containers"][0]["numaNodes"] == [1]
    assert "numaNodes" not in a["containers"][1]
    assert b["numaNodes"] == [0] and b["containers"][0]["memory"] == {"0": 1 << 30}

    zones = {z["id"]: z for z in status["zones"]}
    # the kubelet's allocatable CPUs (CPU 0 reserved), less those it gave away
    assert zones[0]["allocatable"]["cpu"] == 3 and zones[0]["available"]["cpu"] == 2
    assert zones[1]["allocatable"]["cpu"] == 4 and zones[1]["available"]["cpu"] == 2
    assert zones[0]["capacity"]["cpu"] == 4
    assert zones[0]["available"][SAMPLE] == 0 and zones[1]["available"][SAMPLE] == 0
    assert {(d["resource"], d["id"], d.get("numaNode")) for d in status["devices"]
            if d["resource"] == SAMPLE} == {(SAMPLE, "dev-0", 0), (SAMPLE, "dev-1", 1)}
    assert status["summary"]["cpus"] == "4/7" and status["summary"]["pods"] == 2
    assert status["kubelet"] == {
        "topologyManagerPolicy": "single-numa-node", "topologyManagerScope": "pod",
        "topologyManagerPolicyOptions": {"prefer-closest-numa-nodes": "true"},
        "cpuManagerPolicy": "static", "memoryManagerPolicy": "None",
        "reservedSystemCPUs": "0"}
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True"
    applied = next(c for c in status["conditions"] if c["type"] == "PolicyApplied")
    assert applied["message"] == ("the kubelet's Topology Manager policy single-numa-node, "
                                  "scope pod (the kubelet admits this node's pods)")

    # a pod gone from the kubelet is gone from the status
    k.pods = k.pods[:1]
    assert await node.refresh()
    status = await publish(node, kube)
    assert [e["pod"] for e in status["admitted"]] == ["a"]
    assert {z["id"]: z["available"]["cpu"] for z in status["zones"]} == {0: 3, 1: 2}


async def test_missing_socket_is_reported_then_recovers(tmp_path: Path) -> None:
    sock = tmp_path / "pod-resources" / "kubelet.sock"
    sock.parent.mkdir()
    node, kube = make_node(sock, tmp_path)
    assert not await node.refresh()
    status = await publish(node, kube)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and str(sock) in ready["message"]
    assert "no pod-resources socket" in status["kubelet"]["podResources"]
    assert status["admitted"] == []

    k = Kubelet()
    k.pods = two_pods()
    server = await start_server(k, sock)
    try:
        assert await node.refresh()
        status = await publish(node, kube)
    finally:
        await server.stop(None)
    assert "podResources" not in status["kubelet"]
    assert sorted(e["pod"] for e in status["admitted"]) == ["a", "b"]
    # the kubelet goes away: the last known allocations stay, marked not ready
    assert not await node.refresh()
    status = await publish(node, kube)
    assert sorted(e["pod"] for e in status["admitted"]) == ["a", "b"]
    assert next(c for c in status["conditions"] if c["type"] == "Ready")["status"] == "False"


async def test_error_answer_is_reported_not_fatal(kubelet: tuple[Kubelet, Path],
                                                 tmp_path: Path) -> None:
    k, sock = kubelet
    k.fail = grpc.StatusCode.UNAVAILABLE
    node, kube = make_node(sock, tmp_path)
    assert not await node.refresh()
    status = await publish(node, kube)
    assert "UNAVAILABLE: kubelet says no" in status["kubelet"]["podResources"]
    k.fail = None
    k.pods = two_pods()
    assert await node.refresh()
    assert len((await publish(node, kube))["admitted"]) == 2


async def test_pod_event_triggers_a_reading(kubelet: tuple[Kubelet, Path],
                                            tmp_path: Path) -> None:
    k, sock = kubelet
    node, kube = make_node(sock, tmp_path)
    loop = asyncio.create_task(node._refresh_loop())
    try:
        await asyncio.sleep(0.1)
        assert k.calls == 0  # the periodic reading is 30 s away
        k.pods = two_pods()[1:]
        node.on_pod("ADDED", {"metadata": {"namespace": "ns", "name": "b", "uid": "uid-b"}})
        for _ in range(100):
            if node.state.admitted:
                break
            await asyncio.sleep(0.05)
        (held,) = node.state.admitted.values()
        assert (held.name, held.uid, held.allocation.cpus) == ("b", "uid-b", [1])
        # a pod the kubelet rejected is counted
        node.on_pod("MODIFIED", {"metadata": {"namespace": "ns", "name": "c", "uid": "uid-c"},
                                 "status": {"phase": "Failed",
                                            "reason": "TopologyAffinityError"}})
        for _ in range(100):
            if node.state.rejected_total:
                break
            await asyncio.sleep(0.05)
        assert (await publish(node, kube))["rejected"] == 1
    finally:
        loop.cancel()


async def test_backoff_on_failure_is_bounded(tmp_path: Path) -> None:
    sock = tmp_path / "nothing.sock"
    node, _ = make_node(sock, tmp_path)
    node.max_backoff = 0.2
    loop = asyncio.create_task(node._refresh_loop())
    node.wake()
    try:
        await asyncio.sleep(1.5)
    finally:
        loop.cancel()
    # 1 s, then at most 0.2 s apart: a few readings, not a busy loop
    assert 2 <= node.refreshes <= 6


def test_kubelet_config_defaults_and_fields(tmp_path: Path) -> None:
    c = parse_kubelet_config({"kind": "KubeletConfiguration"})
    assert (c.topology_manager_policy, c.topology_manager_scope, c.cpu_manager_policy,
            c.reserved_system_cpus) == ("none", "container", "none", ())
    (tmp_path / "k.yaml").write_text(CONFIG)
    c = load_kubelet_config(tmp_path / "k.yaml")
    assert (c.topology_manager_policy, c.reserved_system_cpus) == ("single-numa-node", (0,))


@pytest.mark.parametrize(("doc", "field"), [
    ({"topologyManagerPolicy": "strict"}, "topologyManagerPolicy"),
    ({"topologyManagerScope": "node"}, "topologyManagerScope"),
    ({"topologyManagerPolicyOptions": {"prefer-closest-numa-nodes": "maybe"}},
     "topologyManagerPolicyOptions"),
    ({"cpuManagerPolicy": "dynamic"}, "cpuManagerPolicy"),
    ({"reservedSystemCPUs": "0-x"}, "reservedSystemCPUs"),
    ({"kind": "Pod"}, "kind"),
])
def test_kubelet_config_errors_name_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(TopologyError) as err:
        parse_kubelet_config(doc, "kubelet.yaml")
    assert f"kubelet.yaml: {field}" in str(err.value)


async def test_bad_config_keeps_the_last_and_says_so(kubelet: tuple[Kubelet, Path],
                                                     tmp_path: Path) -> None:
    _, sock = kubelet
    node, kube = make_node(sock, tmp_path)
    assert await node.refresh()
    path = tmp_path / "kubelet-config.yaml"
    path.write_text("topologyManagerPolicy: sometimes\n")
    os.utime(path, (1, 1))  # a new mtime whatever the clock's resolution
    assert await node.refresh()
    status = await publish(node, kube)
    assert status["kubelet"]["topologyManagerPolicy"] == "single-numa-node"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert "topologyManagerPolicy" in ready["message"]
