"""The numa-constraint webhook (numalign.controller.claims): a claim generated for a
single-numa-node pod gets a matchAttribute on the NUMA attribute over its requests;
others are left as they came; errors fail open."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest

from fake_kube import FakeKube
from numalign.api.kube import ApiError
from numalign.api.names import ANN_RESOLVED
from numalign.api.resolved import Resolved
from numalign.controller import claims, connection, webhookconfig

PODS = "/api/v1/namespaces/team/pods"


def claim(owner: str | None = "p", constraints: list[Any] | None = None,
          requests: tuple[str, ...] = ("gpu", "nic")) -> dict[str, Any]:
    meta: dict[str, Any] = {"generateName": "p-gpus-", "namespace": "team",
                            "annotations": {claims.POD_CLAIM_ANNOTATION: "gpus"}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner,
                                    "uid": "u", "controller": True}]
    devices: dict[str, Any] = {"requests": [
        {"name": r, "exactly": {"deviceClassName": "c"}} for r in requests]}
    if constraints is not None:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": devices}}


def run(body: dict[str, Any], kube: FakeKube, monkeypatch: pytest.MonkeyPatch
        ) -> dict[str, Any]:
    monkeypatch.setattr(connection, "client", lambda: kube)
    patch = kopf.Patch()
    asyncio.run(claims.mutate_claim(body=kopf.Body(body), patch=patch,
                                    logger=logging.getLogger("test")))
    return dict(patch)


def pod(policy: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "team", "annotations": {
        ANN_RESOLVED: Resolved(policy, "container", source="pod").annotation()}}}


def test_a_single_numa_node_pods_claim_gets_one_numa_node_over_its_requests(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    kube.add(PODS, pod("single-numa-node"))
    body = claim()
    patch = run(body, kube, monkeypatch)
    assert patch["spec"]["devices"]["constraints"] == [
        {"requests": ["gpu", "nic"], "matchAttribute": "resource.kubernetes.io/numaNode"}]
    # the requests go along unchanged: the JSON patch only adds the constraints
    ops = kopf.Patch(patch).as_json_patch(kopf.Body(body))
    assert ops == [{"op": "add", "path": "/spec/devices/constraints", "value": [
        {"requests": ["gpu", "nic"], "matchAttribute": "resource.kubernetes.io/numaNode"}]}]


@pytest.mark.parametrize("policy", ["restricted", "best-effort", "none"])
def test_other_policies_are_left_alone(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    kube.add(PODS, pod(policy))
    assert run(claim(), kube, monkeypatch) == {}


def test_claims_with_constraints_shared_claims_and_unknown_pods_are_left_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    kube.add(PODS, pod("single-numa-node"))
    own = [{"matchAttribute": "emulated.numalign.io/nvlink"}]
    assert run(claim(constraints=own), kube, monkeypatch) == {}
    assert run(claim(owner=None), kube, monkeypatch) == {}  # shared by name: no owner
    assert run(claim(requests=()), kube, monkeypatch) == {}
    assert run(claim(owner="gone"), kube, monkeypatch) == {}  # the pod is not found


def test_an_api_error_fails_open(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()

    def refuse(method: str, path: str, body: Any) -> ApiError:
        return ApiError(500, {"message": "etcd down"}, method, path)

    async def broken(path: str, params: Any = None) -> dict[str, Any]:
        raise refuse("GET", path, None)

    monkeypatch.setattr(kube, "get", broken)
    assert run(claim(), kube, monkeypatch) == {}


def test_the_webhook_is_registered_for_claim_creation_and_fails_open() -> None:
    [hook] = [h for h in webhookconfig.webhooks(True, "https://x:1", b"ca", ["kube-system"])
              if h["name"] == "numa-constraint.numalign.io"]
    assert hook["rules"] == [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                              "resources": ["resourceclaims"], "operations": ["CREATE"],
                              "scope": "Namespaced"}]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["clientConfig"]["url"] == "https://x:1/numa-constraint"
