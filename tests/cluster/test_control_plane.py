"""The dev control plane is a real Kubernetes: the API server enforces the CRDs' schemas
and CEL rules, the controller manager and scheduler run their controllers."""

from __future__ import annotations

import http.client
import json
import ssl
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from numalign.api import NodeTopologyStatus, summarize
from numalign.api.kube import KubeConfig, SyncKube
from numalign.devcluster import DevCluster
from numalign.devcluster.build import KUBERNETES_VERSION
from numalign.devcluster.certs import KeyPair

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION = "numalign.io", "v1alpha1"
Kubectl = Callable[..., Any]
Wait = Callable[..., Any]


def _uid() -> str:
    return uuid.uuid4().hex[:6]


def _table(text: str) -> list[list[str]]:
    return [line.split() for line in text.strip().splitlines()]


def _policy(name: str, **spec: Any) -> str:
    return yaml.safe_dump({"apiVersion": f"{GROUP}/{VERSION}", "kind": "TopologyPolicy",
                           "metadata": {"name": name}, "spec": spec})


def test_server_version(kubectl: Kubectl) -> None:
    out = json.loads(kubectl("version", "-o", "json").stdout)
    assert out["serverVersion"]["gitVersion"] == KUBERNETES_VERSION == "v1.37.2"


def test_apply_crds_establishes_them(kubectl: Kubectl) -> None:
    out = kubectl("apply", "-f", str(REPO / "crds")).stdout
    assert "nodetopologies.numalign.io" in out and "topologypolicies.numalign.io" in out
    kubectl("wait", "--for=condition=Established", "--timeout=60s",
            "crd/nodetopologies.numalign.io", "crd/topologypolicies.numalign.io")
    resources = _table(kubectl("api-resources", "--api-group=numalign.io").stdout)
    assert resources[0] == ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND"]
    assert ["nodetopologies", "nt", "numalign.io/v1alpha1", "false", "NodeTopology"] in resources
    assert ["topologypolicies", "tp", "numalign.io/v1alpha1", "false",
            "TopologyPolicy"] in resources
    # The category: 'kubectl get numalign' lists both kinds.
    assert kubectl("get", "numalign").returncode == 0
    assert "maxAttempts" in kubectl("explain", "tp.spec.redeploy").stdout


def test_nodetopology_printer_columns(kubectl: Kubectl, k8s_client: Any) -> None:
    from kubernetes import client

    api: Any = client.CustomObjectsApi(k8s_client)
    name = f"node-{_uid()}"
    api.create_cluster_custom_object(
        GROUP, VERSION, "nodetopologies",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeTopology", "metadata": {"name": name},
         "spec": {"policy": "single-numa-node", "scope": "pod", "policyGeneration": 1}},
        field_validation="Strict",
    )
    try:
        status = NodeTopologyStatus.model_validate({
            "zones": [
                {"id": 0, "cpus": "0-7", "memory": "64Gi", "allocatable": {"cpu": 8},
                 "available": {"cpu": 6}},
                {"id": 1, "cpus": "8-15", "memory": "64Gi", "hugepages": {"2Mi": "1Gi"}},
            ],
            "distances": {"0": {"0": 10, "1": 21}, "1": {"0": 21, "1": 10}},
            "devices": [
                {"resource": "nvidia.com/gpu", "id": "gpu0", "numaNode": 0, "memory": "80Gi",
                 "groups": [{"level": "socket", "id": "s0"}, {"level": "nvlink", "id": "nv0"}]},
                {"resource": "nvidia.com/gpu", "id": "gpu1", "numaNode": 1},
            ],
            "admitted": [{"pod": "p", "namespace": "ns", "uid": "u1", "policy": "restricted",
                          "scope": "pod", "source": "TopologyPolicy/x", "numaNodes": [0],
                          "cpus": "2-3", "memory": {"0": "1Gi"},
                          "devices": {"nvidia.com/gpu": ["gpu0"]}}],
            "rejected": 2,
            "observedPolicyGeneration": 1,
        })
        status.summary = summarize(status)
        api.patch_cluster_custom_object_status(GROUP, VERSION, "nodetopologies", name,
                                               {"status": status.to_dict()})
        rows = _table(kubectl("get", "nt", name).stdout)
        assert rows[0] == ["NAME", "POLICY", "SCOPE", "NUMA", "CPUS", "DEVICES", "PODS",
                           "REJECTED", "DRA", "AGE"]
        assert rows[1][:8] == [name, "single-numa-node", "pod", "2", "14/16", "1/2", "1", "2"]
        stored = yaml.safe_load(kubectl("get", "nodetopology", name, "-o", "yaml").stdout)
        assert stored["status"]["devices"][0]["groups"][1] == {"level": "nvlink", "id": "nv0"}
        assert stored["status"]["admitted"][0]["memory"] == {"0": "1Gi"}
    finally:
        kubectl("delete", "nt", name, "--wait=false")


