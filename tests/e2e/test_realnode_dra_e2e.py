"""The real node's test devices through DRA (``numalign dev up --real-node --nri --dra``):
a kubelet plugin of numalign's (driver ``dra.numalign.io``) publishes ``realnode-2numa``'s
two sample devices as ResourceSlices with their NUMA nodes; kube-scheduler allocates a
pod's claim; the real kubelet has the plugin prepare it and containerd injects it through
CDI (the container's environment names the prepared device); the plugin unprepares it
when the pod goes. numalign's agent, placing containers through NRI, reads the pod's claim
and puts its CPUs and memory on its device's NUMA node under the pod's policy, or rejects
it the kubelet's way when they cannot be aligned.

``realnode-2numa`` is this machine's two CPUs as two NUMA nodes of one CPU each, CPU 0
reserved: CPU 1 (NUMA node 1) is the one CPU a container can hold exclusively."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e_helpers import wait_for
from nri_helpers import allocation, app_containers, exclusive, expected_mems, running
from numalign.api.names import ANN_REJECTION, REJECT_REASON, TOPOLOGY_MESSAGE
from numalign.devcluster.draplugin import DRIVER, SLICE_LABEL, env_var, spec_file
from operator_helpers import delete_policy, operator, policy
from realnode_helpers import (
    DRA_CLASS,
    DRA_GROUP,
    DRA_VERSION,
    claim_pod,
    claim_template,
    events_of,
    running_real_node,
    story,
    wait_running,
)

pytestmark = pytest.mark.cluster

NUMA = "resource.kubernetes.io/numaNode"


@pytest.fixture(scope="module")
def dra_node(dev_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real kubelet and containerd in nri mode with the DRA plugin instead of the sample
    device plugin; removed after this module's tests."""
    logs = tmp_path_factory.mktemp("realnode-dra-logs")
    with running_real_node(dev_cluster, logs, "realnode-dra", mode="nri", dra=True) as node:
        yield node


def _custom(k8s_client: Any) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(k8s_client)


def _slices(k8s_client: Any) -> list[dict[str, Any]]:
    body = _custom(k8s_client).list_cluster_custom_object(
        DRA_GROUP, DRA_VERSION, "resourceslices", field_selector="spec.nodeName=localhost")
    return [s for s in body["items"] if s["spec"]["driver"] == DRIVER]


def test_the_plugin_publishes_the_devices_with_their_numa_nodes(
        dra_node: Any, core: client.CoreV1Api, k8s_client: Any) -> None:
    assert dra_node.state().get("dra") is True
    assert dra_node.process("dra-plugin").is_running()
    assert not dra_node.process("device-plugin").is_running()
    registry = dra_node.kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock"
    assert registry.is_socket()
    slices = _slices(k8s_client)
    devices = {d["name"]: d for s in slices for d in s["spec"]["devices"]}
    assert {n: d["attributes"][NUMA]["int"] for n, d in devices.items()} == {"dev0": 0,
                                                                              "dev1": 1}
    assert all(s["spec"]["pool"]["name"] == "localhost" for s in slices)
    assert all((s["metadata"].get("labels") or {}).get(SLICE_LABEL) == "true" for s in slices)
    node = core.read_node("localhost")
    assert [o["name"] for s in slices for o in s["metadata"]["ownerReferences"]] == \
        ["localhost"] * len(slices)
    # no extended resource: the devices are DRA's alone
    assert "numalign.io/sample-device" not in (node.status.allocatable or {})
    _custom(k8s_client).get_cluster_custom_object(DRA_GROUP, DRA_VERSION, "deviceclasses",
                                                  DRA_CLASS)


