"""config/ renders with kubectl's built-in kustomize and the rendered manifests keep
their promises: hardened containers, least-privilege RBAC, one image name, every CRD."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "config"
IMAGE = "ghcr.io/numalign/numalign:0.1.0"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "ReplicaSet", "Pod")
Obj = dict[str, Any]


def kustomize(path: Path) -> list[Obj]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with its built-in kustomize) must be on PATH"
    proc = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                          check=False, timeout=60)
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@cache
def _default() -> tuple[Obj, ...]:
    return tuple(kustomize(CONFIG / "default"))


@pytest.fixture
def default() -> list[Obj]:
    return list(_default())


def of_kind(objs: list[Obj], *kinds: str) -> list[Obj]:
    return [o for o in objs if o["kind"] in kinds]


def pod_spec(obj: Obj) -> Obj:
    spec: Obj = obj["spec"]
    if obj["kind"] == "Pod":
        return spec
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    result: Obj = spec["template"]["spec"]
    return result


def containers(obj: Obj) -> Iterator[Obj]:
    spec = pod_spec(obj)
    yield from spec.get("initContainers") or []
    yield from spec.get("containers") or []


def _name(obj: Obj) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


@pytest.mark.parametrize("path", ["crd", "rbac", "operator", "agent", "webhook", "samples",
                                  "default"])
def test_every_kustomization_renders(path: str) -> None:
    assert kustomize(CONFIG / path)


def test_prometheus_component_renders_a_service_monitor(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "namespace": "numalign-system",
        "resources": [os.path.relpath(CONFIG / "default", tmp_path)],
        "components": [os.path.relpath(CONFIG / "prometheus", tmp_path)]}))
    objs = kustomize(tmp_path)
    [sm] = of_kind(objs, "ServiceMonitor")
    assert sm["metadata"]["namespace"] == "numalign-system"
    [svc] = [s for s in of_kind(objs, "Service")
             if s["metadata"]["name"] == "numalign-operator"]
    labels = svc["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in sm["spec"]["selector"]["matchLabels"].items())
    assert {e["port"] for e in sm["spec"]["endpoints"]} <= {p["name"] for p in
                                                            svc["spec"]["ports"]}


def test_default_has_the_parts(default: list[Obj]) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in default}
    for part in [("Namespace", "numalign-system"),
                 ("ServiceAccount", "numalign-operator"), ("ServiceAccount", "numalign-agent"),
                 ("ClusterRole", "numalign-operator"), ("ClusterRole", "numalign-agent"),
                 ("StatefulSet", "numalign-operator"), ("DaemonSet", "numalign-agent"),
                 ("Service", "numalign-webhook"), ("Service", "numalign-operator"),
                 ("ValidatingAdmissionPolicy", "numalign-agent-node-restriction"),
                 ("ValidatingAdmissionPolicyBinding", "numalign-agent-node-restriction"),
                 ("ClusterKopfPeering", "numalign")]:
        assert part in kinds, f"{part} missing from config/default"
    namespaced = of_kind(default, "ServiceAccount", "Service", "StatefulSet", "DaemonSet",
                         "Role", "RoleBinding", "PodDisruptionBudget")
    assert {o["metadata"].get("namespace") for o in namespaced} == {"numalign-system"}


def test_every_generated_crd_is_installed(default: list[Obj]) -> None:
    files = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    listed = yaml.safe_load((REPO / "crds" / "Kustomization").read_text())["resources"]
    assert sorted(listed) == files, "crds/Kustomization must list every crds/*.yaml"
    want = set()
    for f in files:
        for doc in yaml.safe_load_all((REPO / "crds" / f).read_text()):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                want.add(doc["metadata"]["name"])
    got = {o["metadata"]["name"] for o in of_kind(default, "CustomResourceDefinition")}
    assert want | {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} == got


def test_containers_are_non_root_read_only_and_limited(default: list[Obj]) -> None:
    workloads = of_kind(default, *WORKLOADS)
    assert len(workloads) == 2
    for w in workloads:
        spec = pod_spec(w)
        pod_sc = spec.get("securityContext") or {}
        for c in containers(w):
            where = f"{_name(w)} container {c['name']}"
            sc = {**pod_sc, **(c.get("securityContext") or {})}
            assert sc.get("runAsNonRoot") is True, f"{where}: runAsNonRoot"
            assert sc.get("runAsUser", 1) != 0, f"{where}: runAsUser 0"
            assert sc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem"
            assert sc.get("allowPrivilegeEscalation") is False, f"{where}: privilege escalation"
            assert not sc.get("privileged"), f"{where}: privileged"
            assert "ALL" in ((sc.get("capabilities") or {}).get("drop") or []), (
                f"{where}: capabilities not dropped")
            limits = (c.get("resources") or {}).get("limits") or {}
            assert {"cpu", "memory"} <= set(limits), f"{where}: cpu and memory limits"
            requests = (c.get("resources") or {}).get("requests") or {}
            assert {"cpu", "memory"} <= set(requests), f"{where}: cpu and memory requests"
            assert c["image"] == IMAGE, f"{where}: image {c['image']}"


def test_the_image_is_named_in_one_place() -> None:
    hits = [p.relative_to(REPO).as_posix() for p in CONFIG.rglob("*.yaml")
            if "ghcr.io/numalign" in p.read_text()]
    assert hits == ["config/default/kustomization.yaml"]


def test_rbac_has_no_wildcards(default: list[Obj]) -> None:
    roles = of_kind(default, "ClusterRole", "Role")
    assert roles
    for role in roles:
        for rule in role.get("rules") or []:
            for key in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
                assert not any("*" in v for v in rule.get(key) or []), (
                    f"{_name(role)}: wildcard in {key}: {rule}")
    for b in of_kind(default, "ClusterRoleBinding", "RoleBinding"):
        assert b["roleRef"]["name"] not in ("cluster-admin", "admin", "edit"), _name(b)
        for s in b["subjects"]:
            assert s["kind"] == "ServiceAccount" and s["namespace"] == "numalign-system"


def _rules(default: list[Obj], name: str) -> list[Obj]:
    [role] = [r for r in of_kind(default, "ClusterRole") if r["metadata"]["name"] == name]
    rules: list[Obj] = role["rules"]
    return rules


def _allows(rules: list[Obj], group: str, resource: str, verb: str) -> bool:
    return any(group in r.get("apiGroups", []) and resource in r.get("resources", [])
               and verb in r.get("verbs", []) for r in rules)


def test_agent_and_operator_write_only_their_halves(default: list[Obj]) -> None:
    agent, operator = _rules(default, "numalign-agent"), _rules(default, "numalign-operator")
    # The agent writes NodeTopology status, never the spec (the operator's) nor pods.
    assert _allows(agent, "numalign.io", "nodetopologies/status", "patch")
    for verb in ("patch", "update", "delete"):
        assert not _allows(agent, "numalign.io", "nodetopologies", verb)
    for verb in ("create", "patch", "update", "delete"):
        assert not _allows(agent, "", "pods", verb)
    assert not any("secrets" in r.get("resources", []) for r in agent)
    # The operator pushes NodeTopology spec, never status; it cannot read secrets
    # cluster-wide (its certificate Secret is a namespaced Role, by name).
    assert _allows(operator, "numalign.io", "nodetopologies", "patch")
    assert not _allows(operator, "numalign.io", "nodetopologies/status", "patch")
    assert not any("secrets" in r.get("resources", []) for r in operator)


def test_agent_daemonset_reads_host_sysfs(default: list[Obj]) -> None:
    [ds] = of_kind(default, "DaemonSet")
    spec = pod_spec(ds)
    [c] = spec["containers"]
    assert c["args"][:1] == ["agent"]
    assert "--node=$(NODE_NAME)" in c["args"] and "--root=/host" in c["args"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    vols = {v["name"]: v for v in spec["volumes"]}
    [sys_mount] = [m for m in c["volumeMounts"] if m["mountPath"] == "/host/sys"]
    assert sys_mount["readOnly"] is True
    assert vols[sys_mount["name"]]["hostPath"]["path"] == "/sys"
    assert spec["serviceAccountName"] == "numalign-agent"
    assert {"operator": "Exists"} in spec["tolerations"]


def test_operator_runs_in_peering_with_distinct_priorities(default: list[Obj]) -> None:
    [sts] = of_kind(default, "StatefulSet")
    assert sts["spec"]["replicas"] >= 2
    [c] = pod_spec(sts)["containers"]
    args = c["args"]
    assert args[0] == "operator" and "--peering=numalign" in args
    # Kopf pauses every replica when live peers share a priority: one per pod index.
    assert "--priority=$(POD_INDEX)" in args
    env = {e["name"]: e for e in c["env"]}
    assert "pod-index" in env["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert f"--liveness=http://0.0.0.0:{ports['health']}/healthz" in args
    assert f"--metrics-port={ports['metrics']}" in args
    assert f"--webhook-port={ports['webhook']}" in args
    [webhook] = [s for s in of_kind(default, "Service")
                 if s["metadata"]["name"] == "numalign-webhook"]
    assert "--webhook-host=numalign-webhook.$(POD_NAMESPACE).svc" in args
    assert webhook["spec"]["ports"][0]["port"] == ports["webhook"]


def test_node_restriction_policy_is_bound(default: list[Obj]) -> None:
    [vap] = of_kind(default, "ValidatingAdmissionPolicy")
    [binding] = of_kind(default, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert vap["spec"]["failurePolicy"] == "Fail"
    text = yaml.safe_dump(vap)
    assert "authentication.kubernetes.io/node-name" in text
    rules = vap["spec"]["matchConstraints"]["resourceRules"]
    covered = {r for rule in rules for r in rule["resources"]}
    assert {"nodetopologies", "nodetopologies/status", "pods/status"} <= covered


def test_samples() -> None:
    objs = kustomize(CONFIG / "samples")
    policies = {o["metadata"]["name"]: o["spec"] for o in of_kind(objs, "TopologyPolicy")}
    assert policies["ml-training"]["policy"] == "single-numa-node"
    assert policies["ml-training"]["scope"] == "pod"
    assert policies["batch"]["policy"] == "best-effort"
    assert policies["low-latency"]["redeploy"]["enabled"] is True
    deploys = {o["metadata"]["name"]: o for o in of_kind(objs, "Deployment")}
    assert set(deploys) == {"trainer", "etl", "packet-processor"}
    annotations = deploys["trainer"]["spec"]["template"]["metadata"]["annotations"]
    assert yaml.safe_load(annotations["numalign.io/gpus"])[0]["count"] == 2
    namespaces = {o["metadata"]["name"]: o for o in of_kind(objs, "Namespace")}
    assert namespaces["batch"]["metadata"]["labels"] == {"workload-class": "batch"}


def test_nrt_component_adds_the_crd_and_the_flag(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(CONFIG / "default", tmp_path)],
        "components": [os.path.relpath(CONFIG / "nrt", tmp_path)]}))
    objs = kustomize(tmp_path)
    crds = {o["metadata"]["name"] for o in of_kind(objs, "CustomResourceDefinition")}
    assert "noderesourcetopologies.topology.node.k8s.io" in crds
    [ds] = of_kind(objs, "DaemonSet")
    (agent,) = pod_spec(ds)["containers"]
    assert "--publish-nrt" in agent["args"]
    [role] = [r for r in of_kind(objs, "ClusterRole")
              if r["metadata"]["name"] == "numalign-agent"]
    [rule] = [r for r in role["rules"] if "topology.node.k8s.io" in r["apiGroups"]]
    assert rule["resources"] == ["noderesourcetopologies"]
    assert set(rule["verbs"]) == {"get", "create", "update"}
