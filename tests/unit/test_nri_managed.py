"""agent.nri.managed and agent.nri.devices (the pure parts): the devices the kubelet's device
manager assigned are fixed hints for the engine, a pod that cannot be aligned with them is
rejected with the kubelet's status, the agent refuses to place where the kubelet's managers
are on, and the label says whether a node is numalign-managed."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agent_helpers import given
from numalign.agent.kubelet_config import KubeletConfig, parse_kubelet_config
from numalign.agent.nri.devices import AssignedDevices, asks_for_devices, assigned_of
from numalign.agent.nri.managed import (
    ManagedNode,
    is_managed,
    placement_status,
    refusal,
    rejection_patch,
)
from numalign.agent.nri.placer import EnginePlacer, PodView, parse_cpulist
from numalign.agent.nri.plugin import CpuSet, Rejected
from numalign.agent.podresources import DeviceSet, KubeletContainer, KubeletPod
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api.allocation import parse_allocation
from numalign.api.names import (
    ANN_ALLOCATION,
    ANN_REJECTION,
    LABEL_MANAGED,
    MANAGED_NRI,
    REJECT_MESSAGE,
    REJECT_REASON,
    TOPOLOGY_MESSAGE,
)
from numalign.api.nodetopology import (
    NRI_KUBELET_MANAGERS_ON,
    NRI_NOT_MANAGED,
    NRI_REGISTERED,
    NRI_RUNTIME_UNAVAILABLE,
    NRI_STARTING,
)
from numalign.api.resolved import Resolved
from numalign.nriapi.v1alpha1 import api_pb2
from numalign.topology.errors import TopologyError
from numalign.topology.machine import machine_from_dict

DEV = "example.com/nic"
# 2 NUMA nodes of 2 CPUs, one device on each
MACHINE = machine_from_dict({
    "name": "2x2-nics",
    "numaNodes": [{"id": 0, "cpus": "0-1", "memory": "4Gi"},
                  {"id": 1, "cpus": "2-3", "memory": "4Gi"}],
    "devices": [{"resource": DEV, "id": "nic-0", "numaNode": 0},
                {"resource": DEV, "id": "nic-1", "numaNode": 1}],
})


def k8s_pod(uid: str, cpu: str, devices: int = 0,
            containers: tuple[str, ...] = ("main",)) -> dict[str, Any]:
    res: dict[str, str] = {"cpu": cpu, "memory": "256Mi"}
    if devices:
        res[DEV] = str(devices)
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid},
            "spec": {"containers": [{"name": c, "resources": {"requests": res, "limits": res}}
                                    for c in containers]}}


def nri_pod(uid: str) -> Any:
    return api_pb2.PodSandbox(id=f"sb-{uid}", uid=uid, name=uid, namespace="ns")


def nri_ctr(uid: str, name: str) -> Any:
    return api_pb2.Container(id=f"{uid}-{name}", pod_sandbox_id=f"sb-{uid}", name=name)


class Pods:
    def __init__(self) -> None:
        self.views: dict[str, PodView] = {}

    def add(self, pod: dict[str, Any], policy: str) -> str:
        uid = str(pod["metadata"]["uid"])
        self.views[uid] = PodView(pod, given(Resolved(policy=policy, scope="container")))
        return uid

    def __call__(self, uid: str) -> PodView | None:
        return self.views.get(uid)


def placer_with(pods: Pods, reserved: tuple[int, ...] = ()) -> EnginePlacer:
    return EnginePlacer(MACHINE, pods, reserved_cpus=reserved, memory_nodes=[0])


@pytest.mark.parametrize(("nic", "numa_cpus"), [("nic-0", {0, 1}), ("nic-1", {2, 3})])
def test_the_assigned_device_decides_the_numa_node_of_the_cpus(nic: str,
                                                               numa_cpus: set[int]) -> None:
    pods = Pods()
    placer = placer_with(pods)
    uid = pods.add(k8s_pod("p", "1", devices=1), "single-numa-node")
    assert placer.decide(uid, {"main": {DEV: [nic]}}) is True
    alloc = placer.allocations[uid]
    # the device is the kubelet's, not one the engine picked; the CPU is next to it
    assert alloc.containers["main"].devices == {DEV: [nic]}
    assert set(alloc.containers["main"].cpus) <= numa_cpus
    placement = placer.create(nri_pod(uid), nri_ctr(uid, "main"))
    assert placement.cpuset is not None
    assert parse_cpulist(placement.cpuset.cpus) == set(alloc.containers["main"].cpus)
    # decided once: asking again changes nothing
    assert placer.decide(uid, {"main": {DEV: ["nic-0" if nic == "nic-1" else "nic-1"]}}) is None
    assert placer.allocations[uid] is alloc


def test_cpus_that_cannot_be_aligned_with_the_devices_reject_under_single_numa_node() -> None:
    pods = Pods()
    placer = placer_with(pods, reserved=(0,))
    # NUMA node 0 has one CPU left (0 is reserved): 2 CPUs next to nic-0 cannot be had
    strict = pods.add(k8s_pod("strict", "2", devices=1), "single-numa-node")
    assert placer.decide(strict, {"main": {DEV: ["nic-0"]}}) is False
    with pytest.raises(Rejected) as refused:
        placer.create(nri_pod(strict), nri_ctr(strict, "main"))
    assert str(refused.value) == f"{REJECT_REASON}: {REJECT_MESSAGE}"
    assert strict not in placer.allocations
    # without the device's hint the same pod fits NUMA node 1: the hint is what rejected it
    alone = pods.add(k8s_pod("alone", "2"), "single-numa-node")
    assert placer.decide(alone) is True
    assert placer.allocations[alone].cpus == [2, 3]
    # best-effort admits where single-numa-node rejects: the CPUs are wherever they fit
    placer2 = placer_with(pods, reserved=(0,))
    loose = pods.add(k8s_pod("loose", "2", devices=1), "best-effort")
    assert placer2.decide(loose, {"main": {DEV: ["nic-0"]}}) is True
    assert placer2.allocations[loose].containers["main"].devices == {DEV: ["nic-0"]}


def test_each_container_keeps_the_devices_it_was_assigned() -> None:
    pods = Pods()
    placer = placer_with(pods)
    uid = pods.add(k8s_pod("two", "1", devices=1, containers=("a", "b")), "single-numa-node")
    assert placer.decide(uid, {"a": {DEV: ["nic-1"]}, "b": {DEV: ["nic-0"]}}) is True
    alloc = placer.allocations[uid]
    assert alloc.containers["a"].devices == {DEV: ["nic-1"]}
    assert alloc.containers["b"].devices == {DEV: ["nic-0"]}
    assert set(alloc.containers["a"].cpus) <= {2, 3}
    assert set(alloc.containers["b"].cpus) <= {0, 1}


def test_device_hints_are_the_kubelets_for_allocated_devices() -> None:
    from numalign.topology.pod import pod_from_dict

    pod = pod_from_dict(k8s_pod("p", "1", devices=2))
    ov = AssignedDevices(MACHINE, DEV, {"main": {DEV: ["nic-0", "nic-1"]}})
    unit = tuple(pod.containers)

    # two devices on two NUMA nodes: only the mask of both holds them, and it is the
    # narrowest any two devices of the resource fit in: preferred
    hints = ov.hints(unit, 2)
    assert [(h.mask, h.preferred) for h in hints or []] == [(0b11, True)]
    # one of them: each node alone is preferred, both together not
    hints = ov.hints(unit, 1)
    assert [(h.mask, h.preferred) for h in hints or []] == [(0b01, True), (0b10, True),
                                                            (0b11, False)]
    # devices without a NUMA node: no preference
    flat = machine_from_dict({"name": "flat", "numaNodes": [
        {"id": 0, "cpus": "0-1", "memory": "1Gi"}],
        "devices": [{"resource": DEV, "id": "x"}]})
    assert AssignedDevices(flat, DEV, {"main": {DEV: ["x"]}}).hints(unit, 1) is None
    # a device the node does not report is an error naming it
    with pytest.raises(TopologyError, match="nic-9"):
        AssignedDevices(MACHINE, DEV, {"main": {DEV: ["nic-9"]}})


def test_the_kubelets_assignment_and_which_pods_ask_for_devices() -> None:
    kp = KubeletPod("ns", "p", (
        KubeletContainer("a", (1,), (DeviceSet(DEV, ("nic-1",), (1,)),)),
        KubeletContainer("b"),
    ))
    assert assigned_of(kp) == {"a": {DEV: ["nic-1"]}}
    assert asks_for_devices(k8s_pod("p", "1", devices=1))
    assert not asks_for_devices(k8s_pod("p", "1"))
    hp = k8s_pod("p", "1")
    hp["spec"]["containers"][0]["resources"]["limits"]["hugepages-2Mi"] = "2Mi"
    assert not asks_for_devices(hp)


def config(**kw: str) -> KubeletConfig:
    return parse_kubelet_config({"kind": "KubeletConfiguration", **kw})


def test_the_agent_refuses_to_place_where_the_kubelet_places() -> None:
    assert refusal(None) is None
    assert refusal(config()) is None
    assert refusal(config(memoryManagerPolicy="BestEffort")) is None
    static = refusal(config(cpuManagerPolicy="static"))
    assert static is not None and "cpuManagerPolicy static" in static
    topo = refusal(config(topologyManagerPolicy="single-numa-node"))
    assert topo is not None and "topologyManagerPolicy single-numa-node" in topo
    mem = refusal(config(memoryManagerPolicy="Static"))
    assert mem is not None and "memoryManagerPolicy Static" in mem
    both = refusal(config(cpuManagerPolicy="static", topologyManagerPolicy="restricted"))
    assert both is not None and "static" in both and "restricted" in both


def test_the_label_and_the_condition_say_whether_numalign_places() -> None:
    node = {"metadata": {"name": "n", "labels": {LABEL_MANAGED: MANAGED_NRI}}}
    assert is_managed(node)
    assert not is_managed({"metadata": {"name": "n", "labels": {LABEL_MANAGED: "kubelet"}}})
    assert not is_managed({"metadata": {"name": "n"}})
    assert not is_managed(None)
    sock = Path("nri.sock")
    off = placement_status(False, None, True, None, sock)
    assert (off.active, off.reason) == (False, NRI_NOT_MANAGED)
    assert f"{LABEL_MANAGED}={MANAGED_NRI}" in off.message
    refused = placement_status(True, "the kubelet places containers itself", True, None, sock)
    assert (refused.active, refused.reason) == (False, NRI_KUBELET_MANAGERS_ON)
    waiting = placement_status(True, None, False, None, sock)
    assert (waiting.active, waiting.reason) == (False, NRI_RUNTIME_UNAVAILABLE)
    # the kubelet's devices not read yet: the plugin waits (recorded allocations name them)
    early = placement_status(True, None, False, None, sock, devices_known=False)
    assert (early.active, early.reason) == (False, NRI_STARTING) and "PodResources" in early.message
    on = placement_status(True, None, True, ("containerd", "v2.4.2"), sock)
    assert (on.active, on.reason) == (True, NRI_REGISTERED) and "containerd v2.4.2" in on.message

    # NodeTopology status carries it as the condition NRIPlacement
    st = NodeState("n", MACHINE, admits=False)
    st.placement = (off.active, off.reason, off.message)
    conds = {c["type"]: c for c in build_status(st)["conditions"]}
    assert conds["NRIPlacement"]["status"] == "False"
    assert conds["NRIPlacement"]["reason"] == NRI_NOT_MANAGED
    assert "NRIPlacement" not in {c["type"] for c in build_status(
        NodeState("m", MACHINE, admits=False))["conditions"]}


def test_the_rejection_is_written_as_the_kubelet_writes_it() -> None:
    pod = k8s_pod("big", "4")
    pod["spec"]["nodeName"] = "n"
    pod["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    body = rejection_patch(pod, REJECT_REASON, REJECT_MESSAGE)
    # the uid: a precondition, never another pod's status
    assert body["metadata"] == {"uid": "big", "annotations": {ANN_REJECTION: REJECT_REASON}}
    status = body["status"]
    assert status["phase"] == "Failed"
    assert status["reason"] == "TopologyAffinityError"
    assert status["message"] == ("Pod was rejected: Resources cannot be allocated with "
                                 "Topology locality")
    assert status["message"].endswith(TOPOLOGY_MESSAGE)
    assert status["qosClass"] == "Guaranteed"
    assert status["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_the_allocation_record_round_trips() -> None:
    pods = Pods()
    placer = placer_with(pods)
    uid = pods.add(k8s_pod("p", "1", devices=1), "single-numa-node")
    assert placer.decide(uid, {"main": {DEV: ["nic-1"]}})
    body = placer.allocations[uid].pod_patch(uid)
    assert body["metadata"]["uid"] == uid
    back = parse_allocation(body["metadata"]["annotations"][ANN_ALLOCATION])
    assert back.containers["main"].cpus == placer.allocations[uid].containers["main"].cpus
    assert back.containers["main"].devices == {DEV: ["nic-1"]}


def test_a_new_machine_keeps_every_allocation() -> None:
    pods = Pods()
    bare = machine_from_dict({"name": "2x2", "numaNodes": [
        {"id": 0, "cpus": "0-1", "memory": "4Gi"}, {"id": 1, "cpus": "2-3", "memory": "4Gi"}]})
    placer = EnginePlacer(bare, pods, memory_nodes=[0])
    first = pods.add(k8s_pod("first", "2"), "single-numa-node")
    assert placer.decide(first)
    held = set(placer.allocations[first].cpus)
    # the device plugin registered: the kubelet now reports devices; the ledger is rebuilt
    placer.set_machine(MACHINE)
    assert placer.machine is MACHINE
    held_nic, free_nic = ("nic-0", "nic-1") if held == {0, 1} else ("nic-1", "nic-0")
    second = pods.add(k8s_pod("second", "2", devices=1), "single-numa-node")
    assert placer.decide(second, {"main": {DEV: [free_nic]}}) is True
    assert not held & set(placer.allocations[second].cpus)
    # the first pod's CPUs are still held in the rebuilt ledger: none left next to held_nic
    third = pods.add(k8s_pod("third", "1", devices=1), "single-numa-node")
    assert placer.decide(third, {"main": {DEV: [held_nic]}}) is False


class RecordingKube:
    """Records the agent's writes (path, body); answers nothing else."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, dict[str, Any]]] = []

    async def patch(self, path: str, body: dict[str, Any], *_a: Any, **_k: Any) -> None:
        self.writes.append((path, body))

    async def create(self, path: str, body: dict[str, Any], *_a: Any, **_k: Any) -> None:
        self.writes.append((path, body))


