"""Helpers for the real-node scenarios (tests/e2e/test_realnode*_e2e.py): pods of the
workload image for the real node, waiting for them, an emulated node beside it for
redeploys, and reading back what happened."""

from __future__ import annotations

import contextlib
import re
import shutil
import ssl
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e_helpers import AgentProcess, node_topology, wait_for
from numalign.devcluster.images import WORKLOAD_IMAGE
from numalign.devcluster.realnode_config import TAINT

DEVICE = "numalign.io/sample-device"


@contextlib.contextmanager
def running_real_node(cluster: Any, logs: Path, tag: str, **options: Any) -> Iterator[Any]:
    """A real kubelet and containerd (``numalign dev up --real-node``, ``options`` as
    ``RealNode`` takes them) in ``cluster``, seeing ``realnode-2numa`` (this machine's first
    two CPUs as two NUMA nodes); its logs copied to ``logs`` and the node removed after.
    Skipped only where containers cannot run."""
    import pytest

    from e2e_helpers import MACHINES
    from numalign.devcluster.realnode import RealNode, cannot_run_containers

    reason = cannot_run_containers()
    if reason is not None:
        pytest.skip(f"this machine cannot run containers: {reason}")
    node = RealNode(cluster, MACHINES / "realnode-2numa.yaml", **options)

    def say(m: str) -> None:
        print(f"[{tag}] {m}", flush=True)

    try:
        node.up(log=say, timeout=300)
        yield node
    finally:
        if (node.dir / "logs").is_dir():
            shutil.copytree(node.dir / "logs", logs, dirs_exist_ok=True)
            say(f"its logs are kept in {logs}")
        node.down(log=say)


def kubelet_get(node: Any, path: str) -> bytes:
    """GET ``path`` (e.g. /configz, /metrics) from the real node's kubelet: it listens on
    loopback, which the API server's node proxy refuses, so it is asked directly, with a
    client certificate the cluster's CA signed."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the kubelet's self-signed serving certificate
    ctx.load_cert_chain(str(node.dir / "kubelet-client.crt"), str(node.dir / "kubelet-client.key"))
    port = node.state()["ports"]["kubelet"]
    with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=ctx,
                                timeout=10) as r:
        body: bytes = r.read()
    return body


def workload_pod(name: str, cpu: str = "1", memory: str = "64Mi",
                 extra: dict[str, str] | None = None) -> dict[str, Any]:
    """A guaranteed pod of the workload image for the real node (``cpu`` CPUs, its
    ``extra`` resources, e.g. sample devices)."""
    limits = {"cpu": cpu, "memory": memory, **(extra or {})}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "localhost"},
            "tolerations": [{"key": TAINT["key"], "operator": "Exists"}],
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": False,
            "containers": [{"name": "work", "image": WORKLOAD_IMAGE,
                            "imagePullPolicy": "Never",
                            "resources": {"limits": limits, "requests": limits}}],
        },
    }


def burstable_pod(name: str, extra: dict[str, str] | None = None) -> dict[str, Any]:
    """A burstable pod with no CPU request: it fits beside a guaranteed 1-CPU pod on the
    node's one allocatable CPU, and runs in the shared pool."""
    pod = workload_pod(name, extra=extra)
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"memory": "64Mi", **(extra or {})},
        "requests": {"memory": "32Mi", **(extra or {})}}
    return pod


def wait_running(core: client.CoreV1Api, ns: str, name: str, timeout: float = 180) -> Any:
    def running() -> Any:
        pod = core.read_namespaced_pod(name, ns)
        if pod.status.phase in ("Failed", "Succeeded"):
            raise AssertionError(f"pod {name} is {pod.status.phase}: {pod.status.reason} "
                                 f"{pod.status.message}")
        return pod if pod.status.phase == "Running" else None

    try:
        return wait_for(running, timeout, f"pod {name} Running on the real node")
    except AssertionError:
        events = core.list_namespaced_event(ns).items
        raise AssertionError("; ".join(f"{e.reason}: {e.message}" for e in events)) from None


def status_line(text: str, key: str) -> str:
    m = re.search(rf"^{key}:\s*(\S+)\s*$", text, re.M)
    assert m, f"no {key} line in:\n{text}"
    return m.group(1)


REDEPLOY = {"enabled": True, "maxAttempts": 2, "backoffSeconds": 2, "avoidRejectingNodes": True}


