"""The admission policies of ``config/`` that a dev cluster applies as a cluster would:
``config/tenancy`` (numalign's pod annotations, trusted writers only, and the mark on a
pod whose untrusted creator brought its own ``numalign.io/resolved``). The dev cluster's
operator and agents run with the admin's credentials (group ``system:masters``), which
the policy's parameter lists as trusted, so they work under it unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from ..api.kube import ApiError, SyncKube
from .crds import create_or_replace

CONFIG = Path(__file__).resolve().parents[3] / "config"
POLICY_FILES = (CONFIG / "tenancy" / "pod_annotations.yaml",
                CONFIG / "tenancy" / "resolved_at_creation.yaml")
# config/default's namespace (its kustomization fills the files' namespace references).
NAMESPACE = "numalign-system"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
_COLLECTIONS = {
    "ValidatingAdmissionPolicy": f"{ADMISSION}/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": f"{ADMISSION}/validatingadmissionpolicybindings",
    "MutatingAdmissionPolicy": f"{ADMISSION}/mutatingadmissionpolicies",
    "MutatingAdmissionPolicyBinding": f"{ADMISSION}/mutatingadmissionpolicybindings",
}
_BINDINGS = ("ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicyBinding")


class PolicyError(RuntimeError):
    pass


def load_policies(files: tuple[Path, ...] = POLICY_FILES) -> list[dict[str, Any]]:
    """The objects of the policy files: policies, bindings and their parameters."""
    docs: list[dict[str, Any]] = []
    for path in files:
        try:
            text = path.read_text()
        except OSError as e:
            raise PolicyError(f"cannot read {path}: {e}") from e
        docs += [d for d in yaml.safe_load_all(text) if isinstance(d, dict)]
    return docs


def _in_namespace(doc: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The object as kustomize's namespace transformer leaves it: a ConfigMap in the
    namespace, a binding's parameter looked up there."""
    kind = doc.get("kind")
    if kind == "ConfigMap":
        return {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    spec = doc.get("spec") or {}
    if kind in _BINDINGS and isinstance(spec.get("paramRef"), dict):
        return {**doc, "spec": {**spec, "paramRef": {**spec["paramRef"],
                                                     "namespace": namespace}}}
    return doc


def install_policies(kube: SyncKube, files: tuple[Path, ...] = POLICY_FILES,
                     namespace: str = NAMESPACE) -> list[str]:
    """Create or update each object (parameters in ``namespace``, created when
    missing); returns the policy names."""
    docs = [_in_namespace(d, namespace) for d in load_policies(files)]
    try:
        if kube.get_quiet(f"/api/v1/namespaces/{quote(namespace)}") is None:
            kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                               "metadata": {"name": namespace}})
        for doc in docs:
            kind = str(doc.get("kind"))
            collection = _COLLECTIONS.get(kind)
            if collection is None and kind == "ConfigMap":
                collection = f"/api/v1/namespaces/{quote(namespace)}/configmaps"
            if collection is None:
                raise PolicyError(f"{kind} {doc.get('metadata', {}).get('name')}: not a kind "
                                  "the dev cluster installs")
            create_or_replace(kube, collection, doc)
    except ApiError as e:
        raise PolicyError(f"installing the admission policies: HTTP {e.status}: "
                          f"{e.message}") from e
    return [str(d["metadata"]["name"]) for d in docs
            if d.get("kind") in ("ValidatingAdmissionPolicy", "MutatingAdmissionPolicy")]
