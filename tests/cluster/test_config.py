"""config/ installs on a real API server, and the agent's identity is confined to its node.

The install follows config/README.md: ``kubectl apply -k config/crd``, wait until the CRDs
are Established, create the namespace, then ``kubectl apply -k config/default`` (server-side
dry run first). No kubelet runs, so the pods stay Pending: that is fine here. The agent is
played by impersonating its ServiceAccount with the node-name extra the API server puts
into a pod-bound token's user info.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from admission_objects import (
    event_v1_yaml,
    event_yaml,
    forged_value,
    new_node_name,
    nodetopology_yaml,
    pod_yaml,
    status_patch,
)
from numalign.api.names import (
    ANN_ALLOCATION,
    ANN_REDEPLOY_OF,
    ANN_REDEPLOY_OF_UID,
    ANN_REJECTION,
    ANN_RESOLVED,
    ANN_TOLERATE_UNPLACED,
    REDEPLOY_GATE,
    REJECT_REASON,
)
from numalign.devcluster.policies import load_policies
from operator_helpers import operator

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
NS = "numalign-system"
AGENT = f"system:serviceaccount:{NS}:numalign-agent"
OPERATOR = f"system:serviceaccount:{NS}:numalign-operator"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
POLICY = "numalign-agent-node-restriction"
Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class Install:
    dry_run: subprocess.CompletedProcess[str]
    apply: subprocess.CompletedProcess[str]


def _rendered(kubectl: Kubectl, path: Path) -> list[dict[str, Any]]:
    out = kubectl("kustomize", str(path)).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def installed(kubectl: Kubectl) -> Iterator[Install]:
    kubectl("apply", "-k", str(CONFIG / "crd"))
    crds = [f"crd/{o['metadata']['name']}" for o in _rendered(kubectl, CONFIG / "crd")]
    kubectl("wait", "--for=condition=Established", "--timeout=60s", *crds)
    # A server-side dry run persists nothing, not even the Namespace the rest goes into.
    kubectl("apply", "-f", str(CONFIG / "default" / "namespace.yaml"))
    dry_run = kubectl("apply", "-k", str(CONFIG / "default"), "--dry-run=server")
    apply = kubectl("apply", "-k", str(CONFIG / "default"))
    try:
        yield Install(dry_run, apply)
    finally:
        # Remove everything but the CRDs and what the dev cluster installs itself (its
        # namespace, the pod-annotation policy): other tests of the session use them.
        keep = {"CustomResourceDefinition", "Namespace"}
        own = {(o["kind"], o["metadata"]["name"]) for o in load_policies()}
        objs = [o for o in _rendered(kubectl, CONFIG / "default")
                if o["kind"] not in keep and (o["kind"], o["metadata"]["name"]) not in own]
        kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-",
                input=yaml.safe_dump_all(objs), check=False)


@pytest.fixture(scope="module")
def impersonate(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Callable[..., Path]:
    """A kubeconfig acting as ``user`` (groups of a ServiceAccount) with ``extra``."""
    base = yaml.safe_load(kubeconfig.read_text())
    out_dir = tmp_path_factory.mktemp("impersonate")

    def make(user: str, extra: dict[str, list[str]] | None = None,
             groups: list[str] | None = None) -> Path:
        kc = json.loads(json.dumps(base))
        auth = kc["users"][0]["user"]
        auth["as"] = user
        if groups is None:
            ns = user.split(":")[2]
            groups = ["system:serviceaccounts", f"system:serviceaccounts:{ns}"]
        auth["as-groups"] = [*groups, "system:authenticated"]
        if extra:
            auth["as-user-extra"] = extra
        path = out_dir / f"{uuid.uuid4().hex[:8]}.kubeconfig"
        path.write_text(yaml.safe_dump(kc))
        path.chmod(0o600)
        return path

    return make


def _refused(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode != 0, f"expected a refusal, got:\n{proc.stdout}"
    assert "Forbidden" in proc.stderr or "forbidden" in proc.stderr, proc.stderr
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in proc.stderr, proc.stderr
    for f in fragments:
        assert f in proc.stderr, proc.stderr


def test_default_installs_with_dry_run_and_for_real(installed: Install,
                                                    kubectl: Kubectl) -> None:
    dry = installed.dry_run.stdout.splitlines()
    assert dry and all(line.endswith("(server dry run)") for line in dry), dry
    for what in ("statefulset.apps/numalign-operator", "daemonset.apps/numalign-agent",
                 "service/numalign-webhook", "service/numalign-operator",
                 f"validatingadmissionpolicy.admissionregistration.k8s.io/{POLICY}",
                 "clusterkopfpeering.kopf.dev/numalign"):
        assert what in installed.apply.stdout
    sts = json.loads(kubectl("get", "-n", NS, "statefulset/numalign-operator",
                             "-o", "json").stdout)
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "ghcr.io/numalign/numalign:0.1.0")
    # The policies' CEL type-checks against the API server's schemas.
    for name in (POLICY, "numalign-agent-events", "numalign-agent-lease",
                 "numalign-operator-restriction", "numalign-pod-annotations"):
        vap = json.loads(kubectl("get", f"validatingadmissionpolicy/{name}", "-o",
                                 "json").stdout)
        warnings = ((vap.get("status") or {}).get("typeChecking") or {}).get(
            "expressionWarnings")
        assert not warnings, (name, warnings)
    # Applying again succeeds, and what is installed is what config/default says.
    kubectl("apply", "-k", str(CONFIG / "default"))
    diff = kubectl("diff", "-k", str(CONFIG / "default"), check=False)
    assert diff.returncode == 0, f"kubectl diff -k config/default:\n{diff.stdout}{diff.stderr}"


def test_rbac_grants_each_identity_its_half(installed: Install, kubectl: Kubectl) -> None:
    def can(user: str, verb: str, resource: str, *extra: str) -> bool:
        proc = kubectl("auth", "can-i", verb, resource, f"--as={user}", *extra, check=False)
        return proc.stdout.strip() == "yes"

    assert can(AGENT, "create", "nodetopologies.numalign.io")
    assert can(AGENT, "patch", "nodetopologies.numalign.io", "--subresource=status")
    assert not can(AGENT, "patch", "nodetopologies.numalign.io")
    # A real node's agent: no pods, no pod status, no events (that is the emulation's).
    assert not can(AGENT, "patch", "pods", "--subresource=status", "-A")
    assert not can(AGENT, "list", "pods", "-A")
    assert not can(AGENT, "create", "events", "-A")
    assert not can(AGENT, "delete", "pods", "-A")
    assert can(AGENT, "update", "leases.coordination.k8s.io", "-n", NS)
    assert not can(AGENT, "update", "leases.coordination.k8s.io", "-n", "kube-node-lease")
    assert not can(AGENT, "get", "secrets", "-A")
    assert can(AGENT, "watch", "resourceslices.resource.k8s.io")  # DRA devices: read only
    assert not can(AGENT, "update", "resourceslices.resource.k8s.io")
    assert can(OPERATOR, "patch", "nodetopologies.numalign.io")
    assert not can(OPERATOR, "patch", "nodetopologies.numalign.io", "--subresource=status")
    assert can(OPERATOR, "delete", "pods", "-A")
    assert not can(OPERATOR, "create", "pods", "-A")  # config/recreate-bare-pods only
    # ConfigMaps: its redeploy record only (create is narrowed by admission policy).
    assert can(OPERATOR, "update", "configmaps/numalign-redeploy", "-n", "default")
    assert not can(OPERATOR, "update", "configmaps/other", "-n", "default")
    assert not can(OPERATOR, "get", "configmaps/other", "-n", "default")
    assert not can(OPERATOR, "list", "configmaps", "-A")
    # Webhook configurations: its own, never new ones.
    assert can(OPERATOR, "patch", "mutatingwebhookconfigurations/numalign.io")
    assert not can(OPERATOR, "patch", "mutatingwebhookconfigurations/other")
    assert not can(OPERATOR, "create", "validatingwebhookconfigurations")
    assert can(OPERATOR, "patch", "clusterkopfpeerings.kopf.dev/numalign")
    assert can(OPERATOR, "get", "secrets/numalign-webhook-cert", "-n", NS)
    assert not can(OPERATOR, "get", "secrets", "-A")


def test_agent_writes_only_its_own_nodetopology(installed: Install, kubectl: Kubectl,
                                                impersonate: Callable[..., Path]) -> None:
    mine, other = new_node_name(), new_node_name()
    agent = str(impersonate(AGENT, {NODE_NAME_EXTRA: [mine]}))
    try:
        kubectl("--kubeconfig", agent, "create", "-f", "-", input=nodetopology_yaml(mine))
        _refused(kubectl("--kubeconfig", agent, "create", "-f", "-",
                         input=nodetopology_yaml(other), check=False),
                 f"on node {mine} may write only objects of its own node",
                 f"NodeTopology {other}")
        kubectl("create", "-f", "-", input=nodetopology_yaml(other))  # as admin
        kubectl("--kubeconfig", agent, "patch", f"nodetopology/{mine}", "--subresource=status",
                "--type=merge", "-p", status_patch())
        _refused(kubectl("--kubeconfig", agent, "patch", f"nodetopology/{other}",
                         "--subresource=status", "--type=merge", "-p", status_patch(),
                         check=False),
                 f"NodeTopology {other}")
    finally:
        kubectl("delete", "--ignore-not-found", "--wait=false",
                f"nodetopology/{mine}", f"nodetopology/{other}", check=False)


@pytest.fixture
def agent_with_emulation_rights(installed: Install, kubectl: Kubectl) -> Iterator[None]:
    """The agent's identity granted the emulation role (pod status, events): the node
    restriction must still confine it."""
    kubectl("apply", "-k", str(CONFIG / "emulation"), "-n", NS)
    def bind(name: str, role: str) -> dict[str, Any]:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": "numalign-agent",
                              "namespace": NS}]}

    binding = bind("test-agent-emulation-rights", "numalign-agent-emulation")
    events_v1 = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                 "metadata": {"name": "test-agent-events-v1"},
                 "rules": [{"apiGroups": ["events.k8s.io"], "resources": ["events"],
                            "verbs": ["create"]}]}
    events_binding = bind("test-agent-events-v1", "test-agent-events-v1")
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all([binding, events_v1, events_binding]))
    try:
        yield
    finally:
        kubectl("delete", "--ignore-not-found", "clusterrolebinding/test-agent-emulation-rights",
                "clusterrolebinding/test-agent-events-v1", "clusterrole/test-agent-events-v1",
                check=False)
        kubectl("delete", "--ignore-not-found", "-k", str(CONFIG / "emulation"), "-n", NS,
                check=False)


def test_agent_writes_status_only_of_pods_on_its_node(agent_with_emulation_rights: None,
                                                      kubectl: Kubectl,
                                                      impersonate: Callable[..., Path],
                                                      namespace: str) -> None:
    mine, other = new_node_name(), new_node_name()
    for name, node in (("here", mine), ("there", other)):
        kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node,
                     "containers": [{"name": "c", "image": "registry.example/none:1"}]}}))
    agent = str(impersonate(AGENT, {NODE_NAME_EXTRA: [mine]}))
    patch = json.dumps({"status": {"conditions": [
        {"type": "numalign.io/Admitted", "status": "True"}]}})
    kubectl("--kubeconfig", agent, "patch", "-n", namespace, "pod/here",
            "--subresource=status", "--type=merge", "-p", patch)
    _refused(kubectl("--kubeconfig", agent, "patch", "-n", namespace, "pod/there",
                     "--subresource=status", "--type=merge", "-p", patch, check=False),
             f"pod {namespace}/there", f'(on node "{other}")')


def test_agent_events_only_about_its_own_node(agent_with_emulation_rights: None,
                                              kubectl: Kubectl,
                                              impersonate: Callable[..., Path],
                                              namespace: str) -> None:
    mine, other = new_node_name(), new_node_name()
    agent = str(impersonate(AGENT, {NODE_NAME_EXTRA: [mine]}))
    kubectl("--kubeconfig", agent, "create", "-f", "-",
            input=event_yaml(namespace, "Pod", "p", mine))
    kubectl("--kubeconfig", agent, "create", "-f", "-",
            input=event_yaml(namespace, "Node", mine, mine))
    for kind, name, reporter in (("Pod", "p", other), ("Node", other, mine),
                                 ("Secret", "s", mine)):
        proc = kubectl("--kubeconfig", agent, "create", "-f", "-",
                       input=event_yaml(namespace, kind, name, reporter), check=False)
        assert proc.returncode != 0, (kind, name, reporter)
        assert "ValidatingAdmissionPolicy 'numalign-agent-events'" in proc.stderr, proc.stderr


def test_agent_events_v1_only_about_its_own_node(agent_with_emulation_rights: None,
                                                 kubectl: Kubectl,
                                                 impersonate: Callable[..., Path],
                                                 namespace: str) -> None:
    mine, other = new_node_name(), new_node_name()
    agent = str(impersonate(AGENT, {NODE_NAME_EXTRA: [mine]}))
    kubectl("--kubeconfig", agent, "create", "-f", "-",
            input=event_v1_yaml(namespace, "Pod", "p", mine))
    for kind, name, reporter in (("Pod", "p", other), ("Node", other, mine)):
        proc = kubectl("--kubeconfig", agent, "create", "-f", "-",
                       input=event_v1_yaml(namespace, kind, name, reporter), check=False)
        assert proc.returncode != 0, (kind, name, reporter)
        # Converted to core/v1 (matchPolicy Equivalent) and refused by the same policy.
        assert "ValidatingAdmissionPolicy 'numalign-agent-events'" in proc.stderr, proc.stderr


def test_operator_creates_only_its_record_and_replacements(installed: Install,
                                                           kubectl: Kubectl,
                                                           impersonate: Callable[..., Path],
                                                           namespace: str) -> None:
    operator = str(impersonate(OPERATOR))
    record = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "numalign-redeploy", "namespace": namespace}}
    kubectl("--kubeconfig", operator, "create", "-f", "-", input=yaml.safe_dump(record))
    other = {**record, "metadata": {"name": "other", "namespace": namespace}}
    proc = kubectl("--kubeconfig", operator, "create", "-f", "-", input=yaml.safe_dump(other),
                   check=False)
    assert proc.returncode != 0
    assert "ValidatingAdmissionPolicy 'numalign-operator-restriction'" in proc.stderr, (
        proc.stderr)
    assert "may create only the ConfigMap numalign-redeploy, not other" in proc.stderr


def test_agent_without_node_bound_token_writes_nothing(installed: Install, kubectl: Kubectl,
                                                       impersonate: Callable[..., Path]
                                                       ) -> None:
    name = new_node_name()
    agent = str(impersonate(AGENT))
    _refused(kubectl("--kubeconfig", agent, "create", "-f", "-", input=nodetopology_yaml(name),
                     check=False),
             "has no node-bound token")


def test_policy_leaves_other_identities_alone(installed: Install, kubectl: Kubectl,
                                              impersonate: Callable[..., Path]) -> None:
    # The operator (no node-name extra) is not the agent: only RBAC applies to it.
    name = new_node_name()
    operator = str(impersonate(OPERATOR))
    kubectl("create", "-f", "-", input=nodetopology_yaml(name))
    try:
        kubectl("--kubeconfig", operator, "patch", f"nodetopology/{name}", "--type=merge",
                "-p", json.dumps({"spec": {"policy": "best-effort"}}))
    finally:
        kubectl("delete", "--ignore-not-found", "--wait=false", f"nodetopology/{name}",
                check=False)


def test_samples_are_accepted(installed: Install, kubectl: Kubectl, namespace: str) -> None:
    for obj in _rendered(kubectl, CONFIG / "samples"):
        if obj["kind"] == "Namespace":
            continue
        if obj["metadata"].get("namespace"):
            obj["metadata"]["namespace"] = namespace
        proc = kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(obj))
        assert "(server dry run)" in proc.stdout


def test_the_operator_runs_with_its_own_service_account(
        installed: Install, kubectl: Kubectl, kubeconfig: Path, k8s_client: Any,
        tmp_path: Path) -> None:
    """The operator as numalign-operator (a token of that ServiceAccount): it fills in the
    installed webhook configurations (patch by name, no create), its webhook answers, and
    its periodic pass (ConfigMaps listed by name, nodes, namespaces, policies) raises no
    authorization error."""
    token = kubectl("create", "token", "numalign-operator", "-n", NS,
                    "--duration=1h").stdout.strip()
    kc = yaml.safe_load(kubeconfig.read_text())
    kc["users"][0]["user"] = {"token": token}
    sa_kubeconfig = tmp_path / "operator.kubeconfig"
    sa_kubeconfig.write_text(yaml.safe_dump(kc))
    sa_kubeconfig.chmod(0o600)
    log = tmp_path / "operator.log"
    with operator(sa_kubeconfig, k8s_client, log) as op:
        time.sleep(12)  # two periodic passes
        assert op.alive(), op.text()[-4000:]
        text = op.text()
        for bad in ("Forbidden", "forbidden", "Traceback"):
            assert bad not in text, text[-6000:]
        # a 403 status, not the milliseconds of a log line's time (",403") or a port
        assert not re.search(r"(?<![\d,.:])403\b", text), text[-6000:]


# ----------------------------------------------------------------------------------
# numalign-pod-annotations (config/tenancy): what numalign trusts on a pod is written by
# numalign's identities only; tolerate-unplaced only in the namespaces an admin lists.

GUARD = "numalign-pod-annotations"
TRUSTED_ONLY = (ANN_RESOLVED, ANN_ALLOCATION, ANN_REJECTION)


def _denied(proc: subprocess.CompletedProcess[str], by: str, *fragments: str) -> None:
    assert proc.returncode != 0, f"expected a refusal, got:\n{proc.stdout}"
    assert by in proc.stderr, proc.stderr
    for f in fragments:
        assert f in proc.stderr, proc.stderr


@pytest.fixture
def editor(kubectl: Kubectl, impersonate: Callable[..., Path], namespace: str) -> str:
    """A kubeconfig of a user with the `edit` role in the test namespace only."""
    user = f"editor-{uuid.uuid4().hex[:6]}"
    kubectl("create", "rolebinding", "editor", "--clusterrole=edit", f"--user={user}",
            "-n", namespace)
    return str(impersonate(user, groups=[]))


def test_namespace_editor_is_refused_each_annotation_on_create(
        kubectl: Kubectl, kubeconfig: Path, k8s_client: Any, editor: str, namespace: str,
        tmp_path: Path) -> None:
    vap = f"ValidatingAdmissionPolicy '{GUARD}'"
    for i, ann in enumerate((ANN_ALLOCATION, ANN_REJECTION, ANN_TOLERATE_UNPLACED)):
        _denied(kubectl("--kubeconfig", editor, "create", "-n", namespace, "-f", "-",
                        input=pod_yaml(f"p{i}", {ann: forged_value(ann)}), check=False), vap, ann)
    # numalign.io/resolved at creation: the mutating webhook writes it, and refuses the
    # creator's own (the policy cannot tell the two apart).
    with operator(kubeconfig, k8s_client, tmp_path / "operator.log"):
        _denied(kubectl("--kubeconfig", editor, "create", "-n", namespace, "-f", "-",
                        input=pod_yaml("forged", {ANN_RESOLVED: forged_value(ANN_RESOLVED)}),
                        check=False),
                'admission webhook "resolve.numalign.io" denied the request',
                f"{ANN_RESOLVED} is numalign's")
        # A plain pod is created, with the resolved policy the webhook wrote.
        kubectl("--kubeconfig", editor, "create", "-n", namespace, "-f", "-",
                input=pod_yaml("plain"))
    pod = json.loads(kubectl("get", "-n", namespace, "pod/plain", "-o", "json").stdout)
    assert ANN_RESOLVED in pod["metadata"]["annotations"]


def test_namespace_editor_is_refused_each_annotation_on_update(
        kubectl: Kubectl, editor: str, namespace: str) -> None:
    vap = f"ValidatingAdmissionPolicy '{GUARD}'"
    four = {a: forged_value(a) for a in (*TRUSTED_ONLY, ANN_TOLERATE_UNPLACED)}
    kubectl("create", "-n", namespace, "-f", "-", input=pod_yaml("p", four))  # as admin
    kubectl("create", "-n", namespace, "-f", "-", input=pod_yaml("q"))
    for ann in TRUSTED_ONLY:
        _denied(kubectl("--kubeconfig", editor, "annotate", "-n", namespace, "--overwrite",
                        "pod/p", f"{ann}=changed", check=False),
                vap, f"may set, change or remove {ann} on a pod")
        _denied(kubectl("--kubeconfig", editor, "annotate", "-n", namespace, "pod/p",
                        f"{ann}-", check=False), vap, ann)
        _denied(kubectl("--kubeconfig", editor, "annotate", "-n", namespace, "pod/q",
                        f"{ann}={forged_value(ann)}", check=False), vap, ann)
    _denied(kubectl("--kubeconfig", editor, "annotate", "-n", namespace, "pod/q",
                    f"{ANN_TOLERATE_UNPLACED}=true", check=False),
            vap, f"{ANN_TOLERATE_UNPLACED} is allowed only on pods in the namespaces "
            f"{NS}, kube-system", f"not in {namespace}")
    _denied(kubectl("--kubeconfig", editor, "annotate", "-n", namespace, "--overwrite",
                    "pod/p", f"{ANN_TOLERATE_UNPLACED}=yes", check=False),
            vap, ANN_TOLERATE_UNPLACED)
    # Everything else of such a pod stays the editor's to change.
    kubectl("--kubeconfig", editor, "annotate", "-n", namespace, "pod/p", "team=a")
    kubectl("--kubeconfig", editor, "label", "-n", namespace, "pod/p", "tier=web")
    pod = json.loads(kubectl("get", "-n", namespace, "pod/p", "-o", "json").stdout)
    assert {k: pod["metadata"]["annotations"][k] for k in four} == four


def test_tolerate_unplaced_in_the_namespaces_an_admin_lists(
        kubectl: Kubectl, editor: str, namespace: str, wait: Callable[..., Any]) -> None:
    param = ["-n", NS, "configmap/numalign-pod-annotations"]
    before = json.loads(kubectl("get", *param, "-o", "json").stdout)["data"]
    tolerant = pod_yaml("tolerant", {ANN_TOLERATE_UNPLACED: "true"})
    _denied(kubectl("--kubeconfig", editor, "create", "-n", namespace, "-f", "-",
                    input=tolerant, check=False), f"ValidatingAdmissionPolicy '{GUARD}'",
            ANN_TOLERATE_UNPLACED)
    listed = f"kube-system, {namespace}"
    kubectl("patch", *param, "--type=merge",
            "-p", json.dumps({"data": {"tolerate-unplaced-namespaces": listed}}))
    try:
        # The API server reads the parameter through a watch: allowed once it has it.
        wait(lambda: kubectl("--kubeconfig", editor, "create", "-n", namespace, "-f", "-",
                             input=tolerant, check=False).returncode == 0,
             30, "the listed namespace to be allowed")
    finally:
        kubectl("patch", *param, "--type=merge", "-p", json.dumps({"data": before}))


def test_numaligns_identities_write_the_annotations(
        agent_with_emulation_rights: None, kubectl: Kubectl,
        impersonate: Callable[..., Path], namespace: str) -> None:
    node = new_node_name()
    kubectl("create", "-n", namespace, "-f", "-", input=pod_yaml("p", node=node))
    operator_kc = str(impersonate(OPERATOR))
    kubectl("--kubeconfig", operator_kc, "annotate", "-n", namespace, "pod/p",
            f"{ANN_RESOLVED}={forged_value(ANN_RESOLVED)}")
    agent = str(impersonate(AGENT, {NODE_NAME_EXTRA: [node]}))
    for ann in (ANN_ALLOCATION, ANN_REJECTION):
        kubectl("--kubeconfig", agent, "patch", "-n", namespace, "pod/p",
                "--subresource=status", "--type=merge",
                "-p", json.dumps({"metadata": {"annotations": {ann: forged_value(ann)}}}))
    pod = json.loads(kubectl("get", "-n", namespace, "pod/p", "-o", "json").stdout)
    assert {a: pod["metadata"]["annotations"].get(a) for a in TRUSTED_ONLY} == {
        a: forged_value(a) for a in TRUSTED_ONLY}


# ----------------------------------------------------------------------------------
# numalign-operator-restriction: what the operator's identity may do to pods.

RESTRICTION = "ValidatingAdmissionPolicy 'numalign-operator-restriction'"


def _set_status(kubectl: Kubectl, namespace: str, name: str, phase: str,
                reason: str | None = None) -> None:
    status: dict[str, Any] = {"phase": phase}
    if reason:
        status["reason"] = reason
    kubectl("patch", "-n", namespace, f"pod/{name}", "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}))


def test_operator_deletes_only_topology_rejected_pods(
        installed: Install, kubectl: Kubectl, impersonate: Callable[..., Path],
        namespace: str) -> None:
    operator_kc = str(impersonate(OPERATOR))
    node = new_node_name()
    for name, phase, reason in (("running", "Running", None), ("evicted", "Failed", "Evicted"),
                                ("rejected", "Failed", REJECT_REASON)):
        kubectl("create", "-n", namespace, "-f", "-", input=pod_yaml(name, node=node))
        _set_status(kubectl, namespace, name, phase, reason)
    _denied(kubectl("--kubeconfig", operator_kc, "delete", "-n", namespace, "pod/running",
                    "--wait=false", check=False), RESTRICTION,
            "may delete only pods Failed with TopologyAffinityError, not pod "
            f"{namespace}/running (Running)")
    _denied(kubectl("--kubeconfig", operator_kc, "delete", "-n", namespace, "pod/evicted",
                    "--wait=false", check=False), RESTRICTION, "(Failed, Evicted)")
    kubectl("--kubeconfig", operator_kc, "delete", "-n", namespace, "pod/rejected",
            "--wait=false")


def test_operator_changes_only_the_pod_metadata_it_owns(
        installed: Install, kubectl: Kubectl, impersonate: Callable[..., Path],
        namespace: str) -> None:
    operator_kc = str(impersonate(OPERATOR))
    kubectl("create", "-n", namespace, "-f", "-",
            input=pod_yaml("p", {"team": "a"}, gates=[REDEPLOY_GATE, "example.com/other"]))

    def as_operator(*args: str) -> subprocess.CompletedProcess[str]:
        return kubectl("--kubeconfig", operator_kc, *args, "-n", namespace, check=False)

    def json_patch(*ops: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        return as_operator("patch", "pod/p", "--type=json", "-p", json.dumps(list(ops)))

    metadata = "may change only the annotations numalign.io/resolved"
    _denied(as_operator("label", "pod/p", "app=miner"), RESTRICTION, metadata)
    _denied(as_operator("annotate", "--overwrite", "pod/p", "team=b"), RESTRICTION, metadata)
    _denied(json_patch({"op": "replace", "path": "/spec/containers/0/image",
                        "value": "registry.example/miner:1"}),
            RESTRICTION, f"may change only its scheduling gate {REDEPLOY_GATE} in the spec of pod "
            f"{namespace}/p")
    _denied(json_patch({"op": "remove", "path": "/spec/schedulingGates/1"}), RESTRICTION,
            "scheduling gate")
    # What it owns: the resolved policy, its warning mark, its own gate.
    assert as_operator("annotate", "pod/p", f"{ANN_RESOLVED}={forged_value(ANN_RESOLVED)}",
                       "numalign.io/override-warning=[]").returncode == 0
    assert json_patch({"op": "test", "path": "/spec/schedulingGates/0/name",
                       "value": REDEPLOY_GATE},
                      {"op": "remove", "path": "/spec/schedulingGates/0"}).returncode == 0
    pod = json.loads(kubectl("get", "-n", namespace, "pod/p", "-o", "json").stdout)
    assert pod["spec"]["schedulingGates"] == [{"name": "example.com/other"}]
    assert pod["metadata"].get("labels") is None
    assert pod["spec"]["containers"][0]["image"] == "registry.example/none:1"


@pytest.fixture
def operator_creates_pods(installed: Install, kubectl: Kubectl) -> Iterator[None]:
    """The optional component config/recreate-bare-pods: `create` on pods, its binding's
    subject in numalign's namespace (as kustomize's namespace of config/default sets it)."""
    docs = [d for d in yaml.safe_load_all(
        (CONFIG / "recreate-bare-pods" / "role.yaml").read_text()) if d]
    for doc in docs:
        for subject in doc.get("subjects") or []:
            if subject.get("kind") == "ServiceAccount":
                subject.setdefault("namespace", "numalign-system")
    rendered = yaml.safe_dump_all(docs)
    kubectl("apply", "-f", "-", input=rendered)
    try:
        yield
    finally:
        kubectl("delete", "--ignore-not-found", "-f", "-", input=rendered, check=False)


def test_operator_creates_replacements_only_unbound_and_never_in_kube_system(
        operator_creates_pods: None, kubectl: Kubectl, impersonate: Callable[..., Path],
        namespace: str) -> None:
    operator_kc = str(impersonate(OPERATOR))
    marks = {ANN_REDEPLOY_OF: "web", ANN_REDEPLOY_OF_UID: str(uuid.uuid4())}
    name = f"web-r1-{uuid.uuid4().hex[:6]}"
    _denied(kubectl("--kubeconfig", operator_kc, "create", "-n", "kube-system", "-f", "-",
                    input=pod_yaml(name, marks), check=False), RESTRICTION,
            f"may not create pods in kube-system (pod kube-system/{name})")
    _denied(kubectl("--kubeconfig", operator_kc, "create", "-n", namespace, "-f", "-",
                    input=pod_yaml(name, marks, node="node-a"), check=False), RESTRICTION,
            "may create only replacements of rejected pods")
    _denied(kubectl("--kubeconfig", operator_kc, "create", "-n", namespace, "-f", "-",
                    input=pod_yaml(name), check=False), RESTRICTION,
            "may create only replacements of rejected pods")
    kubectl("--kubeconfig", operator_kc, "create", "-n", namespace, "-f", "-",
            input=pod_yaml(name, marks))