@contextlib.contextmanager
def beside_an_emulated_node(k8s_client: Any, kubeconfig: Path, namespace: str,
                             tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """An emulated ``sample-devices-2numa`` node (two sample devices on each NUMA node)
    beside the real node, both labelled for this test: yields its name and the label.
    Removed after, with the test's Deployments and the real node's label."""
    core = client.CoreV1Api(k8s_client)
    apps = client.AppsV1Api(k8s_client)
    label = {"numalign.io/e2e-real": namespace[-12:]}
    agent = AgentProcess(kubeconfig, [("sample-devices-2numa", 1)],
                         900 + uuid.uuid4().int % 90, tmp_path / "agent.log").start()
    (emulated,) = agent.nodes
    try:
        def registered() -> bool:
            assert agent.alive(), agent.text()[-3000:]
            nt = node_topology(k8s_client, emulated)
            return bool(nt and (nt.get("status") or {}).get("zones"))

        wait_for(registered, 90, f"emulated node {emulated} with its NodeTopology")
        for node in (emulated, "localhost"):
            core.patch_node(node, {"metadata": {"labels": label}})
        yield emulated, label
    finally:
        for d in apps.list_namespaced_deployment(namespace).items:
            apps.delete_namespaced_deployment(d.metadata.name, namespace)
        agent.stop()
        core.patch_node("localhost", {"metadata": {"labels": {next(iter(label)): None}}})
        with contextlib.suppress(ApiException):
            core.delete_node(emulated)
        with contextlib.suppress(ApiException):
            client.CustomObjectsApi(k8s_client).delete_cluster_custom_object(
                "numalign.io", "v1alpha1", "nodetopologies", emulated)


def real_node_can_take(core: client.CoreV1Api, devices: int) -> None:
    """Wait until the scheduler sees room on the real node for a 1-CPU pod with
    ``devices`` sample devices: its device plugin registered again after a kubelet restart
    (allocatable devices back) and no pod bound to it. Otherwise the scheduler rightly
    places the pod elsewhere and the kubelet never gets to reject it."""
    def free() -> bool:
        node = core.read_node("localhost")
        alloc = node.status.allocatable or {}
        ready = any(c.type == "Ready" and c.status == "True"
                    for c in node.status.conditions or [])
        bound = core.list_pod_for_all_namespaces(
            field_selector="spec.nodeName=localhost").items
        return ready and int(alloc.get(DEVICE, "0")) >= devices and not bound

    wait_for(free, 120, f"the real node Ready, {devices} devices allocatable and no pods")


def prefers_the_real_node(k8s_client: Any, namespace: str, label: dict[str, str]) -> None:
    """A Deployment of one pod (1 CPU, 2 sample devices) that prefers the real node: its
    kubelet rejects it under single-numa-node (one free CPU, its two devices on different
    NUMA nodes)."""
    real_node_can_take(client.CoreV1Api(k8s_client), 2)
    pod = workload_pod("rr", extra={DEVICE: "2"})
    pod["metadata"] = {"labels": {"app": "rr"}}
    pod["spec"]["nodeSelector"] = label
    pod["spec"]["affinity"] = {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100, "preference": {"matchFields": [{
                "key": "metadata.name", "operator": "In", "values": ["localhost"]}]}}]}}
    client.AppsV1Api(k8s_client).create_namespaced_deployment(namespace, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "rr"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "rr"}},
                 "template": {"metadata": pod["metadata"], "spec": pod["spec"]}}})


def story(core: client.CoreV1Api, namespace: str) -> str:
    state = [(p.metadata.name, p.spec.node_name, p.status.phase, p.status.reason)
             for p in core.list_namespaced_pod(namespace).items]
    events = [(ev.reason, ev.message) for ev in core.list_namespaced_event(namespace).items
              if ev.reason.startswith("Redeploy")]
    return f"pods {state}; events {events}"


def avoids_the_real_node(pod: Any) -> None:
    terms = pod.spec.affinity.node_affinity. \
        required_during_scheduling_ignored_during_execution.node_selector_terms
    assert all(any(f.key == "metadata.name" and f.operator == "NotIn"
                   and f.values == ["localhost"] for f in t.match_fields or [])
               for t in terms), terms


def events_of(core: client.CoreV1Api, namespace: str, reason: str) -> list[Any]:
    return [ev for ev in core.list_namespaced_event(namespace).items if ev.reason == reason]


# ----------------------------------------------------------------- DRA (dev up --dra)

DRA_GROUP, DRA_VERSION = "resource.k8s.io", "v1"
DRA_CLASS = "sample-device.numalign.io.dra.numalign.io"  # the real node's DRA plugin's


def claim_pod(name: str, template: str) -> dict[str, Any]:
    """A guaranteed 1-CPU pod of the workload image whose container uses claim ``dev``
    made from ``template``."""
    pod = workload_pod(name)
    pod["spec"]["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": template}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "dev"}]
    return pod


def claim_template(name: str, numa_node: int) -> dict[str, Any]:
    """One sample device of the real node's driver on ``numa_node``."""
    cel = f'device.attributes["resource.kubernetes.io"].numaNode == {numa_node}'
    return {"apiVersion": f"{DRA_GROUP}/{DRA_VERSION}", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [{
                "name": "dev", "exactly": {"deviceClassName": DRA_CLASS,
                                           "selectors": [{"cel": {"expression": cel}}]}}]}}}}
