"""config/scheduler: the second scheduler for clusters whose kube-scheduler cannot be
configured. One line in config/default enables it (it includes config/extender): a
hardened Deployment of the image's kube-scheduler whose configuration has one profile,
``numalign-scheduler``, leader election on its own Lease and numalign's extender over
mutual TLS through the extender's Service; RBAC of the cluster's own kube-scheduler (the
built-in roles) plus its Lease, nothing else; the extender decides the pods of both
schedulers and admits this one's pods to its verbs by a pod selector."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from config_helpers import CONFIG, IMAGE, REPO, containers, kustomize, named, of_kind, pod_spec
from numalign.commands.extender import parser as extender_parser
from numalign.devcluster.images.numalign_image import KUBE_SCHEDULER
from numalign.devcluster.scheduler import ExtenderTls, extender_entry

Obj = dict[str, Any]
NAMESPACE = "numalign-system"
PROFILE = "numalign-scheduler"


@pytest.fixture(scope="module")
def objs(tmp_path_factory: pytest.TempPathFactory) -> list[Obj]:
    """config/default with its one line for the scheduler: `components: [../scheduler]`."""
    root = tmp_path_factory.mktemp("scheduler")
    shutil.copytree(CONFIG, root / "config")
    shutil.copytree(REPO / "crds", root / "crds")  # config/crd's resources
    kust = root / "config" / "default" / "kustomization.yaml"
    text = kust.read_text()
    assert "#   - ../scheduler\n" in text, "config/default shows the line to enable it"
    doc = yaml.safe_load(text)
    assert "components" not in doc, "not on by default"
    kust.write_text(text + "components:\n  - ../scheduler\n")
    return kustomize(root / "config" / "default")


def _config(objs: list[Obj]) -> Obj:
    cm = named(objs, "ConfigMap", "numalign-scheduler-config")
    assert cm["metadata"]["namespace"] == NAMESPACE
    doc: Obj = yaml.safe_load(cm["data"]["config.yaml"])
    return doc


def test_the_scheduler_runs_the_images_kube_scheduler_hardened(objs: list[Obj]) -> None:
    dep = named(objs, "Deployment", "numalign-scheduler")
    assert dep["metadata"]["namespace"] == NAMESPACE
    spec = pod_spec(dep)
    assert spec["serviceAccountName"] == "numalign-scheduler"
    [c] = list(containers(dep))
    assert c["image"] == IMAGE, "config/default's image transformer reaches it"
    assert c["command"][0] == KUBE_SCHEDULER
    sc = {**spec["securityContext"], **c["securityContext"]}
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(c["resources"]["limits"])
    port = next(int(a.split("=", 1)[1]) for a in c["command"]
                if a.startswith("--secure-port="))
    assert [(p["name"], p["containerPort"]) for p in c["ports"]] == [("https", port)]
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/healthz", "port": "https", "scheme": "HTTPS"}
    # --config is the ConfigMap's file; the client certificate is the Secret's, read-only
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    config = next(a.split("=", 1)[1] for a in c["command"] if a.startswith("--config="))
    assert volumes["config"]["configMap"]["name"] == "numalign-scheduler-config"
    assert config == f"{mounts['config']['mountPath']}/config.yaml"
    assert mounts["extender-client"]["readOnly"] is True
    assert volumes["extender-client"]["secret"] == {
        "secretName": "numalign-extender-scheduler", "defaultMode": 0o440}
    tls = _config(objs)["extenders"][0]["tlsConfig"]
    folder = mounts["extender-client"]["mountPath"]
    assert [tls[k] for k in ("caFile", "certFile", "keyFile")] == [
        f"{folder}/{f}" for f in ("ca.crt", "scheduler.crt", "scheduler.key")]


def test_one_profile_leader_election_and_the_extender(objs: list[Obj]) -> None:
    doc = _config(objs)
    assert (doc["apiVersion"], doc["kind"]) == ("kubescheduler.config.k8s.io/v1",
                                                 "KubeSchedulerConfiguration")
    assert doc["profiles"] == [{"schedulerName": PROFILE}]
    assert doc["leaderElection"] == {"leaderElect": True, "resourceLock": "leases",
                                     "resourceName": PROFILE, "resourceNamespace": NAMESPACE}
    assert "clientConnection" not in doc, "in-cluster: the pod's ServiceAccount"
    [entry] = doc["extenders"]
    tls = entry["tlsConfig"]
    # the entry config/extender ships (filter, prioritize, bind, ignorable, HTTPS) ...
    assert {**entry, "tlsConfig": {k: v for k, v in tls.items() if k != "serverName"}} == \
        extender_entry(entry["urlPrefix"], ExtenderTls(
            Path(tls["caFile"]), Path(tls["certFile"]), Path(tls["keyFile"])))
    # ... at the extender's Service, by the name its certificate carries
    url = urlsplit(entry["urlPrefix"])
    svc = named(objs, "Service", "numalign-extender")
    assert url.scheme == "https"
    assert url.hostname == tls["serverName"] == f"numalign-extender.{NAMESPACE}.svc"
    assert url.port == svc["spec"]["ports"][0]["port"]


def test_rbac_is_the_cluster_schedulers_own_and_its_lease(objs: list[Obj]) -> None:
    subject = {"kind": "ServiceAccount", "name": "numalign-scheduler", "namespace": NAMESPACE}
    bound = {(b["kind"], b["roleRef"]["kind"], b["roleRef"]["name"])
             for b in of_kind(objs, "ClusterRoleBinding", "RoleBinding")
             if subject in b["subjects"]}
    assert bound == {("ClusterRoleBinding", "ClusterRole", "system:kube-scheduler"),
                     ("ClusterRoleBinding", "ClusterRole", "system:volume-scheduler"),
                     ("RoleBinding", "Role", "numalign-scheduler-lease")}
    binding = named(objs, "RoleBinding", "numalign-scheduler-lease")
    role = named(objs, "Role", "numalign-scheduler-lease")
    assert binding["metadata"]["namespace"] == role["metadata"]["namespace"] == NAMESPACE
    # its own Lease only, the one its leader election names
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "resourceNames": [_config(objs)["leaderElection"]["resourceName"]],
                              "verbs": ["get", "update"]}]
    for b in of_kind(objs, "ClusterRoleBinding", "RoleBinding"):
        assert b["roleRef"]["name"] not in ("cluster-admin", "admin", "edit")


def test_the_extender_serves_and_admits_both_schedulers(objs: list[Obj]) -> None:
    ext = named(objs, "Deployment", "numalign-extender")
    [c] = list(containers(ext))
    args = extender_parser().parse_args(c["args"][1:])
    assert args.scheduler_name == ["default-scheduler", PROFILE]
    netpol = named(objs, "NetworkPolicy", "numalign-extender")
    https = [peer for rule in netpol["spec"]["ingress"]
             if [p["port"] for p in rule["ports"]] == ["https"] for peer in rule["from"]]
    # the cluster's scheduler by its addresses (the placeholder), this one by its pods
    labels = named(objs, "Deployment", "numalign-scheduler")["spec"]["template"][
        "metadata"]["labels"]
    [selector] = [p["podSelector"] for p in https if "podSelector" in p]
    assert "namespaceSelector" not in selector
    assert selector["matchLabels"] and all(labels.get(k) == v
                                           for k, v in selector["matchLabels"].items())
    assert {"ipBlock": {"cidr": "192.0.2.0/24"}} in https
    # the scheduler's own port: only Prometheus's namespaces
    own = named(objs, "NetworkPolicy", "numalign-scheduler")
    assert own["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": PROFILE}
    assert own["spec"]["ingress"] == [{
        "from": [{"namespaceSelector": {"matchLabels": {"numalign.io/metrics-scraper": "true"}}}],
        "ports": [{"port": "https", "protocol": "TCP"}]}]


def test_without_the_component_nothing_of_it(objs: list[Obj]) -> None:
    plain = kustomize(CONFIG / "default")
    assert not [o for o in plain if "scheduler" in o["metadata"]["name"]]
    assert {o["kind"] for o in objs if "numalign-scheduler" in o["metadata"]["name"]} == {
        "Deployment", "ConfigMap", "ServiceAccount", "ClusterRoleBinding", "Role",
        "RoleBinding", "NetworkPolicy"}
