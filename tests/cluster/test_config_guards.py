"""config/tenancy on a real API server, where the pod-annotation guard has no webhook to
lean on: a Binding (pods/binding, or the older bindings resource) cannot set what
numalign trusts on a pod for anyone who may create one, and a tenant's own
numalign.io/resolved is refused at creation while the operator's webhook, which fails
open, is unreachable (the mutating policy numalign-resolved-at-creation marks it before
the webhooks run, the validating policy refuses the mark). With the webhook answering,
pods it resolves are still created.

Identities are played by impersonation: a namespace editor (role ``edit``) and a second
scheduler (``create`` on pods/binding and bindings, nothing else)."""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from numalign.api.names import ANN_ALLOCATION, ANN_REJECTION, ANN_RESOLVED, ANN_TOLERATE_UNPLACED
from numalign.controller import webhookconfig, webhooks
from operator_helpers import delete_webhooks, operator

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
TENANCY = REPO / "config" / "tenancy"
NS = "numalign-system"
GUARD = "ValidatingAdmissionPolicy 'numalign-pod-annotations'"
MARKER = "numalign-resolved-at-creation"
CREATOR_MARK = "numalign.io/resolved-set-by-creator"
Kubectl = Callable[..., subprocess.CompletedProcess[str]]
VALUES = {ANN_RESOLVED: '{"policy":"none","scope":"container","source":"pod"}',
          ANN_ALLOCATION: '{"numaNodes":[0],"containers":{"c":{"cpus":"1-7"}}}',
          ANN_REJECTION: "forged", ANN_TOLERATE_UNPLACED: "true", CREATOR_MARK: "true"}