async def test_a_rejection_the_kubelet_reverted_is_written_again_a_bounded_number_of_times(
        ) -> None:
    import asyncio

    from numalign.agent.nri import managed

    kube = RecordingKube()
    node = ManagedNode(kube, "n", MACHINE, Path("nri.sock"), memory_nodes={0})  # type: ignore[arg-type]
    pod = k8s_pod("big", "4")
    pod["spec"]["nodeName"] = "n"
    pod["status"] = {"phase": "Pending"}
    node.on_pod("ADDED", pod)
    node.placer.rejected["big"] = (REJECT_REASON, REJECT_MESSAGE)
    await node._report("big")
    paths = [p for p, _ in kube.writes]
    # one status patch that also changes the metadata (what makes the kubelet's pod worker
    # sync while the API shows the terminal phase), then the event
    assert paths == ["/api/v1/namespaces/ns/pods/big/status", "/api/v1/namespaces/ns/events"]
    first = kube.writes[0][1]
    assert first["metadata"] == {"uid": "big", "annotations": {ANN_REJECTION: REJECT_REASON}}
    assert first["status"]["phase"] == "Failed"

    async def settle() -> None:
        for _ in range(20):
            await asyncio.sleep(0)

    failed = dict(pod, status={"phase": "Failed", "reason": REJECT_REASON})
    node.on_pod("MODIFIED", failed)  # it held: nothing more
    await settle()
    assert len(kube.writes) == 2
    for _ in range(managed.MAX_REASSERTS + 2):  # the kubelet wrote Pending back, each time
        node.on_pod("MODIFIED", pod)
        await settle()
    statuses = [b for p, b in kube.writes if p.endswith("/status")]
    assert len(statuses) == 1 + managed.MAX_REASSERTS
    # each one changes the metadata again (else the kubelet would not sync); one event
    notes = [b["metadata"]["annotations"][ANN_REJECTION] for b in statuses]
    assert len(set(notes)) == len(notes)
    assert all(b["status"]["phase"] == "Failed" for b in statuses)
    assert sum(p.endswith("/events") for p, _ in kube.writes) == 1


