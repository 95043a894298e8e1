"""The chart's lifecycle on the real API server: ``helm install`` creates every object
the chart renders (and the CRDs of its crds/), ``helm upgrade`` with changed values
changes them (and adds the extender, with the TLS Secrets the chart generates and keeps
across later upgrades, and the Grafana dashboard), ``helm uninstall``
removes everything but what README "Install with Helm" says stays: the CRDs. No kubelet
runs, so the pods stay Pending: the objects are what is checked here (the pods'
behaviour is the in-cluster e2e's)."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from numalign.api import crdgen
from numalign.devcluster import DevCluster
from numalign.devcluster.helmbuild import helm_path, is_helm_built
from numalign.devcluster.policies import install_policies, load_policies

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not is_helm_built(), reason=f"helm is not built in {helm_path()} "
                                                   "(numalign dev build builds it)"),
]

CHART = Path(__file__).resolve().parents[2] / "charts" / "numalign"
RELEASE = "numalign"
NRT_CRD = "noderesourcetopologies.topology.node.k8s.io"
Kubectl = Callable[..., subprocess.CompletedProcess[str]]
Obj = dict[str, Any]
# What the upgrade turns on besides nrt: components whose objects need no CRDs of others.
UPGRADED = ("operator.replicas=3", "extender.enabled=true", "extender.tls.generate=true",
            "grafana.dashboard.enabled=true")
EXTENDER_SECRETS = ("numalign-extender-tls", "numalign-extender-scheduler")


def _ref(obj: Obj) -> list[str]:
    """kubectl get arguments naming ``obj`` (its kind with the API group)."""
    group = obj["apiVersion"].rpartition("/")[0]
    kind = obj["kind"].lower() + (f".{group}" if group else "")
    ns = obj["metadata"].get("namespace")
    return [kind, obj["metadata"]["name"], *(["-n", ns] if ns else [])]


class Helm:
    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.kubeconfig, self.namespace = kubeconfig, namespace

    def __call__(self, *args: str) -> str:
        proc = subprocess.run([str(helm_path()), *args, "--kubeconfig", str(self.kubeconfig),
                               "--namespace", self.namespace], capture_output=True,
                              text=True, timeout=180, check=False)
        assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stderr}"
        return proc.stdout

    def objects(self, *sets: str) -> list[Obj]:
        flags = [f for s in sets for f in ("--set", s)]
        out = self("template", RELEASE, str(CHART), *flags)
        return [d for d in yaml.safe_load_all(out) if d]


def _exists(kubectl: Kubectl, obj: Obj) -> bool:
    proc = kubectl("get", *_ref(obj), "--ignore-not-found", "-o", "name", check=False)
    if "doesn't have a resource type" in proc.stderr:  # its CRD is not installed
        return False
    assert proc.returncode == 0, proc.stderr
    return bool(proc.stdout.strip())


def _get(kubectl: Kubectl, *ref: str) -> Obj:
    doc: Obj = yaml.safe_load(kubectl("get", *ref, "-o", "yaml").stdout)
    return doc


def _wait_gone(kubectl: Kubectl, objs: list[Obj], timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    left = objs
    while left and time.monotonic() < deadline:
        left = [o for o in left if _exists(kubectl, o)]
        if left:
            time.sleep(0.5)
    return [f"{o['kind']}/{o['metadata']['name']}" for o in left]


@pytest.fixture
def release_ns(kubectl: Kubectl, kubeconfig: Path, dev_cluster: DevCluster) -> Iterator[str]:
    """A namespace for the release, labelled as README says; the chart's cluster-scoped
    objects (fixed names: one release per cluster) must not be left by an earlier test.
    The dev cluster installs config/tenancy's admission policies itself (numalign runs as
    host processes there): they make way for the chart's and are put back afterwards."""
    own = [[d["kind"].lower(), d["metadata"]["name"]] for d in load_policies()
           if d["kind"].startswith(("ValidatingAdmissionPolicy", "MutatingAdmissionPolicy"))]
    for ref in own:
        kubectl("delete", *ref, "--ignore-not-found")
    ns = f"numalign-helm-{uuid.uuid4().hex[:6]}"
    cluster_scoped = [o for o in Helm(kubeconfig, ns).objects(*UPGRADED)
                      if "namespace" not in o["metadata"]
                      and o["kind"] != "CustomResourceDefinition"]
    left = _wait_gone(kubectl, cluster_scoped)
    assert not left, f"objects of an earlier install are still there: {left}"
    nrt_before = bool(kubectl("get", "crd", NRT_CRD, "--ignore-not-found", "-o", "name").stdout)
    kubectl("create", "namespace", ns)
    kubectl("label", "namespace", ns, "pod-security.kubernetes.io/enforce=privileged")
    try:
        yield ns
    finally:
        subprocess.run([str(helm_path()), "uninstall", RELEASE, "--kubeconfig",
                        str(kubeconfig), "--namespace", ns], capture_output=True,
                       timeout=180, check=False)
        kubectl("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
        if not nrt_before:
            kubectl("delete", "crd", NRT_CRD, "--ignore-not-found", check=False)
        _wait_gone(kubectl, cluster_scoped)
        install_policies(dev_cluster.kube())


def test_install_upgrade_uninstall(kubectl: Kubectl, kubeconfig: Path,
                                   release_ns: str) -> None:
    helm = Helm(kubeconfig, release_ns)
    t0 = time.monotonic()
    helm("install", RELEASE, str(CHART), "--set", "image.tag=dev")
    installed = time.monotonic() - t0
    objs = helm.objects("image.tag=dev")
    missing = [f"{o['kind']}/{o['metadata']['name']}" for o in objs if not _exists(kubectl, o)]
    assert not missing, f"helm install did not create {missing}"
    for name in crdgen.chart_files():
        for crd in yaml.safe_load_all((CHART / "crds" / name).read_text()):
            kubectl("get", "crd", crd["metadata"]["name"])
    sts = _get(kubectl, "statefulset", "numalign-operator", "-n", release_ns)
    assert sts["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert sts["spec"]["replicas"] == 2
    [container] = sts["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/numalign/numalign:dev"
    binding = _get(kubectl, "validatingadmissionpolicybinding",
                   "numalign-agent-node-restriction")
    assert binding["spec"]["paramRef"]["namespace"] == release_ns

    # The dev cluster installs the NodeResourceTopology CRD itself (as node-feature-
    # discovery would): then the chart must not (nrt.installCRD=false, as README says).
    nrt_sets = ["nrt.enabled=true"]
    if kubectl("get", "crd", NRT_CRD, "--ignore-not-found", "-o", "name").stdout.strip():
        nrt_sets.append("nrt.installCRD=false")
    helm("upgrade", RELEASE, str(CHART), "--reuse-values",
         *[f for s in (*UPGRADED, *nrt_sets) for f in ("--set", s)])
    sts = _get(kubectl, "statefulset", "numalign-operator", "-n", release_ns)
    assert sts["spec"]["replicas"] == 3
    ds = _get(kubectl, "daemonset", "numalign-agent", "-n", release_ns)
    assert "--publish-nrt" in ds["spec"]["template"]["spec"]["containers"][0]["args"]
    kubectl("get", "crd", NRT_CRD)
    upgraded = helm.objects("image.tag=dev", *UPGRADED, *nrt_sets)
    missing = [f"{o['kind']}/{o['metadata']['name']}" for o in upgraded
               if not _exists(kubectl, o)]
    assert not missing, f"helm upgrade did not create {missing}"
    ext = _get(kubectl, "deployment", "numalign-extender", "-n", release_ns)
    [container] = ext["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/numalign/numalign:dev"
    assert _get(kubectl, "clusterrolebinding", "numalign-extender")["subjects"][0][
        "namespace"] == release_ns
    dashboard = _get(kubectl, "configmap", "numalign-dashboard", "-n", release_ns)
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    # The generated certificates stay what they are on later upgrades (kube-scheduler's
    # copy of its client certificate stays valid), and so does the extender's pod.
    certs = {n: _get(kubectl, "secret", n, "-n", release_ns)["data"] for n in EXTENDER_SECRETS}
    assert set(certs["numalign-extender-tls"]) == {"tls.crt", "tls.key", "ca.crt"}
    assert (certs["numalign-extender-tls"]["ca.crt"]
            == certs["numalign-extender-scheduler"]["ca.crt"])
    template = ext["spec"]["template"]
    helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set", "operator.replicas=2")
    assert {n: _get(kubectl, "secret", n, "-n", release_ns)["data"]
            for n in EXTENDER_SECRETS} == certs
    assert _get(kubectl, "deployment", "numalign-extender", "-n", release_ns)["spec"][
        "template"] == template

    helm("uninstall", RELEASE)
    crds = [o for o in upgraded if o["kind"] == "CustomResourceDefinition"]
    rest = [o for o in upgraded if o["kind"] != "CustomResourceDefinition"]
    left = _wait_gone(kubectl, rest)
    assert not left, f"helm uninstall left {left}"
    for crd in crds:  # crds/ and the kept NodeResourceTopology CRD
        assert _exists(kubectl, crd), f"{crd['metadata']['name']} was removed"
    print(f"helm install (objects only) took {installed:.1f}s")