def test_a_claimed_device_is_prepared_and_injected_through_cdi(
        dra_node: Any, core: client.CoreV1Api, k8s_client: Any, namespace: str) -> None:
    custom = _custom(k8s_client)
    custom.create_namespaced_custom_object(DRA_GROUP, DRA_VERSION, namespace,
                                           "resourceclaimtemplates", claim_template("numa1", 1))
    core.create_namespaced_pod(namespace, claim_pod("dra-numa1", "numa1"))
    pod = wait_running(core, namespace, "dra-numa1", timeout=240)

    claims = custom.list_namespaced_custom_object(DRA_GROUP, DRA_VERSION, namespace,
                                                  "resourceclaims")["items"]
    assert len(claims) == 1
    claim = claims[0]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert [(r["driver"], r["pool"], r["device"]) for r in results] == \
        [(DRIVER, "localhost", "dev1")]
    uid = claim["metadata"]["uid"]
    spec = spec_file(dra_node.containerd_dir / "cdi", uid)
    assert json.loads(spec.read_text())["devices"][0]["containerEdits"]["env"] == \
        [f"{env_var('dev1')}=dev1"]

    # containerd injected the prepared device: the container's environment names it
    (c,) = running(dra_node, pod_uid=pod.metadata.uid).values()
    environ = Path(f"/proc/{c.pid}/environ").read_bytes().split(b"\0")
    assert f"{env_var('dev1')}=dev1".encode() in environ
    assert not any(e.startswith(env_var("dev0").encode()) for e in environ)

    # the pod gone, the kubelet has the plugin unprepare the claim: its CDI spec goes
    core.delete_namespaced_pod("dra-numa1", namespace, grace_period_seconds=0)
    wait_for(lambda: not spec.exists(), 120, "the claim's CDI spec removed (unprepared)")


def test_the_pod_is_placed_next_to_its_claimed_device_under_its_policy(
        dra_node: Any, core: client.CoreV1Api, k8s_client: Any, namespace: str,
        kubeconfig: Path, tmp_path: Path) -> None:
    """single-numa-node (the namespace's TopologyPolicy, no redeploy): a 1-CPU pod whose
    claim gets the device on NUMA node 1 runs with its CPU and memory there (numalign read
    the claim: the allocation names the device); one whose device is on NUMA node 0, where
    no CPU can be had exclusively (CPU 0 is reserved), is rejected with the kubelet's
    TopologyAffinityError and never gets a container."""
    custom = _custom(k8s_client)
    for n in (0, 1):
        custom.create_namespaced_custom_object(DRA_GROUP, DRA_VERSION, namespace,
                                               "resourceclaimtemplates",
                                               claim_template(f"numa{n}", n))
    name = f"dra-{namespace}"[:60]
    with operator(kubeconfig, k8s_client, tmp_path / "op.log") as op:
        policy(k8s_client, name, {"policy": "single-numa-node", "namespaces": [namespace],
                                  "redeploy": {"enabled": False}}, seen=True)
        try:
            core.create_namespaced_pod(namespace, claim_pod("near", "numa1"))
            near = wait_running(core, namespace, "near", timeout=240)
            alloc = wait_for(lambda: allocation(core.read_namespaced_pod("near", namespace)),
                             60, "near's numalign.io/allocation")
            numa1 = set(dra_node.machine().numa_nodes[1].cpus)
            mine = exclusive(alloc, "work")
            assert mine and mine <= numa1, alloc
            assert [ids for ids in alloc.containers["work"].dra_devices.values()] == \
                [[f"{DRIVER}/localhost/dev1"]], alloc
            (c,) = running(dra_node, pod_uid=near.metadata.uid).values()
            assert c.status_cpus == mine and c.cgroup_cpus == mine
            assert c.cgroup_mems == expected_mems(alloc, "work")
            core.delete_namespaced_pod("near", namespace, grace_period_seconds=0)
            wait_for(lambda: not running(dra_node, pod_uid=near.metadata.uid), 120,
                     "near's container gone")

            core.create_namespaced_pod(namespace, claim_pod("far", "numa0"))

            def failed() -> Any:
                pod = core.read_namespaced_pod("far", namespace)
                assert pod.status.phase != "Running", story(core, namespace)
                return pod if pod.status.phase == "Failed" else None

            far = wait_for(failed, 240, "far Failed")
            # rejected the kubelet's way: its annotation and Warning event (the kubelet's
            # own status write may clear status.reason once the phase is terminal)
            # (" (written again: N)" where the kubelet wrote its Pending back first, as a
            # loaded node's status manager may: numalign asserted the rejection again)
            note = far.metadata.annotations[ANN_REJECTION]
            assert note == REJECT_REASON or note.startswith(
                f"{REJECT_REASON} (written again: "), far.metadata
            warnings = wait_for(lambda: [e for e in events_of(core, namespace, REJECT_REASON)
                                         if e.involved_object.uid == far.metadata.uid],
                                60, "far's TopologyAffinityError event")
            assert warnings[0].type == "Warning" and TOPOLOGY_MESSAGE in warnings[0].message
            assert not app_containers(dra_node, pod_uid=far.metadata.uid)
            assert "Traceback" not in op.text()
        finally:
            delete_policy(k8s_client, name)
