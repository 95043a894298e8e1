"""config/ renders with kubectl's built-in kustomize and the rendered manifests keep
their promises: hardened containers, least-privilege RBAC, one image name, every CRD."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from config_helpers import (
    CONFIG,
    IMAGE,
    REPO,
    Obj,
    containers,
    default_objects,
    default_overlay,
    kustomize,
    named,
    of_kind,
    pod_spec,
    role_rules,
)

WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "ReplicaSet", "Pod")


@pytest.fixture
def default() -> list[Obj]:
    return default_objects()


def _name(obj: Obj) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


@pytest.mark.parametrize("path", ["crd", "rbac", "operator", "agent", "webhook", "tenancy",
                                  "samples", "default"])
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
    # the agents: their pods, on their metrics port
    monitors = {m["metadata"]["name"]: m for m in of_kind(objs, "PodMonitor")}
    assert set(monitors) == {"numalign-agent", "numalign-extender"}
    pm = monitors["numalign-agent"]
    [ds] = of_kind(objs, "DaemonSet")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(k) == v for k, v in pm["spec"]["selector"]["matchLabels"].items())
    (agent,) = pod_spec(ds)["containers"]
    assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} <= {
        p["name"] for p in agent["ports"]}
    [rule] = of_kind(objs, "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"NumalignRejectionsRising", "NumalignAgentNotPublishing",
            "NumalignRedeploysGivingUp"} <= alerts


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


def _allows(rules: list[Obj], group: str, resource: str, verb: str) -> bool:
    return any(group in r.get("apiGroups", []) and resource in r.get("resources", [])
               and verb in r.get("verbs", []) for r in rules)


def test_agent_and_operator_write_only_their_halves(default: list[Obj]) -> None:
    agent = role_rules(default, "numalign-agent")
    operator = role_rules(default, "numalign-operator")
    # The agent writes NodeTopology status, never the spec (the operator's) nor pods.
    assert _allows(agent, "numalign.io", "nodetopologies/status", "patch")
    for verb in ("patch", "update", "delete"):
        assert not _allows(agent, "numalign.io", "nodetopologies", verb)
    for verb in ("create", "patch", "update", "delete"):
        assert not _allows(agent, "", "pods", verb)
    assert not any("secrets" in r.get("resources", []) for r in agent)
    # DRA: it reads its node's ResourceSlices, never writes them.
    assert _allows(agent, "resource.k8s.io", "resourceslices", "list")
    assert _allows(agent, "resource.k8s.io", "resourceslices", "watch")
    for verb in ("create", "patch", "update", "delete"):
        assert not _allows(agent, "resource.k8s.io", "resourceslices", verb)
    # On an NRI-managed node it reads a placed pod's ResourceClaims by name, nothing more.
    assert _allows(agent, "resource.k8s.io", "resourceclaims", "get")
    for verb in ("list", "watch", "create", "patch", "update", "delete"):
        assert not _allows(agent, "resource.k8s.io", "resourceclaims", verb)
    # The operator pushes NodeTopology spec, never status; it cannot read secrets
    # cluster-wide (its certificate Secret is a namespaced Role, by name).
    assert _allows(operator, "numalign.io", "nodetopologies", "patch")
    assert not _allows(operator, "numalign.io", "nodetopologies/status", "patch")
    assert not any("secrets" in r.get("resources", []) for r in operator)
    # DRA: the numa-constraint webhook lists slices and classes, and writes neither.
    for kind in ("resourceslices", "deviceclasses"):
        assert _allows(operator, "resource.k8s.io", kind, "list")
        for verb in ("create", "patch", "update", "delete"):
            assert not _allows(operator, "resource.k8s.io", kind, verb)
    assert not any("resourceclaims" in r.get("resources", []) for r in operator)


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
    # Kopf's peering identity is the pod's name, not user@host.
    assert env["POD_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert f"--liveness=http://0.0.0.0:{ports['health']}/healthz" in args
    # Ready (behind the webhook Service) only once its webhook server answers.
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ready"}
    assert f"--readiness=http://0.0.0.0:{ports['ready']}/readyz" in args
    assert f"--metrics-port={ports['metrics']}" in args
    assert f"--webhook-port={ports['webhook']}" in args
    services = {s["metadata"]["name"]: s for s in of_kind(default, "Service")}
    webhook = services["numalign-webhook"]
    assert "--webhook-service=$(POD_NAMESPACE)/numalign-webhook" in args
    assert webhook["spec"]["ports"][0]["port"] == ports["webhook"]
    # The governing Service is headless.
    governing = services[sts["spec"]["serviceName"]]
    assert governing["spec"]["clusterIP"] == "None"
    assert governing["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]


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


def test_operator_rbac_is_narrowed_to_its_own_objects(default: list[Obj]) -> None:
    rules = role_rules(default, "numalign-operator")
    # ConfigMaps: only its redeploy record, except `create` (no name yet: the operator
    # restriction policy checks it).
    for rule in rules:
        if "configmaps" in rule["resources"] and rule["verbs"] != ["create"]:
            assert rule.get("resourceNames") == ["numalign-redeploy"], rule
    assert _allows(rules, "", "configmaps", "update") and _allows(rules, "", "configmaps",
                                                                   "create")
    # Pods: no create without the recreate-bare-pods component.
    assert _allows(rules, "", "pods", "delete")
    assert not _allows(rules, "", "pods", "create")
    # Webhook configurations: its own two, never created.
    for kind in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations"):
        assert not _allows(rules, "admissionregistration.k8s.io", kind, "create")
        for rule in rules:
            if kind in rule["resources"]:
                assert rule["resourceNames"] == ["numalign.io"], rule
    policy = yaml.safe_dump(named(default, "ValidatingAdmissionPolicy",
                                   "numalign-operator-restriction"))
    assert "'numalign-redeploy'" in policy and "numalign.io/redeploy-of" in policy
    [sts] = of_kind(default, "StatefulSet")
    assert "--recreate-bare-pods" not in pod_spec(sts)["containers"][0]["args"]


def test_recreate_bare_pods_is_a_switch_with_its_own_role(tmp_path: Path) -> None:
    objs = default_overlay(tmp_path, components=[os.path.relpath(CONFIG / "recreate-bare-pods",
                                                          tmp_path)])
    [sts] = of_kind(objs, "StatefulSet")
    assert "--recreate-bare-pods" in pod_spec(sts)["containers"][0]["args"]
    role = named(objs, "ClusterRole", "numalign-operator-recreate-bare-pods")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]
    binding = named(objs, "ClusterRoleBinding", "numalign-operator-recreate-bare-pods")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "numalign-operator",
                                    "namespace": "numalign-system"}]


def test_agent_daemonset_role_is_split_from_the_emulation_role(default: list[Obj]) -> None:
    agent = role_rules(default, "numalign-agent")
    for resource in ("pods", "pods/status", "events", "leases"):
        assert not any(resource in r["resources"] for r in agent), resource
    assert not any(o["metadata"]["name"] == "numalign-agent-emulation" for o in default)
    emulation = kustomize(CONFIG / "emulation")
    erules = named(emulation, "ClusterRole", "numalign-agent-emulation")["rules"]
    assert _allows(erules, "", "pods/status", "patch") and _allows(erules, "", "events",
                                                                   "create")
    assert _allows(erules, "", "nodes", "create")
    # --dra: the emulated driver's slices are written, never patched nor deleted (the
    # Node owns them).
    for verb in ("get", "create", "update"):
        assert _allows(erules, "resource.k8s.io", "resourceslices", verb)
    for verb in ("patch", "delete", "deletecollection"):
        assert not _allows(erules, "resource.k8s.io", "resourceslices", verb)
    # pods with claims: the claims are read for their allocated devices, never written
    for verb in ("get", "list", "watch"):
        assert _allows(erules, "resource.k8s.io", "resourceclaims", verb)
    for verb in ("create", "update", "patch", "delete"):
        assert not _allows(erules, "resource.k8s.io", "resourceclaims", verb)
    [sa] = of_kind(emulation, "ServiceAccount")
    assert sa["metadata"]["name"] == "numalign-agent-emulation"


def test_webhooks_skip_system_namespaces_and_answer_fast(default: list[Obj]) -> None:
    [sts] = of_kind(default, "StatefulSet")
    args = pod_spec(sts)["containers"][0]["args"]
    assert "--webhook-exclude-namespace=$(POD_NAMESPACE)" in args
    hooks = [h for o in of_kind(default, "MutatingWebhookConfiguration",
                                "ValidatingWebhookConfiguration")
             for h in o["webhooks"]]
    assert {h["name"] for h in hooks} == {"resolve.numalign.io", "overrides.numalign.io",
                                          "policy-overlaps.numalign.io",
                                          "numa-constraint.numalign.io"}
    [service] = [s for s in of_kind(default, "Service")
                 if s["metadata"]["name"] == "numalign-webhook"]
    for h in hooks:
        [expr] = h["namespaceSelector"]["matchExpressions"]
        assert expr["key"] == "kubernetes.io/metadata.name" and expr["operator"] == "NotIn"
        assert {"kube-system", "numalign-system"} <= set(expr["values"])
        assert h["timeoutSeconds"] <= 5 and h["failurePolicy"] == "Ignore"
        # Called through the Service (the cluster routes to a ready replica), not a URL.
        ref = h["clientConfig"]["service"]
        assert "url" not in h["clientConfig"]
        assert (ref["namespace"], ref["name"]) == ("numalign-system", "numalign-webhook")
        assert ref["port"] in {p["port"] for p in service["spec"]["ports"]}
        assert ref["path"] == "/" + h["name"].removesuffix(".numalign.io")


def test_default_follows_its_namespace(tmp_path: Path) -> None:
    """config/default's `namespace:` is the one place numalign's namespace is named: with
    another, no object, reference, binding or webhook selector keeps numalign-system."""
    shutil.copytree(CONFIG, tmp_path / "config")
    shutil.copytree(REPO / "crds", tmp_path / "crds")  # config/crd's resources
    kust = tmp_path / "config" / "default" / "kustomization.yaml"
    text = kust.read_text()
    assert "\nnamespace: numalign-system\n" in text
    kust.write_text(text.replace("\nnamespace: numalign-system\n", "\nnamespace: numa-b\n"))
    objs = kustomize(tmp_path / "config" / "default")
    assert "numalign-system" not in yaml.safe_dump_all(objs)
    for o in of_kind(objs, "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for h in o["webhooks"]:
            assert h["clientConfig"]["service"]["namespace"] == "numa-b"
            [expr] = h["namespaceSelector"]["matchExpressions"]
            assert sorted(expr["values"]) == ["kube-system", "numa-b"]


# The placeholder address config/ ships for the API server's and kube-scheduler's
# sources (TEST-NET-1, RFC 5737: no host has it, so unedited it admits nobody).
PLACEHOLDER_SOURCES = [{"ipBlock": {"cidr": "192.0.2.0/24"}}]


def test_network_policies_guard_the_webhook_and_metrics_ports(default: list[Obj]) -> None:
    [sts] = of_kind(default, "StatefulSet")
    ports = {p["name"] for p in pod_spec(sts)["containers"][0]["ports"]}
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    op = named(default, "NetworkPolicy", "numalign-operator")
    assert op["spec"]["policyTypes"] == ["Ingress"]
    assert all(pod_labels.get(k) == v
               for k, v in op["spec"]["podSelector"]["matchLabels"].items())
    allowed = {p["port"]: rule.get("from") for rule in op["spec"]["ingress"]
               for p in rule["ports"]}
    assert set(allowed) == {"webhook", "metrics"} and set(allowed) <= ports
    # The webhooks only from the API server's addresses, to be set by the user: no pod
    # may send them reviews (a rule without `from` would admit every source).
    assert allowed["webhook"] == PLACEHOLDER_SOURCES
    assert allowed["metrics"], "metrics open to every pod"
    # the agents: only their /metrics, only from labelled namespaces
    [ds] = of_kind(default, "DaemonSet")
    (container,) = pod_spec(ds)["containers"]
    agent = named(default, "NetworkPolicy", "numalign-agent")
    assert agent["spec"]["policyTypes"] == ["Ingress"]
    allowed = {p["port"]: rule.get("from") for rule in agent["spec"]["ingress"]
               for p in rule["ports"]}
    assert set(allowed) == {"metrics"} and allowed["metrics"]
    assert "metrics" in {p["name"] for p in container["ports"]}
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "metrics")
    assert f"--metrics-port={port}" in container["args"]


def test_kubelet_resources_is_a_read_only_switch(tmp_path: Path) -> None:
    """The component that lets a real node's agent report the kubelet's own allocations:
    read-only mounts of the socket folder and the configuration, no capability, no writes."""
    objs = default_overlay(tmp_path, components=[os.path.relpath(CONFIG / "kubelet-resources",
                                                          tmp_path)])
    [ds] = of_kind(objs, "DaemonSet")
    spec = pod_spec(ds)
    [c] = spec["containers"]
    sock = "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert f"--pod-resources={sock}" in c["args"]
    assert "--kubelet-config=/var/lib/kubelet/config.yaml" in c["args"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    for path in ("/var/lib/kubelet/pod-resources", "/var/lib/kubelet/config.yaml"):
        assert mounts[path]["readOnly"] is True
        assert vols[mounts[path]["name"]]["hostPath"]["path"] == path
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    role = named(objs, "ClusterRole", "numalign-agent-kubelet-resources")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["get", "list", "watch"]}]
    binding = named(objs, "ClusterRoleBinding", "numalign-agent-kubelet-resources")
    assert binding["subjects"][0]["name"] == "numalign-agent"
    # config/default stays non-root and reads no pods
    [plain] = of_kind(kustomize(CONFIG / "default"), "DaemonSet")
    assert pod_spec(plain)["securityContext"]["runAsNonRoot"] is True


def test_nri_component_places_containers_with_only_what_it_writes(tmp_path: Path) -> None:
    """The component for numalign-managed nodes, with kubelet-resources: --nri-socket and a
    read-only mount of the runtime's socket folder, no capability; its role adds exactly
    the writes of a placing agent (pod status, events), each covered by the node
    restriction policies."""
    objs = default_overlay(tmp_path, components=[
        os.path.relpath(CONFIG / "kubelet-resources", tmp_path),
        os.path.relpath(CONFIG / "nri", tmp_path)])
    [ds] = of_kind(objs, "DaemonSet")
    spec = pod_spec(ds)
    [c] = spec["containers"]
    assert "--nri-socket=/var/run/nri/nri.sock" in c["args"]
    assert "--kubelet-config=/var/lib/kubelet/config.yaml" in c["args"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in spec["volumes"]}
    assert mounts["/var/run/nri"]["readOnly"] is True
    assert vols[mounts["/var/run/nri"]["name"]]["hostPath"]["path"] == "/var/run/nri"
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    role = named(objs, "ClusterRole", "numalign-agent-nri")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
               for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {("", "pods", "get"), ("", "pods", "list"), ("", "pods", "watch"),
                       ("", "pods/status", "patch"), ("", "events", "create"),
                       ("", "nodes", "list"), ("", "nodes", "watch")}
    binding = named(objs, "ClusterRoleBinding", "numalign-agent-nri")
    assert (binding["subjects"][0]["name"], binding["subjects"][0]["namespace"]) == (
        "numalign-agent", "numalign-system")
    covered = set()
    for name in ("numalign-agent-node-restriction", "numalign-agent-events"):
        vap = named(objs, "ValidatingAdmissionPolicy", name)
        for rule in vap["spec"]["matchConstraints"]["resourceRules"]:
            covered |= {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
    assert {("", "pods/status"), ("", "events")} <= covered
