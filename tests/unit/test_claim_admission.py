"""The emulated node's part for a bound pod with ResourceClaims: the claims read by name,
their devices mapped through the node's slices, the pod admitted with them as fixed
hints under its own policy; a claim that never reads as allocated refuses the pod with a
message naming it."""

from __future__ import annotations

import asyncio
from typing import Any

import testdata
from agent_helpers import given
from fake_kube import FakeKube
from numalign.agent.claimadmit import devices_message, verdict
from numalign.agent.state import NodeState
from numalign.api import draemulated as de
from numalign.api.dra import node_devices
from numalign.api.resolved import Resolved
from numalign.topology.machine import load_machine

MACHINE = load_machine(testdata.MACHINES / "group4-gpu.yaml")  # GPUs 0,1 on node 0; 2,3 on 1
NODE = "n0"
NAMES = dict(zip((d.id for d in MACHINE.devices), de.device_names(MACHINE.devices),
                 strict=True))
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims"


def state() -> NodeState:
    st = NodeState(NODE, MACHINE)
    st.dra = node_devices(de.resource_slices(MACHINE, NODE), NODE, None, MACHINE.numa_ids)
    return st


def pod(name: str) -> dict[str, Any]:
    res = {"cpu": "4", "memory": "1Gi"}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {"nodeName": NODE,
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "t"}],
                     "containers": [{"name": "c", "resources": {
                         "requests": res, "limits": res, "claims": [{"name": "gpus"}]}}]},
            "status": {"resourceClaimStatuses": [
                {"name": "gpus", "resourceClaimName": f"{name}-gpus"}]}}


def allocated(name: str, *gpus: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": de.DRIVER, "pool": NODE, "device": NAMES[g]}
        for g in gpus]}}}}


SNN = given(Resolved("single-numa-node", "container", source="pod"))
BEST = given(Resolved("best-effort", "container", source="pod"))


def test_a_pod_is_admitted_with_its_claim_devices_as_fixed_hints() -> None:
    kube, st = FakeKube(), state()
    kube.add(CLAIMS, allocated("p-gpus", "gpu2"))
    v = asyncio.run(verdict(kube, st, pod("p"), wait=0))  # type: ignore[arg-type]
    assert v.refusal is None and v.warning is None
    d = st.decide(pod("p"), SNN, v.kinds)
    assert d.admit and d.allocation is not None
    c = d.allocation.containers["c"]
    assert {MACHINE.cpus[x].numa for x in c.cpus} == {1}
    assert c.dra_devices == {"dra:gpus/gpu": [f"{de.DRIVER}/{NODE}/{NAMES['gpu2']}"]}


def test_devices_on_two_numa_nodes_refused_by_single_numa_node_not_best_effort() -> None:
    kube, st = FakeKube(), state()
    kube.add(CLAIMS, allocated("p-gpus", "gpu0", "gpu3"))
    kube.add(CLAIMS, allocated("q-gpus", "gpu1", "gpu2"))
    v = asyncio.run(verdict(kube, st, pod("p"), wait=0))  # type: ignore[arg-type]
    d = st.decide(pod("p"), SNN, v.kinds)
    assert (d.admit, d.reason) == (False, "TopologyAffinityError")
    assert v.devices is not None
    assert devices_message(v.devices) == (
        f"decided with DRA devices: claim gpus request gpu: {de.DRIVER}/{NODE}/"
        f"{NAMES['gpu0']} on NUMA 0; claim gpus request gpu: {de.DRIVER}/{NODE}/"
        f"{NAMES['gpu3']} on NUMA 1")
    v = asyncio.run(verdict(kube, st, pod("q"), wait=0))  # type: ignore[arg-type]
    assert st.decide(pod("q"), BEST, v.kinds).admit


def test_a_claim_never_allocated_refuses_the_pod_naming_it() -> None:
    kube, st = FakeKube(), state()
    kube.add(CLAIMS, {"metadata": {"name": "p-gpus"}, "status": {}})
    v = asyncio.run(verdict(kube, st, pod("p"), wait=0))  # type: ignore[arg-type]
    assert v.kinds == []
    assert v.refusal == "DRA: claim gpus: ResourceClaim p-gpus is not allocated yet"
    v = asyncio.run(verdict(kube, st, pod("q"), wait=0))  # type: ignore[arg-type]
    assert v.refusal == "DRA: claim gpus: ResourceClaim q-gpus not found"


def test_a_claim_that_cannot_be_read_is_named_with_the_error() -> None:
    from numalign.api.kube import ApiError

    async def forbidden(path: str, params: Any = None) -> dict[str, Any]:
        raise ApiError(403, {"message": "resourceclaims is forbidden"}, "GET", path)

    kube = FakeKube()
    kube.get = forbidden
    v = asyncio.run(verdict(kube, state(), pod("p"), wait=0))  # type: ignore[arg-type]
    assert v.refusal is not None and v.refusal.startswith(
        "DRA: claim gpus: ResourceClaim ns/p-gpus: cannot read it: "), v.refusal
    assert "forbidden" in v.refusal