def test_a_pod_whose_devices_vanish_keeps_its_cpus() -> None:
    """Finding 3: the kubelet restarted and its device plugins have not registered again:
    the node's machine lacks the pod's device for a while, the pod still runs on its CPUs,
    and no other pod gets them."""
    pods = Pods()
    placer = placer_with(pods)
    uid = pods.add(k8s_pod("nic", "2", devices=1), "single-numa-node")
    assert placer.decide(uid, {"main": {DEV: ["nic-1"]}}) is True
    held = set(placer.allocations[uid].cpus)
    assert held == {2, 3}
    bare = machine_from_dict({"name": "2x2-nics", "numaNodes": [
        {"id": 0, "cpus": "0-1", "memory": "4Gi"}, {"id": 1, "cpus": "2-3", "memory": "4Gi"}]})
    placer.set_machine(bare)
    assert placer.pool() == {0, 1}
    other = pods.add(k8s_pod("other", "3"), "none")  # 3 CPUs: only with the nic pod's
    assert placer.decide(other) is False
    assert set(placer.allocations) == {uid}
    # the devices are back: the pod holds its device again, and its CPUs all along
    placer.set_machine(MACHINE)
    assert placer.ledger.free_devices(DEV) == ["nic-0"]
    assert placer.pool() == {0, 1}


