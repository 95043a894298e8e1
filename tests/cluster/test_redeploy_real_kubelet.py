"""A pod that a real kubelet rejects (``Failed``, reason ``TopologyAffinityError``, the
kubelet's own message) on a registered Node that no numalign agent emulates goes through
the same redeploy path as an emulated rejection: its replacement is kept off the
rejecting node, within the budget, with events.

The test plays the real kubelet's part through the API server: a Node object is
registered (no agent, so no NodeTopology), the pod is bound to it, and its status is set
as the kubelet's admission failure writes it (kubelet.go rejectPod: "Pod was rejected: "
+ the Topology Manager's error).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from numalign.api.names import EVENT_REDEPLOY, EVENT_REDEPLOY_GAVE_UP
from operator_helpers import bare_pod, delete_policy, operator, pods_named, policy, wait_for

pytestmark = pytest.mark.cluster

KUBELET_MESSAGE = "Pod was rejected: Resources cannot be allocated with Topology locality"
FAST = {"enabled": True, "maxAttempts": 2, "backoffSeconds": 1, "avoidRejectingNodes": True}


@pytest.fixture
def core(k8s_client: Any) -> client.CoreV1Api:
    return client.CoreV1Api(k8s_client)


@pytest.fixture
def real_node(core: client.CoreV1Api, k8s_client: Any) -> Iterator[str]:
    """A registered Node with no numalign agent (hence no NodeTopology)."""
    name = f"kubelet-{uuid.uuid4().hex[:6]}"
    core.create_node({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}})
    try:
        with pytest.raises(ApiException) as err:
            client.CustomObjectsApi(k8s_client).get_cluster_custom_object(
                "numalign.io", "v1alpha1", "nodetopologies", name)
        assert err.value.status == 404
        yield name
    finally:
        core.delete_node(name)


@pytest.fixture
def fast_policy(k8s_client: Any, namespace: str) -> Iterator[str]:
    name = f"rk-{namespace}"[:60]
    policy(k8s_client, name, {"policy": "single-numa-node", "namespaces": [namespace],
                              "redeploy": FAST})
    yield name
    delete_policy(k8s_client, name)


def kubelet_rejects(core: client.CoreV1Api, ns: str, name: str, node: str) -> None:
    """Bound to ``node``, then failed as the kubelet's admission writes it."""
    core.create_namespaced_pod_binding(name, ns, {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}}, _preload_content=False)
    core.patch_namespaced_pod_status(name, ns, {"status": {
        "phase": "Failed", "reason": "TopologyAffinityError", "message": KUBELET_MESSAGE}})


def events(core: client.CoreV1Api, ns: str, reason: str) -> list[Any]:
    return [e for e in core.list_namespaced_event(ns).items if e.reason == reason]


def test_deployment_pod_rejected_by_a_real_kubelet_is_redeployed_off_its_node(
        kubeconfig: Path, k8s_client: Any, core: client.CoreV1Api, namespace: str,
        real_node: str, fast_policy: str, tmp_path: Path) -> None:
    apps = client.AppsV1Api(k8s_client)
    tmpl = bare_pod("x", labels={"app": "rk"})
    apps.create_namespaced_deployment(namespace, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "rk"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "rk"}},
                 "template": {"metadata": tmpl["metadata"], "spec": tmpl["spec"]}}})
    with operator(kubeconfig, k8s_client, tmp_path / "op.log") as op:
        first = wait_for(lambda: list(pods_named(core, namespace)), 60, "the Deployment's pod")[0]
        kubelet_rejects(core, namespace, first, real_node)

        def replacement() -> Any:
            pods = pods_named(core, namespace)
            others = [p for n, p in pods.items() if n != first]
            return others[0] if others and first not in pods else None

        new = wait_for(replacement, 60, "the replacement, the rejected pod deleted")
        aff = new.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        assert aff.node_selector_terms[0].match_fields[0].to_dict() == {
            "key": "metadata.name", "operator": "NotIn", "values": [real_node]}
        redeploys = wait_for(lambda: events(core, namespace, EVENT_REDEPLOY), 30,
                             "a Redeploy event")
        assert redeploys[0].involved_object.name == first
        assert "attempt 1/2" in redeploys[0].message
        assert "Traceback" not in op.text()


def test_bare_pod_rejected_by_a_real_kubelet_recreated_then_given_up(
        kubeconfig: Path, k8s_client: Any, core: client.CoreV1Api, namespace: str,
        real_node: str, fast_policy: str, tmp_path: Path) -> None:
    with operator(kubeconfig, k8s_client, tmp_path / "op.log") as op:
        core.create_namespaced_pod(namespace, bare_pod("gpu", labels={"app": "gpu"}))
        kubelet_rejects(core, namespace, "gpu", real_node)
        wait_for(lambda: set(pods_named(core, namespace)) == {"gpu-r1"}, 30, "gpu-r1")
        r1 = core.read_namespaced_pod("gpu-r1", namespace)
        terms = r1.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        assert terms.node_selector_terms[0].match_fields[0].values == [real_node]
        msg = wait_for(lambda: events(core, namespace, EVENT_REDEPLOY), 30, "Redeploy")[0].message
        assert f"recreated as gpu-r1, avoiding {real_node}" in msg
        # the budget bounds it: rejected again (attempt 2), then given up
        kubelet_rejects(core, namespace, "gpu-r1", real_node)
        wait_for(lambda: set(pods_named(core, namespace)) == {"gpu-r2"}, 30, "gpu-r2")
        kubelet_rejects(core, namespace, "gpu-r2", real_node)
        gave_up = wait_for(lambda: events(core, namespace, EVENT_REDEPLOY_GAVE_UP), 30,
                           "RedeployGaveUp")
        assert "maxAttempts=2" in gave_up[0].message
        assert set(pods_named(core, namespace)) == {"gpu-r2"}
        assert "Traceback" not in op.text()