def test_topologypolicy_printer_columns_and_defaults(kubectl: Kubectl, k8s_client: Any) -> None:
    from kubernetes import client

    name = f"ml-training-{_uid()}"
    kubectl("apply", "-f", "-", input=_policy(
        name, policy="single-numa-node", scope="pod",
        options={"preferClosestNumaNodes": False, "maxAllowableNumaNodes": 64},
        namespaces=["ml"], podSelector={"matchLabels": {"tier": "rt"}},
        nodeSelector={"matchLabels": {"pool": "gpu"}}, priority=10,
        podOverrides={"allowed": True, "policies": ["restricted", "single-numa-node"]},
        redeploy={"enabled": True, "maxAttempts": 5, "backoffSeconds": 10,
                  "avoidRejectingNodes": True},
    ))
    minimal = f"minimal-{_uid()}"
    kubectl("apply", "-f", "-", input=_policy(minimal, policy="restricted"))
    try:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        client.CustomObjectsApi(k8s_client).patch_cluster_custom_object_status(
            GROUP, VERSION, "topologypolicies", name,
            {"status": {"conditions": [{"type": "Valid", "status": "True", "reason": "Valid",
                                        "message": "", "lastTransitionTime": now}],
                        "namespaceSummary": "ml", "matchedNamespaces": ["ml"],
                        "admittedPods": 3, "rejectedPods": 1}})
        rows = _table(kubectl("get", "tp", name).stdout)
        assert rows[0] == ["NAME", "POLICY", "SCOPE", "PRIORITY", "VALID", "NAMESPACES", "AGE"]
        assert rows[1][:6] == [name, "single-numa-node", "pod", "10", "True", "ml"]
        wide = _table(kubectl("get", "tp", name, "-o", "wide").stdout)
        assert wide[0][6:9] == ["CONFLICTING", "ADMITTED", "REJECTED"]
        # Defaults come from the models: scope, priority, redeploy, options.
        spec = yaml.safe_load(kubectl("get", "tp", minimal, "-o", "yaml").stdout)["spec"]
        assert spec["scope"] == "container" and spec["priority"] == 0
        assert spec["redeploy"] == {"enabled": True, "maxAttempts": 3, "backoffSeconds": 10,
                                    "avoidRejectingNodes": True}
        # Field selectors on .spec.policy.
        listed = kubectl("get", "tp", "--field-selector=spec.policy=restricted", "-o", "name")
        assert f"topologypolicy.numalign.io/{minimal}" in listed.stdout.split()
        assert f"topologypolicy.numalign.io/{name}" not in listed.stdout.split()
    finally:
        kubectl("delete", "tp", name, minimal, "--wait=false")


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"policy": "single-numa"},
                     ['spec.policy: Unsupported value: "single-numa"',
                      'supported values: "none", "best-effort", "restricted", "single-numa-node"'],
                     id="bad-policy"),
        pytest.param({"policy": "restricted", "options": {"maxAllowableNumaNodes": 4}},
                     ["spec.options.maxAllowableNumaNodes", "must be at least 8"],
                     id="max-allowable-4"),
        pytest.param({"policy": "restricted", "options": {"maxAllowableNumaNodes": 65}},
                     ["spec.options.maxAllowableNumaNodes", "less than or equal to 64"],
                     id="max-allowable-65"),
        pytest.param({"policy": "restricted", "priority": -1},
                     ["spec.priority", "greater than or equal to 0"], id="negative-priority"),
        pytest.param({"policy": "restricted", "options": {"bogus": True}},
                     ['unknown field "spec.options.bogus"'], id="unknown-option"),
        pytest.param({"policy": "restricted", "sope": "pod"},
                     ['unknown field "spec.sope"'], id="unknown-field"),
        pytest.param({"scope": "pod"}, ["spec.policy: Required value"], id="no-policy"),
        pytest.param({"policy": "restricted", "scope": "node"},
                     ['spec.scope: Unsupported value: "node"'], id="bad-scope"),
        pytest.param({"policy": "restricted", "podOverrides": {"policies": ["none"]}},
                     ["spec.podOverrides.policies",
                      "policies may only be listed when allowed is true"],
                     id="overrides-not-allowed"),
        pytest.param({"policy": "restricted", "namespaces": []},
                     ["spec.namespaces", "must list at least one namespace"],
                     id="empty-namespaces"),
        pytest.param({"policy": "restricted",
                      "podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
                     ["spec.podSelector.matchExpressions[0].values",
                      "values must be non-empty for operator In"], id="selector-no-values"),
        pytest.param({"policy": "restricted", "redeploy": {"maxAttempts": 0}},
                     ["spec.redeploy.maxAttempts", "greater than or equal to 1"],
                     id="redeploy-attempts"),
    ],
)
def test_bad_policy_refused(kubectl: Kubectl, spec: dict[str, Any], expected: list[str]) -> None:
    """Plain 'kubectl apply' (its default --validate=strict) gets a message that names
    the field and what is allowed."""
    name = f"bad-{_uid()}"
    proc = kubectl("apply", "-f", "-", input=_policy(name, **spec), check=False)
    if proc.returncode == 0:
        kubectl("delete", "tp", name, "--wait=false")
    assert proc.returncode != 0, f"accepted: {spec}"
    for text in expected:
        assert text in proc.stderr, proc.stderr


