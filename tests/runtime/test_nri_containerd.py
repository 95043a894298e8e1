"""The agent's NRI plugin against a real containerd v2: the container's cpuset is the
plugin's decision, other containers' shared pool is updated, a rejected container never
exists, and the plugin re-registers (and rebuilds its view) when containerd restarts."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest

from agent_helpers import given
from containerd_helpers import Containerd
from cri_helpers import Cri, cgroup_cpuset, parse_list, status_cpus, wait_until
from criapi.runtime_v1 import api_pb2 as cri
from numalign.agent.nri.placer import EnginePlacer, PodView, kernel_memory_nodes
from numalign.agent.nri.plugin import CpuSet, NriPlugin, Placement, Rejected
from numalign.api.allocation import Allocation
from numalign.api.names import ANN_ALLOCATION
from numalign.api.resolved import Resolved
from numalign.topology.machine import machine_from_dict

EXCLUSIVE = "numalign.io/test-exclusive"
REJECT = "numalign.io/test-reject"


def fmt(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


class TestPlacer:
    """Gives the last CPU exclusively to containers annotated EXCLUSIVE; every other
    container gets the rest (the shared pool); REJECT is refused. Its ledger is rebuilt
    from the runtime's containers at synchronize."""

    __test__ = False

    def __init__(self, cpus: set[int], mems: str) -> None:
        self.cpus, self.mems = cpus, mems
        self.exclusive: dict[str, int] = {}  # container id -> its CPU
        self.shared: set[str] = set()
        self.synced: list[str] = []

    def pool(self) -> set[int]:
        return self.cpus - set(self.exclusive.values())

    def shared_updates(self, skip: str = "") -> dict[str, CpuSet]:
        return {cid: CpuSet(fmt(self.pool()), self.mems) for cid in self.shared if cid != skip}

    def synchronize(self, pods: list[Any], containers: list[Any]) -> Mapping[str, CpuSet]:
        self.exclusive.clear()
        self.shared.clear()
        self.synced = [c.id for c in containers]
        for c in containers:
            if EXCLUSIVE in c.annotations:
                self.exclusive[c.id] = min(parse_list(c.linux.resources.cpu.cpus))
            else:
                self.shared.add(c.id)
        return self.shared_updates()

    def create(self, pod: Any, container: Any) -> Placement:
        if REJECT in container.annotations:
            raise Rejected("TopologyAffinityError: no NUMA node fits")
        if EXCLUSIVE in container.annotations:
            free = sorted(self.pool())
            if len(free) < 2:
                raise Rejected("no exclusive CPU left")
            self.exclusive[container.id] = free[-1]
            return Placement(CpuSet(str(free[-1]), self.mems), self.shared_updates())
        self.shared.add(container.id)
        return Placement(CpuSet(fmt(self.pool()), self.mems))

    def released(self, pod: Any, container: Any | None) -> Mapping[str, CpuSet]:
        gone = {container.id} if container is not None else set()
        if container is None:
            return {}
        self.shared -= gone
        if self.exclusive.pop(container.id, None) is None:
            return {}
        return self.shared_updates()


async def test_plugin_sets_cpusets_and_survives_a_runtime_restart(containerd: Containerd,
                                                                  tmp_path: Path) -> None:
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("an exclusive CPU and a shared pool need 2 CPUs")
    mems = Path("/sys/devices/system/node/online").read_text().strip().split(",")[0]
    mems = mems.split("-")[0]
    placer = TestPlacer(set(cpus), mems)
    plugin = NriPlugin(placer, name="numalign-test", index="10",
                       socket_path=containerd.nri_socket, retry_s=0.2)
    run = asyncio.create_task(plugin.run())
    channel = grpc.aio.insecure_channel(f"unix://{containerd.socket}")
    c = Cri(channel, tmp_path / "logs", containerd.cgroup_parent)
    try:
        await asyncio.wait_for(plugin.synchronized.wait(), 30)
        assert plugin.registrations == 1 and plugin.runtime is not None
        assert plugin.runtime[0] == "containerd"

        pod = await c.sandbox("p1")
        shared = await c.container(pod, "shared")
        pinned = await c.container(pod, "pinned", {EXCLUSIVE: "true"})
        excl = {max(cpus)}
        rest = set(cpus) - excl
        # the workload prints its own Cpus_allowed_list: the plugin's decision
        assert await wait_until(lambda: c.printed_cpus("p1", "pinned"), "pinned's output") == excl
        pinned_pid, shared_pid = await c.pid(pinned), await c.pid(shared)
        assert cgroup_cpuset(pinned_pid) == (excl, parse_list(mems))
        assert status_cpus(pinned_pid) == excl
        # the shared container was created on the whole pool, then updated to exclude it
        assert c.printed_cpus("p1", "shared") == set(cpus)
        assert cgroup_cpuset(shared_pid)[0] == rest
        assert status_cpus(shared_pid) == rest

        # a rejected container is never created
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await c.container(pod, "refused", {REJECT: "true"})
        assert "TopologyAffinityError: no NUMA node fits" in str(refused.value.details())
        listed = await c.rt.ListContainers(cri.ListContainersRequest(), timeout=30)
        assert sorted(x.metadata.name for x in listed.containers) == ["pinned", "shared"]

        # containerd restarted: its containers keep running, the plugin registers again and
        # rebuilds its ledger from the runtime's state (synchronize)
        await asyncio.to_thread(containerd.stop)
        await wait_until(lambda: plugin._client is None, "the plugin to see the runtime gone")
        placer.exclusive.clear()
        await asyncio.to_thread(containerd.start)
        await wait_until(lambda: plugin.registrations == 2, "re-registration")
        await asyncio.wait_for(plugin.synchronized.wait(), 30)
        assert {shared, pinned} <= set(placer.synced)
        assert placer.exclusive == {pinned: max(cpus)}
        later = await c.container(pod, "later")
        assert await wait_until(lambda: c.printed_cpus("p1", "later"), "later's output") == rest
        assert cgroup_cpuset(await c.pid(later))[0] == rest
        assert cgroup_cpuset(pinned_pid)[0] == excl
    finally:
        with contextlib.suppress(Exception):
            await c.remove_all_sandboxes()
        await channel.close()
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run