async def _settle() -> None:
    import asyncio

    for _ in range(20):
        await asyncio.sleep(0)


@pytest.mark.parametrize("how", ["Succeeded", "Failed", "DELETED"])
async def test_a_finished_pod_frees_its_exclusive_cpus(how: str) -> None:
    """Finding 4: a pod whose containers all exited (its phase Succeeded or Failed), or
    that is deleted, gives its CPUs back at once, as the kubelet's CPU manager does; the
    shared containers get them through UpdateContainers."""
    node = ManagedNode(RecordingKube(), "n", MACHINE, Path("nri.sock"),  # type: ignore[arg-type]
                       memory_nodes={0})
    pushed: list[Mapping[str, CpuSet]] = []

    async def update_quietly(updates: Mapping[str, CpuSet]) -> None:
        pushed.append(updates)

    node.plugin.update_quietly = update_quietly  # type: ignore[method-assign]
    job = k8s_pod("job", "2")
    job["status"] = {"phase": "Running"}
    node.on_pod("ADDED", job)
    node.create(nri_pod("other"), nri_ctr("other", "c"))  # not from Kubernetes: shared
    await node.prepare(nri_pod("job"))
    got = node.create(nri_pod("job"), nri_ctr("job", "main"))
    assert got.cpuset is not None
    held = parse_cpulist(got.cpuset.cpus)
    assert len(held) == 2 and held.isdisjoint(node.placer.pool())
    if how == "DELETED":
        node.on_pod("DELETED", job)
    else:
        node.on_pod("MODIFIED", dict(job, status={"phase": how}))
    await _settle()
    assert "job" not in node.placer.allocations and "job" not in node.admitted()
    assert node.placer.pool() == {0, 1, 2, 3}
    assert pushed == [{"other-c": CpuSet("0-3", "0")}]
    # the next guaranteed pod gets them; the finished pod's sandbox going changes nothing
    nxt = k8s_pod("next", "4")
    node.on_pod("ADDED", nxt)
    await node.prepare(nri_pod("next"))
    assert node.placer.allocations["next"].cpus == [0, 1, 2, 3]
    assert node.released(nri_pod("job"), None) == {}
    assert node.placer.allocations["next"].cpus == [0, 1, 2, 3]


