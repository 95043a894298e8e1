"""The replacement of a rejected pod with ResourceClaims: the same claims in its spec (a
template's claim is generated afresh for it, a shared one is reused), none of the
rejected pod's generated claims, and nothing that names them."""

from __future__ import annotations

from typing import Any

from numalign.controller.redeploy import build_replacement


def test_a_replacement_keeps_its_claims_by_template_and_by_name() -> None:
    claims = [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"},
              {"name": "team", "resourceClaimName": "team-gpus"}]
    pod: dict[str, Any] = {"metadata": {"name": "train", "namespace": "ns", "uid": "u",
                        "annotations": {"numalign.io/allocation": "{}"}},
           "spec": {"nodeName": "n1", "resourceClaims": claims,
                    "containers": [{"name": "c", "resources": {"claims": [
                        {"name": "gpus"}, {"name": "team"}]}}]},
           "status": {"phase": "Failed", "reason": "TopologyAffinityError",
                      "resourceClaimStatuses": [
                          {"name": "gpus", "resourceClaimName": "train-gpus-x1"}]}}
    new = build_replacement(pod, "train-r1", [])
    assert new["spec"]["resourceClaims"] == claims
    assert new["spec"]["containers"] == pod["spec"]["containers"]
    # the generated claim's name belongs to the rejected pod: nothing carries it over
    assert "train-gpus-x1" not in repr(new)
    assert "numalign.io/allocation" not in new["metadata"]["annotations"]
