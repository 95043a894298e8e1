"""config/extender: the scheduler extender's component renders on config/default with a
hardened Deployment, least RBAC (read pods and NodeTopologies, create pods/binding for the
bind verb, nothing else), a Service and
a NetworkPolicy; its KubeSchedulerConfiguration fragment is the entry the dev cluster
runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from test_config_static import CONFIG, IMAGE, containers, kustomize, of_kind, pod_spec

from numalign.devcluster.scheduler import extender_entry

Obj = dict[str, Any]


def _with_extender(tmp_path: Path) -> list[Obj]:
    """An overlay of config/default with the component (and the image it names, as the
    README says: the component is outside config/default's image transformer)."""
    default = yaml.safe_load((CONFIG / "default" / "kustomization.yaml").read_text())
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(CONFIG / "default", tmp_path)],
        "components": [os.path.relpath(CONFIG / "extender", tmp_path)],
        "images": default["images"]}))
    return kustomize(tmp_path)


def test_extender_component(tmp_path: Path) -> None:
    objs = _with_extender(tmp_path)
    [dep] = [o for o in of_kind(objs, "Deployment")
             if o["metadata"]["name"] == "numalign-extender"]
    assert dep["metadata"]["namespace"] == "numalign-system"
    assert dep["spec"]["replicas"] == 1
    spec = pod_spec(dep)
    assert spec["serviceAccountName"] == "numalign-extender"
    [c] = list(containers(dep))
    assert c["image"] == IMAGE
    assert c["args"][0] == "extender"
    sc = {**spec["securityContext"], **c["securityContext"]}
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and "ALL" in sc["capabilities"]["drop"]
    assert {"cpu", "memory"} <= set(c["resources"]["limits"])
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"

    [role] = [r for r in of_kind(objs, "ClusterRole")
              if r["metadata"]["name"] == "numalign-extender"]
    grants = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
              for r in rule["resources"] for v in rule["verbs"]}
    assert grants == {(g, r, v) for g, r in (("", "pods"), ("numalign.io", "nodetopologies"))
                      for v in ("get", "list", "watch")} | {("", "pods/binding", "create")}
    [binding] = [b for b in of_kind(objs, "ClusterRoleBinding")
                 if b["metadata"]["name"] == "numalign-extender"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "numalign-extender",
                                    "namespace": "numalign-system"}]
    assert binding["roleRef"]["name"] == "numalign-extender"

    [svc] = [s for s in of_kind(objs, "Service") if s["metadata"]["name"] == "numalign-extender"]
    assert svc["spec"]["ports"][0]["port"] == 8890
    [netpol] = [n for n in of_kind(objs, "NetworkPolicy")
                if n["metadata"]["name"] == "numalign-extender"]
    assert netpol["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert [p["port"] for rule in netpol["spec"]["ingress"] for p in rule["ports"]] == ["http"]


def test_scheduler_config_fragment_is_what_the_dev_cluster_runs() -> None:
    doc = yaml.safe_load((CONFIG / "extender" / "scheduler-config.yaml").read_text())
    assert doc["kind"] == "KubeSchedulerConfiguration"
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    [entry] = doc["extenders"]
    assert entry == {**extender_entry(entry["urlPrefix"])}
    assert entry["nodeCacheCapable"] is True and entry["ignorable"] is True