def test_unknown_fields_need_strict_field_validation(k8s_client: Any) -> None:
    """Structural schemas prune unknown fields. kubectl (--validate=strict, its default)
    and clients that ask for fieldValidation=Strict get an error; a client that does not
    ask gets the field dropped (and a warning header)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api: Any = client.CustomObjectsApi(k8s_client)
    name = f"unknown-{_uid()}"
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "TopologyPolicy", "metadata": {"name": name},
        "spec": {"policy": "restricted", "options": {"bogus": True}},
    }
    with pytest.raises(ApiException) as err:
        api.create_cluster_custom_object(GROUP, VERSION, "topologypolicies", body,
                                         field_validation="Strict")
    assert err.value.status == 400
    message = json.loads(err.value.body or "{}").get("message", "")
    assert 'unknown field "spec.options.bogus"' in message
    created = api.create_cluster_custom_object(GROUP, VERSION, "topologypolicies", body)
    try:
        assert "bogus" not in created["spec"]["options"]
    finally:
        api.delete_cluster_custom_object(GROUP, VERSION, "topologypolicies", name)


def _node(name: str) -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                              "numalign.io/test-node": name}},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "fake node for a test", "lastHeartbeatTime": now,
                            "lastTransitionTime": now}],
        },
    }


def _deployment(name: str, replicas: int, node_selector: dict[str, str]) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": node_selector,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"requests": {"cpu": "100m",
                                                               "memory": "64Mi"}}}],
                },
            },
        },
    }


def test_deployment_pods_created_and_scheduled(k8s_client: Any, namespace: str,
                                               wait: Wait) -> None:
    """The controller manager creates the pods, the scheduler binds them to a Node (a
    fake one: no kubelet runs)."""
    from kubernetes import client

    core: Any = client.CoreV1Api(k8s_client)
    apps: Any = client.AppsV1Api(k8s_client)
    node = f"fake-{_uid()}"
    core.create_node(_node(node))
    try:
        apps.create_namespaced_deployment(
            namespace, _deployment("web", 2, {"numalign.io/test-node": node}))

        def bound() -> list[str]:
            pods = core.list_namespaced_pod(namespace, label_selector="app=web").items
            names = [p.spec.node_name for p in pods]
            return names if len(names) == 2 and all(n == node for n in names) else []

        wait(bound, 60, f"2 pods bound to {node}")
        rs = apps.list_namespaced_replica_set(namespace, label_selector="app=web").items
        assert len(rs) == 1 and rs[0].metadata.owner_references[0].kind == "Deployment"
    finally:
        apps.delete_namespaced_deployment("web", namespace)
        # No kubelet confirms termination: remove the bound pods outright.
        core.delete_collection_namespaced_pod(namespace, label_selector="app=web",
                                              grace_period_seconds=0)
        core.delete_node(node)


def test_garbage_collection(k8s_client: Any, namespace: str, wait: Wait) -> None:
    """Deleting a Deployment removes its ReplicaSet and pods."""
    from kubernetes import client

    core: Any = client.CoreV1Api(k8s_client)
    apps: Any = client.AppsV1Api(k8s_client)
    apps.create_namespaced_deployment(
        namespace, _deployment("gc", 2, {"numalign.io/no-such-node": "x"}))

    def pods() -> int:
        return len(core.list_namespaced_pod(namespace, label_selector="app=gc").items)

    def replicasets() -> int:
        return len(apps.list_namespaced_replica_set(namespace, label_selector="app=gc").items)

    wait(lambda: pods() == 2, 60, "2 pending pods")
    assert replicasets() == 1
    apps.delete_namespaced_deployment("gc", namespace, propagation_policy="Background")
    wait(lambda: replicasets() == 0 and pods() == 0, 60, "the ReplicaSet and pods to go")


def test_namespace_deletion(k8s_client: Any, wait: Wait) -> None:
    """The namespace controller empties and removes a deleted namespace."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core: Any = client.CoreV1Api(k8s_client)
    apps: Any = client.AppsV1Api(k8s_client)
    name = f"doomed-{_uid()}"
    core.create_namespace({"metadata": {"name": name}})
    wait(lambda: core.list_namespaced_service_account(name).items, 30, "the default SA")
    core.create_namespaced_config_map(name, {"metadata": {"name": "cm"}, "data": {"a": "b"}})
    apps.create_namespaced_deployment(name, _deployment("d", 1, {"numalign.io/none": "x"}))
    wait(lambda: core.list_namespaced_pod(name).items, 60, "a pod")
    core.delete_namespace(name)

    def gone() -> bool:
        try:
            core.read_namespace(name)
            return False
        except ApiException as e:
            if e.status == 404:
                return True
            raise

    wait(gone, 90, f"namespace {name} to be deleted")