async def test_a_plugin_task_that_ends_is_started_again_with_bounded_backoff() -> None:
    """Finding 5: whatever ends the plugin's task (an error it did not handle, or a plain
    return), the managed node starts it again within seconds, backing off."""
    import asyncio

    from numalign.agent.nri import managed

    node = ManagedNode(RecordingKube(), "n", MACHINE, Path("nri.sock"),  # type: ignore[arg-type]
                       memory_nodes={0}, poll_s=30.0)
    node.on_node({"metadata": {"labels": {LABEL_MANAGED: MANAGED_NRI}}})
    node.pods_synced()
    loop = asyncio.get_running_loop()
    starts: list[float] = []
    third = asyncio.Event()

    async def plugin_run() -> None:
        starts.append(loop.time())
        if len(starts) == 1:
            raise RuntimeError("a frame it could not read")
        if len(starts) == 2:
            return
        third.set()
        await asyncio.Event().wait()

    node.plugin.run = plugin_run  # type: ignore[method-assign]
    node._watch_node = asyncio.Event().wait  # type: ignore[assignment,method-assign]
    run = asyncio.create_task(node.run())
    try:
        await asyncio.wait_for(third.wait(), 5)
        first_gap, second_gap = starts[1] - starts[0], starts[2] - starts[1]
        assert managed.RESTART_MIN_S * 0.9 <= first_gap < 5
        assert first_gap < second_gap <= managed.RESTART_MAX_S + 1
    finally:
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run


