"""The real-node agent with ``--nri-socket`` against a real containerd v2 and the real API
server, the test playing the kubelet (CRI calls for pods bound to the node):

- the node labelled ``numalign.io/managed=nri``: the agent registers, a pod gets its
  exclusive CPU (the container's cgroup and its own /proc status say so), recorded in the
  pod's ``numalign.io/allocation`` and NodeTopology ``status.admitted``;
- a pod that cannot be aligned under its policy: no container of it is ever created (the
  runtime shows none), the pod is ``Failed`` / ``TopologyAffinityError`` with the kubelet's
  message, and a Warning event says why;
- the agent dies in the middle of a container's creation, after recording its decision:
  the restarted agent rebuilds its ledger (NRI synchronize + the pods' records), the
  container ends with the recorded CPU, the running pod keeps its own, and no CPU is ever
  given to two exclusive containers;
- the label removed: the plugin disconnects (new containers are the runtime's alone); the
  kubelet's CPU manager static: the agent refuses to place, and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from containerd_helpers import Containerd
from cri_helpers import Cri, cgroup_cpuset, wait_until
from criapi.runtime_v1 import api_pb2 as cri
from numalign.agent.node import NodeAgent
from numalign.agent.nri.managed import ManagedNode
from numalign.api.allocation import parse_allocation
from numalign.api.kube import ApiError, Kube, load_config, pod_path
from numalign.api.names import (
    ANN_ALLOCATION,
    ANN_REJECTION,
    ANN_RESOLVED,
    LABEL_MANAGED,
    MANAGED_NRI,
    REJECT_MESSAGE,
)
from numalign.api.nodetopology import NRI_KUBELET_MANAGERS_ON, NRI_NOT_MANAGED
from numalign.api.resolved import Resolved
from numalign.topology.machine import machine_from_dict
from numalign.topology.quantity import parse_cpulist

pytestmark = pytest.mark.cluster

NONE_CONFIG = """apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cpuManagerPolicy: none
topologyManagerPolicy: none
"""
STRICT = Resolved(policy="single-numa-node", scope="container", source="pod").annotation()


def pod_body(name: str, node: str, cpu: str) -> dict[str, Any]:
    res = {"cpu": cpu, "memory": "64Mi"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {ANN_RESOLVED: STRICT}},
            "spec": {"nodeName": node, "containers": [{
                "name": "main", "image": "numalign.local/workload:dev",
                "resources": {"requests": res, "limits": res}}]}}


class Agent:
    """One run of the real-node agent in this process (a restart: a new one)."""

    def __init__(self, kube: Kube, node: str, machine: Any, sock: Path, config: Path) -> None:
        self.node = NodeAgent(kube, node, machine, kubelet_config=str(config),
                             nri_socket=str(sock), refresh=1.0, debounce=0.05)
        self.task = asyncio.create_task(self.node.run())

    @property
    def managed(self) -> ManagedNode:
        assert self.node.managed is not None
        return self.node.managed

    async def placing(self) -> None:
        await wait_until(lambda: self.managed.status.active or self.task.done(),
                         "the agent to register with the runtime", 60)
        if self.task.done():
            self.task.result()

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def test_the_agent_places_rejects_and_survives_a_restart_mid_creation(
        containerd: Containerd, kubeconfig: Path, namespace: str, tmp_path: Path) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("two exclusive CPUs need 2 CPUs")
    cpus = cpus[:2]
    # this machine's CPUs seen as two NUMA nodes of one CPU each (cpuset.mems: the kernel's)
    machine = machine_from_dict({"name": "view", "numaNodes": [
        {"id": i, "cpus": str(c), "memory": "1Gi"} for i, c in enumerate(cpus)]})
    config = tmp_path / "kubelet-config.yaml"
    config.write_text(NONE_CONFIG)
    node = f"nri-{uuid.uuid4().hex[:6]}"
    kube = Kube(load_config(str(kubeconfig)))
    await kube.open()
    await kube.create("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": node, "labels": {LABEL_MANAGED: MANAGED_NRI}}})
    channel = grpc.aio.insecure_channel(f"unix://{containerd.socket}")
    c = Cri(channel, tmp_path / "logs", containerd.cgroup_parent)
    agent = Agent(kube, node, machine, containerd.nri_socket, config)

    async def make_pod(name: str, cpu: str) -> dict[str, Any]:
        return await kube.create(f"/api/v1/namespaces/{namespace}/pods",
                                 pod_body(name, node, cpu))

    async def get_pod(name: str) -> dict[str, Any]:
        return await kube.get(pod_path(namespace, name))

    async def sandbox(pod: dict[str, Any]) -> tuple[str, Any]:
        meta = pod["metadata"]
        return await c.sandbox(meta["name"], meta["uid"], namespace)

    async def recorded(name: str) -> set[int] | None:
        ann = ((await get_pod(name))["metadata"].get("annotations") or {}).get(ANN_ALLOCATION)
        return set(parse_allocation(ann).containers["main"].cpus) if ann else None

    async def eventually(cond: Callable[[], Awaitable[Any]], what: str,
                         timeout: float = 30) -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            value = await cond()
            if value:
                return value
            await asyncio.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")

    try:
        await agent.placing()

        # -- a pod that cannot be aligned: 2 CPUs on one NUMA node of 1 CPU --------------
        big = await make_pod("big", "2")
        big_sb = await sandbox(big)
        for _ in range(2):  # every container of it, every time the kubelet retries
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await c.container(big_sb, "main")
            assert "TopologyAffinityError" in str(refused.value.details())
        listed = await c.rt.ListContainers(cri.ListContainersRequest(
            filter=cri.ContainerFilter(pod_sandbox_id=big_sb[0])), timeout=30)
        assert list(listed.containers) == []
        big_pod = await get_pod("big")
        status = big_pod["status"]
        # also on the metadata: that change is what makes a real kubelet sync the pod while
        # the API shows the terminal phase (its status manager would write Pending back)
        assert big_pod["metadata"]["annotations"][ANN_REJECTION] == "TopologyAffinityError"
        assert status["phase"] == "Failed"
        assert status["reason"] == "TopologyAffinityError"
        assert status["message"] == REJECT_MESSAGE
        events = await eventually(lambda: _events(kube, namespace, "big"), "the Warning event")
        assert {(e["type"], e["reason"]) for e in events} == {("Warning",
                                                                 "TopologyAffinityError")}
        assert all(e["source"]["host"] == node for e in events)

        # -- an admitted pod: its CPU, recorded on the pod and in NodeTopology ------------
        a = await make_pod("a", "1")
        a_ctr = await c.container(await sandbox(a), "main")
        a_cpus = await recorded("a")
        assert a_cpus is not None and len(a_cpus) == 1
        assert await wait_until(lambda: c.printed_cpus("a", "main"), "a's output") == a_cpus
        a_pid = await c.pid(a_ctr)
        assert cgroup_cpuset(a_pid)[0] == a_cpus
        nt = await eventually(lambda: _admitted(kube, node, "a"), "a in NodeTopology status")
        # per-pod truth: what the cgroup has, the pod's policy (not the kubelet's)
        assert set(parse_cpulist(nt["cpus"])) == a_cpus
        assert (nt["policy"], nt["source"]) == ("single-numa-node", "pod")
        conds = {x["type"]: x for x in (await kube.get(
            f"/apis/numalign.io/v1alpha1/nodetopologies/{node}"))["status"]["conditions"]}
        assert conds["NRIPlacement"]["status"] == "True"

        # -- the agent dies in the middle of b's creation, after recording b's CPU ---------
        b = await make_pod("b", "1")
        b_sb = await sandbox(b)
        hang = asyncio.Event()
        inner = agent.managed.prepare

        async def record_then_die(nri_pod: Any) -> None:
            await inner(nri_pod)
            if nri_pod.name == "b":
                hang.set()
                await asyncio.Event().wait()  # never answers: the agent is killed here

        agent.managed.prepare = record_then_die  # type: ignore[method-assign]
        creating = asyncio.create_task(c.container(b_sb, "main"))
        await asyncio.wait_for(hang.wait(), 30)
        b_cpus = await recorded("b")
        assert b_cpus is not None and not b_cpus & a_cpus
        await agent.stop()
        # the runtime lost its plugin mid-request: it creates the container unplaced (NRI
        # closes a plugin that fails so) or fails the creation; the kubelet retries that
        try:
            b_ctr: str | None = await asyncio.wait_for(creating, 60)
        except grpc.aio.AioRpcError:
            b_ctr = None

        agent = Agent(kube, node, machine, containerd.nri_socket, config)
        await agent.placing()
        if b_ctr is None:
            b_ctr = await c.container(b_sb, "main")
        # decided once: b has the CPU recorded before the agent died, a keeps its own
        assert await recorded("b") == b_cpus
        b_pid = await c.pid(b_ctr)
        await wait_until(lambda: cgroup_cpuset(b_pid)[0] == b_cpus, "b's recorded cpuset")
        assert cgroup_cpuset(a_pid)[0] == a_cpus
        assert agent.managed.placer.allocations[b["metadata"]["uid"]].cpus == sorted(b_cpus)
        # no CPU is left: a third pod is rejected, not given a or b's CPU
        third = await make_pod("c", "1")
        with pytest.raises(grpc.aio.AioRpcError) as full:
            await c.container(await sandbox(third), "main")
        assert "TopologyAffinityError" in str(full.value.details())

        # -- the label removed: the plugin disconnects; new containers are the runtime's --
        await kube.patch(f"/api/v1/nodes/{node}",
                         {"metadata": {"labels": {LABEL_MANAGED: None}}})
        await wait_until(lambda: agent.managed.status.reason == NRI_NOT_MANAGED,
                         "the agent to stop placing")
        assert agent.managed.plugin._client is None
        free = await c.sandbox("free", str(uuid.uuid4()), namespace)
        free_ctr = await c.container(free, "main")
        assert cgroup_cpuset(await c.pid(free_ctr))[0] >= set(cpus)  # not placed

        # -- the kubelet's CPU manager static: refused, even with the label back ----------
        await kube.patch(f"/api/v1/nodes/{node}",
                         {"metadata": {"labels": {LABEL_MANAGED: MANAGED_NRI}}})
        config.write_text(NONE_CONFIG.replace("cpuManagerPolicy: none",
                                              "cpuManagerPolicy: static"))
        os.utime(config, (1, 1))  # another mtime: the agent reads it again
        agent.node.wake()
        await wait_until(lambda: agent.managed.status.reason == NRI_KUBELET_MANAGERS_ON,
                         "the agent to refuse")
        assert agent.managed.plugin._client is None
        conds = await eventually(lambda: _condition(kube, node, NRI_KUBELET_MANAGERS_ON),
                                 "the refusal in NodeTopology status")
        assert "cpuManagerPolicy static" in conds["message"]
    finally:
        await agent.stop()
        with contextlib.suppress(Exception):
            await c.remove_all_sandboxes()
        await channel.close()
        with contextlib.suppress(ApiError):
            await kube.delete(f"/api/v1/nodes/{node}")
        with contextlib.suppress(ApiError):
            await kube.delete(f"/apis/numalign.io/v1alpha1/nodetopologies/{node}")
        await kube.close()


async def _events(kube: Kube, namespace: str, pod: str) -> list[dict[str, Any]]:
    doc = await kube.get(f"/api/v1/namespaces/{namespace}/events",
                         {"fieldSelector": f"involvedObject.name={pod}"})
    return list(doc.get("items") or [])


async def _admitted(kube: Kube, node: str, pod: str) -> dict[str, Any] | None:
    try:
        doc = await kube.get(f"/apis/numalign.io/v1alpha1/nodetopologies/{node}")
    except ApiError:
        return None
    for entry in (doc.get("status") or {}).get("admitted") or []:
        if entry.get("pod") == pod:
            return dict(entry)
    return None


async def _condition(kube: Kube, node: str, reason: str) -> dict[str, Any] | None:
    doc = await kube.get(f"/apis/numalign.io/v1alpha1/nodetopologies/{node}")
    for cond in (doc.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "NRIPlacement" and cond.get("reason") == reason:
            return dict(cond)
    return None

