"""A kubelet-managed real node's DRA devices: the kubelet's Topology Manager never sees
them, so numalign reads what it prepared for each container (PodResources
``dynamic_resources``), lists it per claim in the pod's allocation and, per pod in
NodeTopology ``status.admitted``, the devices that sit on none of the NUMA nodes of their
container's exclusive CPUs (``draUnaligned``)."""

from __future__ import annotations

from numalign.agent.kubelet_view import apply_snapshot, unaligned_dra
from numalign.agent.podresources import (
    ClaimDevice,
    KubeletContainer,
    KubeletPod,
    Snapshot,
    pods_from_response,
)
from numalign.agent.publish import admitted_entries
from numalign.agent.state import NodeState
from numalign.api.dra import DraDevice, NodeDraDevices
from numalign.kubeletapi.podresources_v1 import api_pb2 as pr
from numalign.topology.machine import machine_from_dict

DRIVER = "dra.numalign.io"
MACHINE = machine_from_dict({
    "name": "2x2",
    "numaNodes": [{"id": 0, "cpus": "0-1", "memory": "4Gi"},
                  {"id": 1, "cpus": "2-3", "memory": "4Gi"}]})
SLICES = NodeDraDevices((
    DraDevice("s", DRIVER, "n", "dev0", (0,), "numaNode"),
    DraDevice("s", DRIVER, "n", "dev1", (1,), "numaNode"),
    DraDevice("s", DRIVER, "n", "nowhere", None, "unknown")), 3)


def dev(name: str, claim: str = "c") -> ClaimDevice:
    return ClaimDevice(claim, DRIVER, "n", name)


def test_the_kubelets_dra_devices_are_read_per_container() -> None:
    resp = pr.ListPodResourcesResponse(pod_resources=[pr.PodResources(
        name="p", namespace="ns", containers=[pr.ContainerResources(
            name="main", cpu_ids=[3, 2], dynamic_resources=[pr.DynamicResource(
                claim_name="p-dev", claim_namespace="ns", claim_resources=[
                    pr.ClaimResource(driver_name=DRIVER, pool_name="n", device_name="dev1",
                                     cdi_devices=[pr.CDIDevice(name="x")])])])])])
    (pod,) = pods_from_response(resp)
    (c,) = pod.containers
    assert c.cpus == (2, 3)
    assert c.dra == (ClaimDevice("p-dev", DRIVER, "n", "dev1"),)
    assert c.dra[0].id == f"{DRIVER}/n/dev1"


def test_devices_off_their_containers_cpus_numa_nodes_are_reported() -> None:
    pod = KubeletPod("ns", "p", (
        KubeletContainer("far", cpus=(2,), dra=(dev("dev0"), dev("dev1"), dev("nowhere"))),
        KubeletContainer("shared", dra=(dev("dev0"),)),  # no exclusive CPUs: none
        KubeletContainer("near", cpus=(0, 1), dra=(dev("dev0"),))))
    (far,) = unaligned_dra(MACHINE, pod, SLICES)
    assert (far.container, far.device, far.numa_nodes, far.cpu_numa_nodes) == (
        "far", f"{DRIVER}/n/dev0", [0], [1])
    assert unaligned_dra(MACHINE, pod, None) == ()  # the slices not read yet: nothing said


def test_the_admitted_entry_lists_the_unaligned_devices() -> None:
    st = NodeState("n", MACHINE, admits=False)
    st.dra = SLICES
    pods = [KubeletPod("ns", "bad", (KubeletContainer("main", cpus=(3,),
                                                       dra=(dev("dev0", "bad-dev"),)),)),
            KubeletPod("ns", "good", (KubeletContainer("main", cpus=(2,),
                                                        dra=(dev("dev1", "good-dev"),)),))]
    assert apply_snapshot(st, MACHINE, Snapshot(pods=pods), None,
                          {("ns", "bad"): "u-bad", ("ns", "good"): "u-good"})
    entries = {e["pod"]: e for e in admitted_entries(st)}
    assert entries["bad"]["draUnaligned"] == [{
        "container": "main", "device": f"{DRIVER}/n/dev0", "numaNodes": [0],
        "cpuNumaNodes": [1]}]
    assert "draUnaligned" not in entries["good"]
    assert st.admitted["u-good"].allocation.containers["main"].dra_devices == {
        "dra:good-dev": [f"{DRIVER}/n/dev1"]}
    # the slices change (read later, a device moved): the report follows at the next reading
    st.dra = NodeDraDevices((DraDevice("s", DRIVER, "n", "dev0", (1,), "numaNode"),), 1)
    assert apply_snapshot(st, MACHINE, Snapshot(pods=pods), None,
                          {("ns", "bad"): "u-bad", ("ns", "good"): "u-good"})
    assert "draUnaligned" not in {e["pod"]: e for e in admitted_entries(st)}["bad"]
