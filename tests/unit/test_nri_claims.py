"""A numalign-managed (NRI) node places a pod with ResourceClaims next to its DRA devices:
the agent reads the pod's claims by name when it decides the pod (the kubelet prepared
them before the sandbox), maps their allocated devices to NUMA nodes through the node's
ResourceSlices and admits the pod with them as fixed hints under its own policy; a pod
whose claims cannot be read as allocated is refused, naming the claim."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_helpers import given
from numalign.agent.claimadmit import UNREADY_REASON
from numalign.agent.nri.managed import ManagedNode
from numalign.agent.nri.placer import EnginePlacer, PodView
from numalign.agent.nri.plugin import Rejected
from numalign.api.dra import DraDevice, NodeDraDevices
from numalign.api.names import REJECT_REASON
from numalign.api.resolved import Resolved
from numalign.nriapi.v1alpha1 import api_pb2
from numalign.topology.machine import machine_from_dict

DRIVER = "dra.numalign.io"
# 2 NUMA nodes of 2 CPUs; its devices come through DRA (none in the machine file)
MACHINE = machine_from_dict({
    "name": "2x2",
    "numaNodes": [{"id": 0, "cpus": "0-1", "memory": "4Gi"},
                  {"id": 1, "cpus": "2-3", "memory": "4Gi"}]})
SLICES = NodeDraDevices(tuple(
    DraDevice("n-dra.numalign.io-0", DRIVER, "n", f"dev{i}", (i,), "numaNode")
    for i in (0, 1)), 2)


class ClaimsKube:
    """The API server's ResourceClaims, read by path."""

    def __init__(self) -> None:
        self.claims: dict[str, dict[str, Any]] = {}
        self.reads: list[str] = []

    def allocate(self, name: str, device: str | None) -> None:
        status = {} if device is None else {"allocation": {"devices": {"results": [
            {"request": "dev", "driver": DRIVER, "pool": "n", "device": device}]}}}
        self.claims[f"/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/{name}"] = {
            "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}"},
            "status": status}

    async def get_or_none(self, path: str, *_a: Any, **_k: Any) -> dict[str, Any] | None:
        self.reads.append(path)
        return self.claims.get(path)


def claim_pod(uid: str, cpu: str) -> dict[str, Any]:
    """A guaranteed pod whose container uses claim ``dev`` (from a template; the claim
    generated for it is ``<uid>-dev``)."""
    res = {"cpu": cpu, "memory": "256Mi"}
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"nodeName": "n",
                     "resourceClaims": [{"name": "dev", "resourceClaimTemplateName": "t"}],
                     "containers": [{"name": "main", "resources": {
                         "requests": res, "limits": res, "claims": [{"name": "dev"}]}}]},
            "status": {"resourceClaimStatuses": [{"name": "dev",
                                                  "resourceClaimName": f"{uid}-dev"}]}}


class Views(dict[str, PodView]):
    def __call__(self, uid: str) -> PodView | None:
        return self.get(uid)


def managed(kube: ClaimsKube) -> ManagedNode:
    """The NRI side of node ``n``'s agent, CPU 0 reserved, its ResourceSlices read."""
    node = ManagedNode(kube, "n", MACHINE, Path("nri.sock"), memory_nodes={0})  # type: ignore[arg-type]
    node.placer = EnginePlacer(MACHINE, Views(), reserved_cpus=[0], memory_nodes=[0],
                               wait_s=0.05)
    node.placer.state.dra = SLICES
    return node


async def decide(node: ManagedNode, pod: dict[str, Any], policy: str) -> bool | None:
    uid = str(pod["metadata"]["uid"])
    node.placer.lookup[uid] = PodView(pod, given(Resolved(policy=policy, scope="container")))  # type: ignore[index]
    return node.placer.decide(uid, None, await node._claims(pod))


@pytest.mark.parametrize(("device", "numa_cpus"), [("dev0", {1}), ("dev1", {2, 3})])
async def test_the_claimed_device_decides_the_numa_node_of_the_cpus(
        device: str, numa_cpus: set[int]) -> None:
    kube = ClaimsKube()
    node = managed(kube)
    kube.allocate("p-dev", device)
    assert await decide(node, claim_pod("p", "1"), "single-numa-node") is True
    assert kube.reads == ["/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/p-dev"]
    alloc = node.placer.allocations["p"]
    assert set(alloc.containers["main"].cpus) <= numa_cpus
    assert list(alloc.containers["main"].dra_devices.values()) == [[f"{DRIVER}/n/{device}"]]
    placement = node.placer.create(
        api_pb2.PodSandbox(id="sb-p", uid="p", name="p", namespace="ns"),
        api_pb2.Container(id="c-p", pod_sandbox_id="sb-p", name="main"))
    assert placement.cpuset is not None


async def test_cpus_that_cannot_be_aligned_with_the_claimed_device_reject() -> None:
    kube = ClaimsKube()
    node = managed(kube)
    # NUMA node 0 has one CPU left (0 is reserved): 2 CPUs next to dev0 cannot be had
    kube.allocate("strict-dev", "dev0")
    assert await decide(node, claim_pod("strict", "2"), "single-numa-node") is False
    assert node.placer.rejected["strict"][0] == REJECT_REASON
    # the same pod with its device on NUMA node 1 fits there
    kube.allocate("fits-dev", "dev1")
    assert await decide(node, claim_pod("fits", "2"), "single-numa-node") is True
    assert node.placer.allocations["fits"].cpus == [2, 3]


async def test_a_claim_not_allocated_refuses_the_pod_naming_it() -> None:
    kube = ClaimsKube()
    node = managed(kube)
    kube.allocate("late-dev", None)
    assert await decide(node, claim_pod("late", "1"), "single-numa-node") is False
    reason, message = node.placer.rejected["late"]
    assert reason == UNREADY_REASON and "claim dev" in message, message
    with pytest.raises(Rejected, match=UNREADY_REASON):
        node.placer.create(
            api_pb2.PodSandbox(id="sb-late", uid="late", name="late", namespace="ns"),
            api_pb2.Container(id="c-late", pod_sandbox_id="sb-late", name="main"))
