"""A registered fifth policy end to end on a real API server, with no edit but the
plugin: ``NUMALIGN_POLICY_MODULES=toy_policy`` (tests/toy_policy.py, ``at-most-two``)
for the operator and the emulating agent, and the CRDs generated with it registered.
A TopologyPolicy naming it passes the CRD schema and the webhook; a pod resolves to it
(``numalign.io/resolved``); the emulated node admits a pod two NUMA nodes wide and
rejects one three wide (restricted would admit both); NodeTopology, the
NodeResourceTopology and the agent's metrics all name it."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import testdata
from agent_helpers import StartAgent
from numalign.devcluster import DevCluster
from numalign.topology import policies
from operator_helpers import delete_policy, free_port, operator, policy, resolved
from toy_policy import NAME as TOY
from toy_policy import AtMostTwo

pytestmark = pytest.mark.cluster

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
MACHINE = testdata.MACHINES / "fragmented-8numa.yaml"  # 8 NUMA nodes of 4 CPUs, 16Gi
NRT_CRD = REPO / "config" / "nrt" / "crd.yaml"
REASON = "TopologyAffinityError"

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def toy_cluster(dev_cluster: DevCluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The toy registered here (the CRDs are generated in this process) and named in the
    environment of the operator and agent this test starts; the built-in CRDs back after."""
    monkeypatch.setenv("NUMALIGN_POLICY_MODULES", "toy_policy")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p))
    policies.register(AtMostTwo())
    try:
        dev_cluster.install_crds()
        yield
    finally:
        policies.unregister(TOY)
        dev_cluster.install_crds()


def _get(kubectl: Kubectl, *args: str) -> Any:
    proc = kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _pod(name: str, node: str, cpus: int) -> dict[str, Any]:
    # as much memory as the CPUs ask NUMA nodes for, so both prefer the same width
    res = {"cpu": str(cpus), "memory": f"{cpus * 4 - 4}Gi"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"requests": res, "limits": res}}]}}


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text: str = r.read().decode()
    return text


def test_a_registered_policy_end_to_end(toy_cluster: None, start_agent: StartAgent,
                                        kubeconfig: Path, k8s_client: Any, kubectl: Kubectl,
                                        namespace: str, wait: Callable[..., Any],
                                        tmp_path: Path) -> None:
    core = client.CoreV1Api(k8s_client)
    kubectl("apply", "-f", str(NRT_CRD))
    kubectl("wait", "--for", "condition=Established", "--timeout", "60s",
            "crd/noderesourcetopologies.topology.node.k8s.io")
    port = free_port()
    agent = start_agent(MACHINE, "--publish-nrt", "--metrics-port", str(port),
                        "--metrics-addr", "127.0.0.1")
    node = agent.node
    name = f"toy-{namespace}"
    with operator(kubeconfig, k8s_client, tmp_path / "operator.log") as op:
        try:
            # the CRD schema still refuses a name nobody registered
            with pytest.raises(ApiException) as err:
                policy(k8s_client, f"{name}-x", {"policy": "at-most-three"})
            assert err.value.status == 422 and "at-most-three" in str(err.value.body)
            policy(k8s_client, name, {"policy": TOY, "namespaces": [namespace],
                                      "nodeSelector": {"matchLabels": {
                                          "kubernetes.io/hostname": node}}}, seen=True)

            def valid() -> bool:
                tp = _get(kubectl, "topologypolicy", name) or {}
                conds = {c["type"]: c["status"]
                         for c in (tp.get("status") or {}).get("conditions") or []}
                return conds.get("Valid") == "True"

            wait(valid, 60, f"TopologyPolicy {name} Valid")
            core.create_namespaced_pod(namespace, _pod("two", node, 8))  # 2 NUMA nodes
            core.create_namespaced_pod(namespace, _pod("three", node, 12))  # 3 NUMA nodes
            assert resolved(core, namespace, "two") == {
                "policy": TOY, "scope": "container", "options": {},
                "source": f"TopologyPolicy/{name}"}

            def phase(pod: str, want: str) -> Any:
                p = _get(kubectl, "-n", namespace, "pod", pod)
                return p if p and p["status"].get("phase") == want else None

            two = wait(lambda: phase("two", "Running"), 60, "pod two Running")
            alloc = json.loads(two["metadata"]["annotations"]["numalign.io/allocation"])
            assert len(alloc["numaNodes"]) == 2
            three = wait(lambda: phase("three", "Failed"), 60, "pod three Failed")
            assert three["status"]["reason"] == REASON

            # NodeTopology: its default (from the nodeSelector) and the admitted pod
            def published() -> Any:
                nt = _get(kubectl, "nodetopology", node) or {}
                admitted = (nt.get("status") or {}).get("admitted") or []
                ok = (nt.get("spec") or {}).get("policy") == TOY and admitted
                return admitted if ok else None

            admitted = wait(published, 60, "NodeTopology with the toy policy")
            assert [(e["pod"], e["policy"]) for e in admitted] == [("two", TOY)]

            def nrt_policy() -> Any:
                obj = _get(kubectl, "noderesourcetopology", node) or {}
                attrs = {a["name"]: a["value"] for a in obj.get("attributes") or []}
                return attrs if attrs.get("topologyManagerPolicy") == TOY else None

            wait(nrt_policy, 60, "the NodeResourceTopology to name the toy policy")

            labels = f'node="{node}",policy="{TOY}"'
            text = _metrics(port)
            assert f"numalign_topology_manager_admission_requests_total{{{labels}}} 2.0" in text
            assert f"numalign_topology_manager_admission_errors_total{{{labels}}} 1.0" in text
        finally:
            delete_policy(k8s_client, name)
        assert op.alive(), op.text()[-4000:]
        assert "Traceback" not in op.text(), op.text()[-6000:]
    assert "Traceback" not in agent.log.read_text(errors="replace")