def test_the_published_status_stands_until_the_first_synchronize() -> None:
    """Finding 1: a restarted agent publishes what it found (its status.admitted) until
    its plugin has synchronized -- not an empty list that a second restart would then
    find, falling back to the pods' editable records."""
    first = ManagedNode(RecordingKube(), "n", MACHINE, Path("nri.sock"),  # type: ignore[arg-type]
                        memory_nodes={0})
    owner = k8s_pod("owner", "2")
    owner["status"] = {"phase": "Running"}
    first.on_pod("ADDED", owner)
    assert first.placer.decide("owner") is True
    state = NodeState("n", MACHINE)
    state.admitted = first.admitted()
    published = {"status": {"admitted": build_status(state)["admitted"]}}

    again = ManagedNode(RecordingKube(), "n", MACHINE, Path("nri.sock"),  # type: ignore[arg-type]
                        memory_nodes={0})
    again.on_pod("ADDED", owner)
    again.on_published(published)
    before = again.admitted()
    assert set(before) == {"owner"}
    assert before["owner"].allocation.cpus == first.placer.allocations["owner"].cpus
    again.synchronize([nri_pod("owner")], [nri_ctr("owner", "main")])
    assert again.admitted()["owner"].allocation.cpus == before["owner"].allocation.cpus
    again.synchronize([], [])  # the runtime no longer runs it
    assert again.admitted() == {}
