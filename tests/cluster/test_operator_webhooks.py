"""The webhook configurations the operator writes survive a replica stopping (Kopf used
to strip them on shutdown), skip system namespaces and answer within seconds."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from operator_helpers import bare_pod, delete_webhooks, operator, wait_for, webhook_answers

pytestmark = pytest.mark.cluster


def _hooks(api: Any) -> dict[str, dict[str, Any]]:
    adm = client.AdmissionregistrationV1Api(api)
    out: dict[str, dict[str, Any]] = {}
    for obj in (adm.read_mutating_webhook_configuration("numalign.io"),
                adm.read_validating_webhook_configuration("numalign.io")):
        for w in api.sanitize_for_serialization(obj).get("webhooks") or []:
            out[w["name"]] = w
    return out


def test_webhooks_stay_when_a_replica_stops_and_skip_system_namespaces(
        kubeconfig: Path, k8s_client: Any, tmp_path: Path) -> None:
    own = f"numalign-{uuid.uuid4().hex[:6]}"
    core = client.CoreV1Api(k8s_client)
    core.create_namespace({"metadata": {"name": own}})
    try:
        with operator(kubeconfig, k8s_client, tmp_path / "a.log",
                      "--webhook-exclude-namespace", own) as first:
            before = _hooks(k8s_client)
            assert set(before) == {"resolve.numalign.io", "overrides.numalign.io",
                                   "policy-overlaps.numalign.io",
                                   "numa-constraint.numalign.io"}
            for w in before.values():
                assert w["timeoutSeconds"] <= 5 and w["failurePolicy"] == "Ignore"
                [expr] = w["namespaceSelector"]["matchExpressions"]
                assert set(expr["values"]) == {"kube-system", own}
            # Excluded namespaces are not resolved by the webhook (dry run).
            pod = core.create_namespaced_pod(own, bare_pod("probe"), dry_run="All")
            assert "numalign.io/resolved" not in (pod.metadata.annotations or {})
            assert first.stop() == 0, first.text()[-4000:]
            # The replica is gone; its webhooks are not.
            assert _hooks(k8s_client) == before
            # A second replica (the standby taking over) serves the same configuration.
            with operator(kubeconfig, k8s_client, tmp_path / "b.log",
                          "--webhook-exclude-namespace", own) as second:
                wait_for(lambda: webhook_answers(k8s_client), 30, "the webhook to answer")
                assert set(_hooks(k8s_client)) == set(before)
                second.stop()
                assert set(_hooks(k8s_client)) == set(before)
    finally:
        delete_webhooks(k8s_client)
        core.delete_namespace(own)
