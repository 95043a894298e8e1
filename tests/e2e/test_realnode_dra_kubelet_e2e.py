"""The real node's test devices through DRA on a kubelet-managed node (``numalign dev up
--real-node --dra``): the kubelet's static CPU manager and Topology Manager
(single-numa-node) place the containers, but its Topology Manager never sees DRA devices,
so a pod whose claim got the device on NUMA node 0 runs on CPU 1 (NUMA node 1, the one
CPU it can give exclusively). numalign's agent reads what the kubelet prepared
(PodResources) and reports, in the pod's NodeTopology ``status.admitted`` entry, the
device the kubelet left unaligned with the container's CPUs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from e2e_helpers import node_topology, wait_for
from numalign.devcluster.draplugin import DRIVER
from realnode_helpers import (
    DRA_GROUP,
    DRA_VERSION,
    claim_pod,
    claim_template,
    running_real_node,
    wait_running,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def kubelet_dra_node(dev_cluster: Any, tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[Any]:
    logs = tmp_path_factory.mktemp("realnode-dra-kubelet-logs")
    with running_real_node(dev_cluster, logs, "realnode-dra-kubelet", dra=True) as node:
        yield node


def _entry(k8s_client: Any, namespace: str, pod: str) -> dict[str, Any] | None:
    status = (node_topology(k8s_client, "localhost") or {}).get("status") or {}
    for e in status.get("admitted") or []:
        if (e.get("namespace"), e.get("pod")) == (namespace, pod):
            return dict(e)
    return None


def test_the_agent_reports_a_dra_device_the_kubelet_left_unaligned(
        kubelet_dra_node: Any, core: client.CoreV1Api, k8s_client: Any,
        namespace: str) -> None:
    assert kubelet_dra_node.state()["mode"] == "kubelet"
    custom = client.CustomObjectsApi(k8s_client)
    for n in (0, 1):
        custom.create_namespaced_custom_object(DRA_GROUP, DRA_VERSION, namespace,
                                               "resourceclaimtemplates",
                                               claim_template(f"numa{n}", n))
    core.create_namespaced_pod(namespace, claim_pod("off", "numa0"))
    wait_running(core, namespace, "off", timeout=240)  # the kubelet admits it regardless

    def reported() -> dict[str, Any] | None:
        e = _entry(k8s_client, namespace, "off")
        return e if e and e.get("draUnaligned") else None

    entry = wait_for(reported, 120, "off's draUnaligned in NodeTopology localhost")
    assert entry["draUnaligned"] == [{"container": "work",
                                      "device": f"{DRIVER}/localhost/dev0",
                                      "numaNodes": [0], "cpuNumaNodes": [1]}], entry
    (work,) = entry["containers"]
    assert list(work["draDevices"].values()) == [[f"{DRIVER}/localhost/dev0"]], work
    core.delete_namespaced_pod("off", namespace, grace_period_seconds=0)
    wait_for(lambda: _entry(k8s_client, namespace, "off") is None, 120,
             "off gone from NodeTopology localhost")

    # its device on NUMA node 1, with its CPU: listed, nothing unaligned
    core.create_namespaced_pod(namespace, claim_pod("on", "numa1"))
    wait_running(core, namespace, "on", timeout=240)

    def listed() -> dict[str, Any] | None:
        e = _entry(k8s_client, namespace, "on")
        works = (e or {}).get("containers") or []
        return e if works and works[0].get("draDevices") else None

    entry = wait_for(listed, 120, "on's DRA device in NodeTopology localhost")
    assert "draUnaligned" not in entry, entry
    assert list(entry["containers"][0]["draDevices"].values()) == [
        [f"{DRIVER}/localhost/dev1"]]
