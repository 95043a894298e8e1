"""Redeploy of TopologyAffinityError pods, crash safety and peering, on a real API server.

The test plays the kubelet: it binds pods and sets Failed / TopologyAffinityError through
the status subresource. The pods keep a nodeSelector no node has, so the real scheduler
never places them.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from numalign.api.names import EVENT_REDEPLOY_GAVE_UP
from operator_helpers import (
    bare_pod,
    delete_policy,
    operator,
    pods_named,
    policy,
    reject,
    wait_for,
)

pytestmark = pytest.mark.cluster

FAST = {"enabled": True, "maxAttempts": 2, "backoffSeconds": 1, "avoidRejectingNodes": True}


@pytest.fixture
def core(k8s_client: Any) -> client.CoreV1Api:
    return client.CoreV1Api(k8s_client)


@pytest.fixture
def fast_policy(k8s_client: Any, namespace: str) -> Any:
    name = f"rd-{namespace}"[:60]
    policy(k8s_client, name, {"policy": "restricted", "namespaces": [namespace],
                              "redeploy": FAST})
    yield name
    delete_policy(k8s_client, name)


def _state(core: client.CoreV1Api, ns: str) -> dict[str, Any]:
    cm = core.read_namespaced_config_map("numalign-redeploy", ns)
    return {k: json.loads(v) for k, v in (cm.data or {}).items()}


def test_bare_pod_recreated_once_then_gives_up(kubeconfig: Path, k8s_client: Any,
                                               core: client.CoreV1Api, namespace: str,
                                               fast_policy: str, tmp_path: Path) -> None:
    with operator(kubeconfig, k8s_client, tmp_path / "op.log") as op:
        core.create_namespaced_pod(namespace, bare_pod("web", labels={"app": "web"},
                                                       node="node-a"))
        reject(core, namespace, "web")
        wait_for(lambda: set(pods_named(core, namespace)) == {"web-r1"}, 30,
                 "exactly the replacement web-r1")
        r1 = core.read_namespaced_pod("web-r1", namespace)
        assert r1.metadata.labels == {"app": "web"} and r1.spec.node_name is None
        terms = r1.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        assert terms.node_selector_terms[0].match_fields[0].values == ["node-a"]
        time.sleep(3)  # no second replacement shows up later
        assert set(pods_named(core, namespace)) == {"web-r1"}

        # Second rejection (attempt 2 of maxAttempts 2), then a third: given up.
        reject(core, namespace, "web-r1", node="node-b")
        wait_for(lambda: set(pods_named(core, namespace)) == {"web-r2"}, 30, "web-r2")
        r2 = core.read_namespaced_pod("web-r2", namespace)
        avoid = r2.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        assert [f.values for f in avoid.node_selector_terms[0].match_fields] == [
            ["node-a"], ["node-b"]]
        reject(core, namespace, "web-r2", node="node-c")
        events = wait_for(lambda: [e for e in core.list_namespaced_event(namespace).items
                                   if e.reason == EVENT_REDEPLOY_GAVE_UP], 30, "RedeployGaveUp")
        assert "maxAttempts=2" in events[0].message
        time.sleep(2)
        assert set(pods_named(core, namespace)) == {"web-r2"}  # left Failed for inspection

        def exhausted() -> bool:
            obj = client.CustomObjectsApi(k8s_client).get_cluster_custom_object(
                "numalign.io", "v1alpha1", "topologypolicies", fast_policy)
            conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions", [])}
            c = conds.get("RedeployExhausted")
            return bool(c and c["status"] == "True")

        wait_for(exhausted, 30, "RedeployExhausted condition")
        st = _state(core, namespace)["pod-web"]
        assert st["attempts"] == 2 and len(st["gaveUp"]) == 1
        assert "Traceback" not in op.text()


def test_deployment_replacement_avoids_rejecting_node(kubeconfig: Path, k8s_client: Any,
                                                      core: client.CoreV1Api, namespace: str,
                                                      fast_policy: str, tmp_path: Path) -> None:
    apps = client.AppsV1Api(k8s_client)
    tmpl = bare_pod("x", labels={"app": "dep"})
    apps.create_namespaced_deployment(namespace, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "dep"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "dep"}},
                 "template": {"metadata": tmpl["metadata"], "spec": tmpl["spec"]}}})
    with operator(kubeconfig, k8s_client, tmp_path / "op.log") as op:
        first = wait_for(lambda: list(pods_named(core, namespace)), 60, "the Deployment's pod")[0]
        reject(core, namespace, first, node="node-a")

        def replacement() -> Any:
            ps = [p for n, p in pods_named(core, namespace).items() if n != first]
            return ps[0] if ps and first not in pods_named(core, namespace) else None

        # The ReplicaSet replaces the Failed pod at once; the operator deletes the failed one.
        new = wait_for(replacement, 60, "the ReplicaSet's replacement")
        assert len(pods_named(core, namespace)) == 1
        assert new.spec.affinity is not None, (op.text()[-5000:], new.metadata,
                                               core.read_namespaced_config_map(
                                                   "numalign-redeploy", namespace).data)
        aff = new.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution
        assert aff.node_selector_terms[0].match_fields[0].to_dict() == {
            "key": "metadata.name", "operator": "NotIn", "values": ["node-a"]}
        assert json.loads(new.metadata.annotations["numalign.io/resolved"])["policy"] == \
            "restricted"


@pytest.mark.parametrize("fault", ["after-record", "after-create"])
def test_crash_mid_redeploy_no_duplicate_no_loss(kubeconfig: Path, k8s_client: Any,
                                                 core: client.CoreV1Api, namespace: str,
                                                 fast_policy: str, tmp_path: Path,
                                                 fault: str) -> None:
    core.create_namespaced_pod(namespace, bare_pod("job", node="node-a"))
    with operator(kubeconfig, k8s_client, tmp_path / "op1.log",
                  fault=fault) as op:
        reject(core, namespace, "job")
        wait_for(lambda: not op.alive(), 30, "the injected crash")
    assert f"injected fault at {fault}: exiting" in op.text()
    pods = pods_named(core, namespace)
    assert "job" in pods  # the failed pod is only deleted after its replacement exists
    assert set(pods) <= {"job", "job-r1"}
    with operator(kubeconfig, k8s_client, tmp_path / "op2.log") as op2:
        wait_for(lambda: set(pods_named(core, namespace)) == {"job-r1"}, 30,
                 "the replayed decision")
        time.sleep(3)
        assert set(pods_named(core, namespace)) == {"job-r1"}
        st = _state(core, namespace)["pod-job"]
        assert st["attempts"] == 1 and len(st["handled"]) == 1
        assert "Traceback" not in op2.text()


def test_standby_takes_over(kubeconfig: Path, k8s_client: Any, core: client.CoreV1Api,
                            kubectl: Any, namespace: str, fast_policy: str,
                            tmp_path: Path) -> None:
    """A higher-priority replica pauses the standby; when it stops, the standby resumes.

    Kopf starts a replica with mandatory peering *paused* and logs only transitions: a
    standby that first sees the peering object after the active replica has written its
    record stays paused without ever logging "Pausing operations". So the standby must be
    running (resumed, alone in the peering) before the active replica starts. Each test
    gets its own ClusterKopfPeering, so that records of replicas from earlier tests (a
    killed replica's record stays for its 60 s lifetime) cannot pause this one.
    """
    config = Path(__file__).resolve().parents[2] / "config"
    kubectl("apply", "-f", str(config / "crd" / "kopf-peering.yaml"))
    name = f"numalign-{namespace}"[:63].rstrip("-")
    peering_obj = f"apiVersion: kopf.dev/v1\nkind: ClusterKopfPeering\nmetadata:\n  name: {name}\n"
    wait_for(lambda: kubectl("apply", "-f", "-", input=peering_obj,
                             check=False).returncode == 0, 30, "the ClusterKopfPeering")
    peering = ("--peering", name)
    try:
        with operator(kubeconfig, k8s_client, tmp_path / "b.log", *peering, "--priority",
                      "10", webhooks=False) as standby:
            try:
                wait_for(lambda: "Resuming operations after the pause" in standby.text(), 60,
                         "the standby to run alone")
            except AssertionError:
                raise AssertionError(standby.text()[-3000:]) from None
            with operator(kubeconfig, k8s_client, tmp_path / "a.log", *peering, "--priority",
                          "100", webhooks=False) as active:
                try:
                    wait_for(lambda: "Pausing operations in favour of" in standby.text(), 60,
                             "the standby to pause")
                except AssertionError:
                    raise AssertionError(standby.text()[-3000:] + active.text()[-3000:]) \
                        from None
                core.create_namespaced_pod(namespace, bare_pod("one", node="node-a"))
                reject(core, namespace, "one")
                wait_for(lambda: set(pods_named(core, namespace)) == {"one-r1"}, 30,
                         "the active replica's redeploy")
                active.stop(signal.SIGTERM)
            wait_for(lambda: standby.text().count("Resuming operations after the pause") >= 2,
                     60, "the standby to resume")
            reject(core, namespace, "one-r1", node="node-b")
            wait_for(lambda: set(pods_named(core, namespace)) == {"one-r2"}, 30,
                     "the standby's redeploy")
    finally:
        kubectl("delete", "--ignore-not-found", "--wait=false",
                f"clusterkopfpeering.kopf.dev/{name}", check=False)