def _tls(ca: Path, client: KeyPair | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    if client is not None:
        ctx.load_cert_chain(client.cert, client.key)
    return ctx


def _answer(url: str, path: str, tls: ssl.SSLContext | None = None, method: str = "GET",
            body: str | None = None) -> int | str:
    """The HTTP status of ``method url+path`` (``tls``: over HTTPS with that context), or,
    when no answer came, why."""
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port
    conn = (http.client.HTTPSConnection(host, port, context=tls, timeout=10) if tls
            else http.client.HTTPConnection(host, port, timeout=10))
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException) as e:  # ssl.SSLError included
        return f"{type(e).__name__}: {e}"
    finally:
        conn.close()


def test_etcd_answers_only_its_client_certificate(dev_cluster: DevCluster) -> None:
    """Issue 26, finding 11: etcd is HTTPS only and requires a client certificate of its
    own CA (the API server's); neither plain HTTP, nor TLS without a certificate, nor the
    cluster admin's certificate (cluster CA, system:masters) reaches it. Its peer port
    likewise asks for a peer certificate."""
    p = dev_cluster.pki
    ports = dev_cluster.state()["ports"]
    client, peer = (f"https://127.0.0.1:{ports[k]}" for k in ("etcd", "etcdPeer"))
    assert _answer(client.replace("https:", "http:"), "/health") != 200
    assert isinstance(_answer(client, "/health", _tls(p.etcd_ca)), str)
    assert isinstance(_answer(client, "/health", _tls(p.etcd_ca, p.admin)), str)
    assert _answer(client, "/health", _tls(p.etcd_ca, p.apiserver_etcd_client)) == 200
    assert _answer(peer.replace("https:", "http:"), "/version") != 200
    assert isinstance(_answer(peer, "/version", _tls(p.etcd_ca)), str)
    assert _answer(peer, "/version", _tls(p.etcd_ca, p.etcd_peer)) == 200


