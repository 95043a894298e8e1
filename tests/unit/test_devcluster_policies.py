"""The dev cluster installs config/tenancy's admission policy as ``kubectl apply -k
config/default`` would: the parameter ConfigMap in the binding's namespace (created when
missing), the policy and the binding; a second ``up`` replaces them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from numalign.api.kube import ApiError
from numalign.devcluster.policies import (
    POLICY_FILES,
    PolicyError,
    install_policies,
    load_policies,
)

REPO = Path(__file__).resolve().parents[2]


class Api:
    """Just the SyncKube calls install_policies makes, on a dict of objects by path."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def get_quiet(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)

    def get(self, path: str) -> dict[str, Any]:
        return self.objects[path]

    def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        where = f"{path.partition('?')[0]}/{body['metadata']['name']}"
        if where in self.objects:
            raise ApiError(409, {"reason": "AlreadyExists", "message": "exists"})
        self.objects[where] = {**body, "metadata": {**body["metadata"],
                                                    "resourceVersion": "1"}}
        return self.objects[where]

    def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        where = path.partition("?")[0]
        assert body["metadata"]["resourceVersion"] == self.objects[where]["metadata"][
            "resourceVersion"]
        self.objects[where] = body
        return body


def test_the_files_are_config_tenancys() -> None:
    assert POLICY_FILES == (REPO / "config" / "tenancy" / "pod_annotations.yaml",
                            REPO / "config" / "tenancy" / "resolved_at_creation.yaml")
    kinds = sorted(d["kind"] for d in load_policies())
    assert kinds == ["ConfigMap", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
                     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]


def test_installs_the_parameter_in_the_bindings_namespace_and_replaces_on_reuse() -> None:
    api = Api()
    assert install_policies(api) == [  # type: ignore[arg-type]
        "numalign-pod-annotations", "numalign-resolved-at-creation"]
    assert set(api.objects) == {
        "/api/v1/namespaces/numalign-system",
        "/api/v1/namespaces/numalign-system/configmaps/numalign-pod-annotations",
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/"
        "numalign-pod-annotations",
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/"
        "numalign-pod-annotations",
        "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies/"
        "numalign-resolved-at-creation",
        "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings/"
        "numalign-resolved-at-creation"}
    mutating = api.objects["/apis/admissionregistration.k8s.io/v1/"
                           "mutatingadmissionpolicybindings/numalign-resolved-at-creation"]
    assert mutating["spec"]["paramRef"]["namespace"] == "numalign-system"
    cm = api.objects["/api/v1/namespaces/numalign-system/configmaps/numalign-pod-annotations"]
    assert cm["metadata"]["namespace"] == "numalign-system"
    assert cm["data"]["trusted-groups"] == "system:masters"
    binding = api.objects["/apis/admissionregistration.k8s.io/v1/"
                          "validatingadmissionpolicybindings/numalign-pod-annotations"]
    assert binding["spec"]["paramRef"]["namespace"] == "numalign-system"
    install_policies(api)  # type: ignore[arg-type]
    assert len(api.objects) == 6


def test_a_kind_it_does_not_install_is_an_error(tmp_path: Path) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Secret",
                                   "metadata": {"name": "s"}}))
    with pytest.raises(PolicyError, match="Secret s: not a kind the dev cluster installs"):
        install_policies(Api(), (bad,))  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match="cannot read"):
        load_policies((tmp_path / "missing.yaml",))
