"""config/extender: the scheduler extender's component renders on config/default with a
hardened Deployment, least RBAC (read pods and NodeTopologies, create pods/binding for the
bind verb, nothing else), a Service and a NetworkPolicy. Its verbs are served over mutual
TLS only (the Secret numalign-extender-tls: serving certificate and the client CA),
probes and /metrics on a second, plain-HTTP port; the verbs port admits only the
scheduler's addresses, the probes port only Prometheus's namespaces. Its
KubeSchedulerConfiguration fragment is the entry the dev cluster runs, over HTTPS with
the scheduler's client certificate."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from config_helpers import CONFIG, IMAGE, containers, kustomize, of_kind, pod_spec
from numalign.devcluster.scheduler import (
    PERCENTAGE_OF_NODES_TO_SCORE,
    ExtenderTls,
    extender_entry,
)

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
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"https": 8890, "probes": 8891}
    # The kubelet presents no client certificate: the probes use the plain-HTTP port.
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        assert c[probe]["httpGet"] == {"path": path, "port": "probes"}
    # Mutual TLS on the verbs: the serving certificate and the CA of the scheduler's
    # client certificate, from the Secret, read-only.
    args = c["args"]
    assert "--port=8890" in args and "--probe-port=8891" in args
    [mount] = [m for m in c["volumeMounts"] if m["name"] == "tls"]
    assert mount["readOnly"] is True
    folder = mount["mountPath"]
    for flag, key in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key"),
                      ("--client-ca", "ca.crt")):
        assert f"{flag}={folder}/{key}" in args, (flag, args)
    [volume] = [v for v in spec["volumes"] if v["name"] == "tls"]
    assert volume["secret"]["secretName"] == "numalign-extender-tls"
    # The key is readable by the extender's group only, not by every user of the node.
    assert volume["secret"]["defaultMode"] == 0o440
    assert spec["securityContext"]["fsGroup"] == sc["runAsGroup"] == 65532

    [role] = [r for r in of_kind(objs, "ClusterRole")
              if r["metadata"]["name"] == "numalign-extender"]
    grants = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
              for r in rule["resources"] for v in rule["verbs"]}
    dra = [("resource.k8s.io", r) for r in ("deviceclasses", "resourceclaimtemplates",
                                             "resourceclaims", "resourceslices")]
    assert grants == {(g, r, v) for g, r in (("", "pods"), ("numalign.io", "nodetopologies"),
                                             *dra)
                      for v in ("get", "list", "watch")} | {("", "pods/binding", "create")}
    [binding] = [b for b in of_kind(objs, "ClusterRoleBinding")
                 if b["metadata"]["name"] == "numalign-extender"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "numalign-extender",
                                    "namespace": "numalign-system"}]
    assert binding["roleRef"]["name"] == "numalign-extender"

    [svc] = [s for s in of_kind(objs, "Service") if s["metadata"]["name"] == "numalign-extender"]
    # The Service is the scheduler's way in: the verbs only.
    assert [(p["port"], p["targetPort"]) for p in svc["spec"]["ports"]] == [(8890, "https")]
    [netpol] = [n for n in of_kind(objs, "NetworkPolicy")
                if n["metadata"]["name"] == "numalign-extender"]
    assert netpol["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert netpol["spec"]["policyTypes"] == ["Ingress"]
    allowed = {p["port"]: rule.get("from") for rule in netpol["spec"]["ingress"]
               for p in rule["ports"]}
    assert set(allowed) == {"https", "probes"}
    # The verbs only from the scheduler's addresses (a placeholder to replace: it admits
    # nobody as shipped; a rule without `from` would admit every pod).
    assert allowed["https"] == [{"ipBlock": {"cidr": "192.0.2.0/24"}}]
    # /metrics only from the namespaces Prometheus runs in.
    assert allowed["probes"] == [{"namespaceSelector": {"matchLabels": {
        "numalign.io/metrics-scraper": "true"}}}]


def test_prometheus_scrapes_the_extender_on_its_probes_port(tmp_path: Path) -> None:
    """The extender's /metrics is on the plain-HTTP port: Prometheus has no client
    certificate for the verbs port."""
    default = yaml.safe_load((CONFIG / "default" / "kustomization.yaml").read_text())
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(CONFIG / "default", tmp_path)],
        "components": [os.path.relpath(CONFIG / c, tmp_path)
                       for c in ("extender", "prometheus")],
        "images": default["images"]}))
    objs = kustomize(tmp_path)
    [monitor] = [m for m in of_kind(objs, "PodMonitor")
                 if m["metadata"]["name"] == "numalign-extender"]
    [dep] = [o for o in of_kind(objs, "Deployment")
             if o["metadata"]["name"] == "numalign-extender"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("probes", "/metrics")
    assert endpoint.get("scheme", "http") == "http"


def test_scheduler_config_fragment_is_what_the_dev_cluster_runs() -> None:
    doc = yaml.safe_load((CONFIG / "extender" / "scheduler-config.yaml").read_text())
    assert doc["kind"] == "KubeSchedulerConfiguration"
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    [entry] = doc["extenders"]
    tls = entry["tlsConfig"]
    assert entry == extender_entry(entry["urlPrefix"], ExtenderTls(
        Path(tls["caFile"]), Path(tls["certFile"]), Path(tls["keyFile"])))
    assert entry["nodeCacheCapable"] is True and entry["ignorable"] is True
    # HTTPS with the scheduler's client certificate: the extender answers no one else.
    assert entry["urlPrefix"] == "https://CLUSTER-IP:8890" and entry["enableHTTPS"] is True
    assert [Path(tls[k]).name for k in ("caFile", "certFile", "keyFile")] == [
        "ca.crt", "scheduler.crt", "scheduler.key"]  # `numalign extender-certs`' files
    assert "insecure" not in tls
    # the extender judges every node that passes kube-scheduler's own filters
    assert doc["percentageOfNodesToScore"] == PERCENTAGE_OF_NODES_TO_SCORE == 100