def test_extender_answers_only_the_scheduler_and_is_no_admin(dev_cluster: DevCluster) -> None:
    """Issue 26, finding 11: the extender's verbs are HTTPS and refuse any client but one
    with kube-scheduler's certificate (the admin's included); its probes are plain HTTP
    on their own port; towards the API server it is numalign-extender with the
    extender's RBAC, not the admin."""
    was_running = dev_cluster.processes().get("extender", False)
    dev_cluster.start_extender()
    try:
        p = dev_cluster.pki
        url = dev_cluster.extender_url
        assert url is not None and url.startswith("https://127.0.0.1:")
        probe = dev_cluster.extender_probe_url
        assert probe is not None and probe.startswith("http://127.0.0.1:")
        assert _answer(url.replace("https:", "http:"), "/healthz") != 200
        for tls in (_tls(p.extender_ca), _tls(p.extender_ca, p.admin)):
            assert isinstance(_answer(url, "/bind", tls, "POST", "{}"), str)
            assert isinstance(_answer(url, "/healthz", tls), str)
        assert _answer(url, "/readyz", _tls(p.extender_ca, p.scheduler_extender_client)) == 200
        assert _answer(probe, "/readyz") == 200
        assert _answer(probe, "/bind", method="POST", body="{}") in (404, 405)

        argv = dev_cluster.state()["addons"]["extender"]
        assert argv[argv.index("--kubeconfig") + 1] == str(dev_cluster.extender_kubeconfig)
        assert str(dev_cluster.kubeconfig) not in argv
        with SyncKube(KubeConfig.from_files(dev_cluster.server or "", p.ca.cert,
                                            p.extender_client.cert,
                                            p.extender_client.key)) as kube:
            def may(verb: str, resource: str, group: str = "", sub: str = "") -> bool:
                review = kube.create(
                    "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                    {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                     "spec": {"resourceAttributes": {"verb": verb, "resource": resource,
                                                     "group": group, "subresource": sub}}})
                return bool(review["status"].get("allowed"))

            assert may("list", "pods") and may("watch", "pods")
            assert may("create", "pods", sub="binding")
            assert may("list", "nodetopologies", "numalign.io")
            assert not may("create", "pods") and not may("delete", "pods")
            assert not may("get", "secrets") and not may("list", "nodes")
            assert not may("patch", "nodetopologies", "numalign.io")
    finally:
        if not was_running:
            dev_cluster.stop_extender()
