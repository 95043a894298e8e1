"""Node, lease, pod status and event objects as the kubelet writes them."""

from __future__ import annotations

import testdata
from numalign.agent.kubelet_status import (
    lease_object,
    machine_resources,
    node_object,
    pod_event,
    qos_class,
    rejected_status,
    running_status,
)
from numalign.api.names import REJECT_REASON, TOPOLOGY_MESSAGE
from numalign.topology.machine import load_machine

MACHINES = testdata.MACHINES


def _pod() -> dict[str, object]:
    res = {"cpu": "2", "memory": "200Mi", "gpu-vendor.com/gpu": "1"}
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {
            "nodeName": "seed-figure1-0",
            "initContainers": [{"name": "setup", "image": "busybox"},
                               {"name": "sidecar", "image": "envoy:v1", "restartPolicy": "Always"}],
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": res, "limits": res}}],
        },
    }


def test_node_capacity_from_machine_file() -> None:
    m = load_machine(MACHINES / "seed-figure1.yaml")
    res = machine_resources(m)
    assert res["cpu"] == "8"
    assert res["memory"] == "64Gi"
    assert res["gpu-vendor.com/gpu"] == "2"
    assert res["nic-vendor.com/nic"] == "2"
    assert res["pods"] == "110"
    node = node_object("seed-figure1-0", m, 0)
    labels = node["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == "seed-figure1-0"
    assert labels["numalign.io/machine"] == "seed-figure1"
    st = node["status"]
    assert st["capacity"] == st["allocatable"] == res
    ready = [c for c in st["conditions"] if c["type"] == "Ready"]
    assert ready[0]["status"] == "True"


def test_hugepages_resources() -> None:
    for f in sorted(MACHINES.glob("*.yaml")):
        m = load_machine(f)
        res = machine_resources(m)
        for size in m.hugepage_sizes:
            assert f"hugepages-{size}" in res


def test_distinct_node_addresses() -> None:
    m = load_machine(MACHINES / "seed-figure1.yaml")
    ips = {node_object(f"n{i}", m, i)["status"]["addresses"][0]["address"] for i in range(600)}
    assert len(ips) == 600


def test_lease() -> None:
    lease = lease_object("n1", "uid-1")
    assert lease["metadata"]["namespace"] == "kube-node-lease"
    assert lease["spec"]["holderIdentity"] == "n1"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == "uid-1"


def test_running_status() -> None:
    st = running_status(_pod(), "172.16.0.1", "10.128.0.2", "2024-01-01T00:00:00Z")
    assert st["phase"] == "Running"
    types = {c["type"]: c for c in st["conditions"]}
    assert set(types) == {"PodScheduled", "Initialized", "ContainersReady", "Ready",
                          "PodReadyToStartContainers"}
    assert all(c["status"] == "True" for c in types.values())
    assert types["PodScheduled"]["lastTransitionTime"] == "2024-01-01T00:00:00Z"
    (main,) = st["containerStatuses"]
    assert main["name"] == "main" and main["ready"] and main["started"]
    assert "running" in main["state"]
    assert main["image"] == "registry.k8s.io/pause:3.10"
    assert main["imageID"].startswith("registry.k8s.io/pause@sha256:")
    assert main["containerID"].startswith("emulated://")
    init = {c["name"]: c for c in st["initContainerStatuses"]}
    assert init["setup"]["state"]["terminated"]["reason"] == "Completed"
    assert init["setup"]["image"] == "docker.io/library/busybox:latest"
    assert "running" in init["sidecar"]["state"]
    assert st["podIP"] == "10.128.0.2" and st["hostIP"] == "172.16.0.1"
    assert st["qosClass"] == "Burstable"  # the init containers have no limits


def test_rejected_status_and_event() -> None:
    st = rejected_status(_pod(), REJECT_REASON, TOPOLOGY_MESSAGE)
    assert st["phase"] == "Failed"
    assert st["reason"] == "TopologyAffinityError"
    assert st["message"] == "Pod was rejected: Resources cannot be allocated with Topology locality"
    ev = pod_event(_pod(), "seed-figure1-0", "Warning", REJECT_REASON, TOPOLOGY_MESSAGE)
    assert ev["type"] == "Warning" and ev["reason"] == REJECT_REASON
    assert ev["involvedObject"]["uid"] == "u1"
    assert ev["source"] == {"component": "kubelet", "host": "seed-figure1-0"}


def test_qos() -> None:
    g = {"cpu": "1", "memory": "1Gi"}
    pod = {"spec": {"containers": [{"name": "a", "resources": {"requests": g, "limits": g}}]}}
    assert qos_class(pod) == "Guaranteed"
    assert qos_class({"spec": {"containers": [{"name": "a"}]}}) == "BestEffort"