def _pod(uid: str, cpu: str, name: str) -> dict[str, Any]:
    res = {"requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"cpu": cpu, "memory": "64Mi"}}
    return {"metadata": {"name": name, "namespace": "t", "uid": uid},
            "spec": {"containers": [{"name": "main", "resources": res}]}}


async def test_the_engine_places_containers_under_each_pods_policy(containerd: Containerd,
                                                                   tmp_path: Path) -> None:
    """The local real node's view: this machine's CPUs as NUMA nodes of one CPU each, the
    first reserved. A guaranteed 1-CPU pod under single-numa-node gets an exclusive CPU, a
    best-effort container the rest; a 2-CPU pod under single-numa-node is never created."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("an exclusive CPU and a shared pool need 2 CPUs")
    machine = machine_from_dict({"name": "view", "numaNodes": [
        {"id": i, "cpus": str(c), "memory": "1Gi"} for i, c in enumerate(cpus)]})
    views: dict[str, PodView] = {}

    def record(uid: str, alloc: Allocation) -> None:  # what the agent writes on the pod
        pod = dict(views[uid].pod)
        pod["metadata"] = {**pod["metadata"], "annotations": {
            ANN_ALLOCATION: alloc.to_annotation()}}
        views[uid] = PodView(pod, views[uid].policy)

    def new_agent() -> tuple[EnginePlacer, NriPlugin, asyncio.Task[None]]:
        placer = EnginePlacer(machine, views.get, reserved_cpus=[cpus[0]],
                              memory_nodes=kernel_memory_nodes(), on_admit=record)
        plugin = NriPlugin(placer, socket_path=containerd.nri_socket, retry_s=0.2)
        return placer, plugin, asyncio.create_task(plugin.run())

    placer, plugin, run = new_agent()
    channel = grpc.aio.insecure_channel(f"unix://{containerd.socket}")
    c = Cri(channel, tmp_path / "logs", containerd.cgroup_parent)
    try:
        await asyncio.wait_for(plugin.synchronized.wait(), 30)
        views["u-g"] = PodView(_pod("u-g", "1", "g"), given(Resolved(policy="single-numa-node")))
        views["u-big"] = PodView(_pod("u-big", "2", "big"),
                                 given(Resolved(policy="single-numa-node")))
        be = await c.container(await c.sandbox("be"), "main")
        g = await c.container(await c.sandbox("g", "u-g"), "main")
        (mine,) = placer.allocations["u-g"].containers["main"].cpus
        assert mine != cpus[0]  # never the reserved CPU
        assert await wait_until(lambda: c.printed_cpus("g", "main"), "g's output") == {mine}
        g_cpus, g_mems = cgroup_cpuset(await c.pid(g))
        assert g_cpus == {mine} and g_mems <= kernel_memory_nodes()
        assert cgroup_cpuset(await c.pid(be))[0] == set(cpus) - {mine}

        big = await c.sandbox("big", "u-big")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await c.container(big, "main")
        assert "TopologyAffinityError" in str(refused.value.details())
        listed = await c.rt.ListContainers(cri.ListContainersRequest(
            filter=cri.ContainerFilter(pod_sandbox_id=big[0])), timeout=30)
        assert list(listed.containers) == []

        # the agent restarted: a new plugin and ledger, rebuilt from the runtime's pods and
        # the pods' records; the CPU g holds is not given to another pod
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        placer, plugin, run = new_agent()
        await asyncio.wait_for(plugin.synchronized.wait(), 30)
        assert placer.allocations["u-g"].containers["main"].cpus == [mine]
        views["u-g2"] = PodView(_pod("u-g2", "1", "g2"), given(Resolved(policy="single-numa-node")))
        g2 = await c.sandbox("g2", "u-g2")
        if len(cpus) == 2:  # the only CPU left is reserved: g2 cannot be admitted
            with pytest.raises(grpc.aio.AioRpcError) as taken:
                await c.container(g2, "main")
            assert "TopologyAffinityError" in str(taken.value.details())
        else:
            await c.container(g2, "main")
            (other,) = placer.allocations["u-g2"].containers["main"].cpus
            assert other not in (mine, cpus[0])
        assert cgroup_cpuset(await c.pid(g))[0] == {mine}
    finally:
        with contextlib.suppress(Exception):
            await c.remove_all_sandboxes()
        await channel.close()
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
