"""An emulated node decides its pods in the order they were bound, as the kubelet admits
them one after another and as the scheduler extender counts them: a pod bound after a
pod whose claims are still being read waits for it, however slow the read (ORDER_WAIT
more at most once a read found them not allocated). Decided first,
the later pod could take the CPUs the earlier one was counted on, next to its device,
and the earlier pod would be refused (the DRA placement bench saw such
TopologyAffinityErrors with the extender)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import testdata
from numalign.agent import claimadmit
from numalign.agent.emulate import Emulator, NodeSpec
from numalign.api import draemulated as de
from numalign.api.dra import node_devices
from numalign.api.names import ANN_RESOLVED
from numalign.api.resolved import Resolved
from numalign.topology.machine import load_machine

MACHINE = load_machine(testdata.MACHINES / "group4-gpu.yaml")  # CPUs 0-15: NUMA 0; GPUs 2,3: 1
NODE = "n0"
NAMES = dict(zip((d.id for d in MACHINE.devices), de.device_names(MACHINE.devices),
                 strict=True))
SNN = Resolved("single-numa-node", "pod", source="pod").annotation()


class Api:
    """The agent's client: the claim's GET waits for ``gate`` (``unallocated``: until
    then it answers at once, the claim not allocated yet); every write succeeds."""

    def __init__(self, unallocated: bool = False) -> None:
        self.gate = asyncio.Event()
        self.unallocated = unallocated

    def lane(self, _n: int) -> Api:
        return self

    async def get_or_none(self, path: str, params: Any = None) -> dict[str, Any] | None:
        if self.unallocated and not self.gate.is_set():
            return {"metadata": {"name": "a-gpus"}, "status": {}}
        await self.gate.wait()
        return {"metadata": {"name": "a-gpus"}, "status": {"allocation": {"devices": {
            "results": [{"request": "gpu", "driver": de.DRIVER, "pool": NODE,
                         "device": NAMES["gpu2"]}]}}}}

    def __getattr__(self, name: str) -> Any:
        async def write(*args: Any, **kwargs: Any) -> dict[str, Any]:
            return {}
        return write


def pod(name: str, cpus: int, claim: bool = False) -> dict[str, Any]:
    res = {"cpu": str(cpus), "memory": "1Gi"}
    c: dict[str, Any] = {"name": "c", "resources": {"requests": res, "limits": res}}
    spec: dict[str, Any] = {"nodeName": NODE, "containers": [c]}
    status: dict[str, Any] = {"phase": "Pending"}
    if claim:
        c["resources"]["claims"] = [{"name": "gpus"}]
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "t"}]
        status["resourceClaimStatuses"] = [{"name": "gpus", "resourceClaimName": f"{name}-gpus"}]
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "annotations": {ANN_RESOLVED: SNN}}, "spec": spec, "status": status}


async def _bound(release_after: float, unallocated: bool = False) -> dict[str, bool]:
    """Z (8 CPUs, NUMA node 0), then A (4 CPUs and a GPU of NUMA node 1; its claim
    read takes ``release_after`` s, or reads as not allocated until then), then B (14
    CPUs: only NUMA node 1 can hold it, and only without A) are bound, in that order;
    what the node decided."""
    api = Api(unallocated)
    em = Emulator(api, [NodeSpec(NODE, MACHINE)])  # type: ignore[arg-type]
    st = em.states[NODE]
    st.dra = node_devices(de.resource_slices(MACHINE, NODE), NODE, None, MACHINE.numa_ids)
    for p in (pod("z", 8), pod("a", 4, claim=True), pod("b", 14)):
        em.on_pod("ADDED", p)
    await asyncio.sleep(release_after)
    api.gate.set()
    for _ in range(200):
        await asyncio.sleep(0.01)
        if {"uid-a", "uid-b"} <= st.decided.keys():
            break
    await asyncio.gather(*em._tasks, return_exceptions=True)
    return dict(st.decided)


def test_a_pod_bound_after_one_reading_its_claims_is_decided_after_it() -> None:
    decided = asyncio.run(_bound(0.2))
    # A is admitted next to its GPU; B, bound after it, finds no NUMA node to hold it
    assert decided == {"uid-z": True, "uid-a": True, "uid-b": False}


def test_a_claim_slow_to_read_keeps_the_bind_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # an API server slow to answer (on a loaded control plane) is no reason to decide B
    # first: A was counted before it, with its GPU
    monkeypatch.setattr(claimadmit, "ORDER_WAIT", 0.05)
    decided = asyncio.run(_bound(0.5))
    assert decided == {"uid-z": True, "uid-a": True, "uid-b": False}


def test_a_claim_read_as_not_allocated_holds_the_other_pods_up_no_longer_than_order_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claimadmit, "ORDER_WAIT", 0.05)
    decided = asyncio.run(_bound(0.3, unallocated=True))  # read again after 0.5 s
    # B went past A 0.05 s after A's claim read as not allocated (and took NUMA node
    # 1's CPUs); A, allocated later, then got none there
    assert decided == {"uid-z": True, "uid-a": False, "uid-b": True}