def _rendered_tenancy(kubectl: Kubectl, tmp: Path) -> str:
    """config/tenancy as config/default renders it: in numalign's namespace."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": NS, "resources": [os.path.relpath(TENANCY, tmp)]}))
    return kubectl("kustomize", str(tmp)).stdout


@pytest.fixture(scope="module")
def tenancy(kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """config/tenancy installed whole (the dev cluster installs its validating policy
    itself; the mutating one is removed afterwards)."""
    kubectl("apply", "-f", "-", input=_rendered_tenancy(
        kubectl, tmp_path_factory.mktemp("tenancy")))
    try:
        yield
    finally:
        kubectl("delete", "--ignore-not-found", "mutatingadmissionpolicybinding/" + MARKER,
                "mutatingadmissionpolicy/" + MARKER, check=False)


@pytest.fixture(scope="module")
def impersonate(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Callable[[str], str]:
    """The path of a kubeconfig acting as ``user`` (no groups but authenticated)."""
    base = yaml.safe_load(kubeconfig.read_text())
    out = tmp_path_factory.mktemp("as")

    def make(user: str) -> str:
        kc = json.loads(json.dumps(base))
        kc["users"][0]["user"].update({"as": user, "as-groups": ["system:authenticated"]})
        path = out / f"{user}.kubeconfig"
        path.write_text(yaml.safe_dump(kc))
        path.chmod(0o600)
        return str(path)

    return make


def _pod(name: str, annotations: dict[str, str] | None = None) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": name, "annotations": annotations or {}}, "spec": {
        "containers": [{"name": "c", "image": "registry.example/none:1"}],
        # Keep the session's scheduler away: the tests bind the pods themselves.
        "nodeSelector": {"numalign.io/test-never": "true"}}})


def _binding(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "annotations": annotations or {}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "cfg-guard-node"}}


def _denied(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode != 0, f"expected a refusal, got:\n{proc.stdout}"
    text = proc.stderr + proc.stdout
    for f in (GUARD, *fragments):
        assert f in text, text


def _get_pod(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    pod: dict[str, Any] = json.loads(kubectl("get", "-n", namespace, f"pod/{name}",
                                             "-o", "json").stdout)
    return pod


@pytest.fixture
def scheduler2(kubectl: Kubectl, impersonate: Callable[[str], str], namespace: str) -> str:
    """A second scheduler: it may create Bindings in the namespace and nothing else."""
    user = f"scheduler2-{uuid.uuid4().hex[:6]}"
    kubectl("create", "role", "binder", "-n", namespace, "--verb=create",
            "--resource=pods/binding,bindings")
    kubectl("create", "rolebinding", "binder", "-n", namespace, "--role=binder",
            f"--user={user}")
    return impersonate(user)


def test_a_binding_cannot_set_what_numalign_trusts(
        tenancy: None, kubectl: Kubectl, scheduler2: str, namespace: str,
        tmp_path: Path) -> None:
    """Whoever may bind pods may bind them, but a Binding that carries one of numalign's
    guarded annotations is refused (through pods/<name>/binding and through the older
    bindings resource), naming the annotation; the pod keeps what it had."""
    kubectl("create", "-n", namespace, "-f", "-", input=_pod("p"))
    for ann in (ANN_ALLOCATION, ANN_REJECTION, ANN_RESOLVED, CREATOR_MARK):
        body = tmp_path / "binding.json"
        body.write_text(json.dumps(_binding("p", {ann: VALUES[ann]})))
        _denied(kubectl("--kubeconfig", scheduler2, "create", "--raw",
                        f"/api/v1/namespaces/{namespace}/pods/p/binding", "-f", str(body),
                        check=False),
                f"may set, change or remove {ann} on a pod (in its Binding p)")
        _denied(kubectl("--kubeconfig", scheduler2, "create", "--validate=false", "-n",
                        namespace, "-f", "-", input=json.dumps(_binding("p", {ann: VALUES[ann]})),
                        check=False), ann)
    # numalign.io/tolerate-unplaced: only in the namespaces the admin lists.
    _denied(kubectl("--kubeconfig", scheduler2, "create", "--validate=false", "-n", namespace,
                    "-f", "-", input=json.dumps(_binding("p", {ANN_TOLERATE_UNPLACED: "true"})),
                    check=False),
            f"{ANN_TOLERATE_UNPLACED} is allowed only on pods in the namespaces")
    pod = _get_pod(kubectl, namespace, "p")
    assert not pod["spec"].get("nodeName")
    assert not set(pod["metadata"].get("annotations") or {}) & set(VALUES)
    # A Binding without them binds, with its other annotations.
    body = tmp_path / "plain.json"
    body.write_text(json.dumps(_binding("p", {"example.com/placed-by": "scheduler2"})))
    kubectl("--kubeconfig", scheduler2, "create", "--raw",
            f"/api/v1/namespaces/{namespace}/pods/p/binding", "-f", str(body))
    pod = _get_pod(kubectl, namespace, "p")
    assert pod["spec"]["nodeName"] == "cfg-guard-node"
    assert pod["metadata"]["annotations"]["example.com/placed-by"] == "scheduler2"
    # The legacy resource, likewise.
    kubectl("create", "-n", namespace, "-f", "-", input=_pod("q"))
    kubectl("--kubeconfig", scheduler2, "create", "--validate=false", "-n", namespace,
            "-f", "-", input=json.dumps(_binding("q")))
    assert _get_pod(kubectl, namespace, "q")["spec"]["nodeName"] == "cfg-guard-node"
    # numalign's trusted identities (here a cluster admin) still may.
    kubectl("create", "-n", namespace, "-f", "-", input=_pod("r"))
    kubectl("create", "-n", namespace, "-f", "-",
            input=json.dumps(_binding("r", {ANN_ALLOCATION: VALUES[ANN_ALLOCATION]})))
    assert _get_pod(kubectl, namespace, "r")["metadata"]["annotations"][
        ANN_ALLOCATION] == VALUES[ANN_ALLOCATION]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def webhook_unreachable(k8s_client: Any) -> Iterator[None]:
    """The webhook configurations as a stopped operator leaves them: every webhook, as
    the operator writes it (failurePolicy Ignore), calling a port nobody listens on."""
    ca, _ = webhooks.make_ca(dt.datetime.now(dt.UTC))
    target = f"https://127.0.0.1:{_closed_port()}"
    adm = client.AdmissionregistrationV1Api(k8s_client)
    delete_webhooks(k8s_client)
    for mutating in (True, False):
        body: dict[str, Any] = {"metadata": {"name": webhookconfig.NAME},
                "webhooks": webhookconfig.webhooks(mutating, target, ca, ["kube-system", NS])}
        if mutating:
            adm.create_mutating_webhook_configuration(body)
        else:
            adm.create_validating_webhook_configuration(body)
    try:
        yield
    finally:
        delete_webhooks(k8s_client)


def test_a_tenants_own_resolved_is_refused_with_the_webhook_unreachable(
        tenancy: None, webhook_unreachable: None, kubectl: Kubectl,
        impersonate: Callable[[str], str], namespace: str,
        wait: Callable[..., Any]) -> None:
    user = f"editor-{uuid.uuid4().hex[:6]}"
    kubectl("create", "rolebinding", "editor", "--clusterrole=edit", f"--user={user}",
            "-n", namespace)
    editor = impersonate(user)
    forged = _pod("forged", {ANN_RESOLVED: VALUES[ANN_RESOLVED]})

    def refused() -> subprocess.CompletedProcess[str] | None:
        proc = kubectl("--kubeconfig", editor, "create", "-n", namespace, "-f", "-",
                       input=forged, check=False)
        if proc.returncode == 0:  # the API server has not loaded the policy yet
            kubectl("delete", "-n", namespace, "pod/forged", "--wait=false")
            return None
        return proc

    # The API server picks up new admission policies through a watch: within seconds.
    proc = wait(refused, 30, "the mutating policy to take effect")
    _denied(proc, f"may set, change or remove {ANN_RESOLVED} on a pod, not {user}")
    assert CREATOR_MARK not in proc.stderr, "the refusal names the mark, not the annotation"
    # The mark itself is numalign's too.
    _denied(kubectl("--kubeconfig", editor, "create", "-n", namespace, "-f", "-",
                    input=_pod("marked", {CREATOR_MARK: "true"}), check=False), CREATOR_MARK)
    # Fail open for everything else: a plain pod is created, unresolved and unmarked.
    kubectl("--kubeconfig", editor, "create", "-n", namespace, "-f", "-", input=_pod("plain"))
    ann = _get_pod(kubectl, namespace, "plain")["metadata"].get("annotations") or {}
    assert ANN_RESOLVED not in ann and CREATOR_MARK not in ann
    # numalign's trusted identities (a cluster admin here) still create resolved pods.
    kubectl("create", "-n", namespace, "-f", "-", input=forged)
    ann = _get_pod(kubectl, namespace, "forged")["metadata"]["annotations"]
    assert ann[ANN_RESOLVED] == VALUES[ANN_RESOLVED] and CREATOR_MARK not in ann


def test_the_webhooks_resolved_is_not_taken_for_the_tenants(
        tenancy: None, kubectl: Kubectl, kubeconfig: Path, k8s_client: Any,
        impersonate: Callable[[str], str], namespace: str, tmp_path: Path,
        wait: Callable[..., Any]) -> None:
    """With the operator up, the mutating policy (which runs before the webhook) leaves a
    tenant's pod alone: the webhook's numalign.io/resolved is accepted."""
    user = f"editor-{uuid.uuid4().hex[:6]}"
    kubectl("create", "rolebinding", "editor", "--clusterrole=edit", f"--user={user}",
            "-n", namespace)
    editor = impersonate(user)
    wait(lambda: kubectl("get", "mutatingadmissionpolicybinding", MARKER,
                         check=False).returncode == 0, 10, "the mutating policy")
    with operator(kubeconfig, k8s_client, tmp_path / "operator.log"):
        kubectl("--kubeconfig", editor, "create", "-n", namespace, "-f", "-",
                input=_pod("plain"))
        forged = kubectl("--kubeconfig", editor, "create", "-n", namespace, "-f", "-",
                         input=_pod("forged", {ANN_RESOLVED: VALUES[ANN_RESOLVED]}),
                         check=False)
    ann = _get_pod(kubectl, namespace, "plain")["metadata"]["annotations"]
    assert json.loads(ann[ANN_RESOLVED])["source"]
    assert CREATOR_MARK not in ann
    assert forged.returncode != 0 and f"{ANN_RESOLVED} is numalign's" in forged.stderr, \
        forged.stderr
