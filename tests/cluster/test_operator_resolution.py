"""The operator against a real API server: resolution, webhooks, validation, status."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from numalign.api.names import EVENT_INVALID_OVERRIDE
from operator_helpers import (
    OperatorProcess,
    bare_pod,
    delete_policy,
    operator,
    policy,
    resolved,
    wait_for,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def running_operator(kubeconfig: Path, k8s_client: Any,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    log = tmp_path_factory.mktemp("operator") / "operator.log"
    with operator(kubeconfig, k8s_client, log) as op:
        yield op
        assert op.alive(), op.text()[-4000:]
        assert "Traceback" not in op.text(), op.text()[-6000:]


@pytest.fixture
def core(k8s_client: Any) -> client.CoreV1Api:
    return client.CoreV1Api(k8s_client)


@pytest.fixture
def two_namespaces(core: client.CoreV1Api) -> Iterator[tuple[str, str]]:
    suffix = uuid.uuid4().hex[:6]
    names = (f"ml-{suffix}", f"batch-{suffix}")
    for n in names:
        core.create_namespace({"metadata": {"name": n}})
    yield names
    for n in names:
        core.delete_namespace(n)


def test_namespace_policies_and_override(running_operator: OperatorProcess, k8s_client: Any,
                                         core: client.CoreV1Api,
                                         two_namespaces: tuple[str, str]) -> None:
    ml, batch = two_namespaces
    names = (f"tp-{ml}", f"tp-{batch}")
    policy(k8s_client, names[0], {"policy": "single-numa-node", "scope": "pod",
                                  "namespaces": [ml]}, seen=True)
    policy(k8s_client, names[1], {"policy": "best-effort", "namespaces": [batch],
                                  "podOverrides": {"allowed": True,
                                                   "policies": ["restricted"]}}, seen=True)
    try:
        core.create_namespaced_pod(ml, bare_pod("train"))
        core.create_namespaced_pod(batch, bare_pod("job"))
        core.create_namespaced_pod(batch, bare_pod(
            "rt", annotations={"numalign.io/policy": "restricted"}))
        assert resolved(core, ml, "train") == {
            "policy": "single-numa-node", "scope": "pod", "options": {},
            "source": f"TopologyPolicy/{names[0]}"}
        assert resolved(core, batch, "job") == {
            "policy": "best-effort", "scope": "container", "options": {},
            "source": f"TopologyPolicy/{names[1]}"}
        assert resolved(core, batch, "rt") == {
            "policy": "restricted", "scope": "container", "options": {}, "source": "pod"}

        # An override the policy does not allow is refused at creation, naming the values.
        with pytest.raises(ApiException) as err:
            core.create_namespaced_pod(batch, bare_pod(
                "bad", annotations={"numalign.io/policy": "single-numa-node"}))
        assert err.value.status in (400, 422)
        assert "allowed values: restricted" in str(err.value.body)
        with pytest.raises(ApiException) as err:
            core.create_namespaced_pod(batch, bare_pod(
                "bad2", annotations={"numalign.io/scope": "rack"}))
        assert "allowed values: container, pod" in str(err.value.body)

        # Status: Valid, not Conflicting, matched namespaces.
        def status() -> dict[str, Any] | None:
            obj = client.CustomObjectsApi(k8s_client).get_cluster_custom_object(
                "numalign.io", "v1alpha1", "topologypolicies", names[0])
            st: dict[str, Any] | None = obj.get("status")
            return st if st and st.get("observedGeneration") == 1 else None

        st = wait_for(status, 30, "TopologyPolicy status")
        conds = {c["type"]: c["status"] for c in st["conditions"]}
        assert conds["Valid"] == "True" and conds["Conflicting"] == "False"
        assert st["matchedNamespaces"] == [ml]
    finally:
        for n in names:
            delete_policy(k8s_client, n)


def test_unbound_pod_without_policy_defers_to_node(running_operator: OperatorProcess,
                                                   core: client.CoreV1Api,
                                                   namespace: str) -> None:
    core.create_namespaced_pod(namespace, bare_pod("free"))
    assert resolved(core, namespace, "free") == {
        "policy": None, "scope": None, "options": {}, "source": "node-default"}


def test_malformed_annotations_never_crash(running_operator: OperatorProcess,
                                           core: client.CoreV1Api, namespace: str,
                                           kubectl: Any) -> None:
    # Annotations written after creation (no webhook on UPDATE): the backstop fixes them.
    core.create_namespaced_pod(namespace, bare_pod("odd"))
    core.patch_namespaced_pod("odd", namespace, {"metadata": {"annotations": {
        "numalign.io/resolved": "{not json", "numalign.io/policy": "\u2603" * 50}}})
    got = wait_for(lambda: resolved(core, namespace, "odd"), 30, "the backstop's resolution")
    assert got["source"] == "node-default"
    events = wait_for(lambda: [e for e in core.list_namespaced_event(namespace).items
                               if e.reason == EVENT_INVALID_OVERRIDE], 30, "a Warning event")
    assert "numalign.io/policy" in events[0].message
    assert running_operator.alive()


def test_conflicting_policy_refused_by_webhook(running_operator: OperatorProcess,
                                               k8s_client: Any, namespace: str) -> None:
    a, b = f"a-{namespace}"[:60], f"b-{namespace}"[:60]
    policy(k8s_client, a, {"policy": "restricted", "namespaces": [namespace], "priority": 3})
    try:
        with pytest.raises(ApiException) as err:
            policy(k8s_client, b, {"policy": "best-effort", "namespaces": [namespace],
                                   "priority": 3})
        assert "would conflict with" in str(err.value.body)
        policy(k8s_client, b, {"policy": "best-effort", "namespaces": [namespace],
                               "priority": 4})
    finally:
        delete_policy(k8s_client, a)
        delete_policy(k8s_client, b)


@pytest.mark.parametrize("spec,field", [
    ({"policy": "always"}, "spec.policy"),
    ({"policy": "none", "priority": -1}, "spec.priority"),
    ({"policy": "none", "options": {"bogus": True}}, "bogus"),
])
def test_bad_policy_refused_by_api_server(kubectl: Any, spec: dict[str, Any],
                                          field: str) -> None:
    import json

    doc = {"apiVersion": "numalign.io/v1alpha1", "kind": "TopologyPolicy",
           "metadata": {"name": f"bad-{uuid.uuid4().hex[:6]}"}, "spec": spec}
    proc = kubectl("create", "-f", "-", input=json.dumps(doc), check=False)
    assert proc.returncode != 0
    assert field in proc.stderr, proc.stderr
