"""numalign installed into the dev cluster as a user installs it (``numalign dev up
--real-node [--nri] --install kustomize|helm``): the dev image
(``numalign.local/numalign:dev``, :mod:`.images.numalign_image`) imported into the real
node's containerd, then ``config/default`` (``kubectl apply -k`` of an overlay) or the
chart (``helm upgrade --install``) with what this node needs and nothing else:

- the image;
- the operator tolerating the real node's taint (it is the only node that runs
  containers);
- the operator and the agent requesting no CPU: the real node has one allocatable CPU,
  which a guaranteed workload takes whole (their limits stay);
- the agent with the kubelet-resources component (the kubelet's pod-resources socket
  and configuration) and, in nri mode, the nri component (containerd's NRI socket), each
  host path the real node's own: its sysfs view, its kubelet's root dir and
  configuration, its containerd folder.

Every other field is config/'s or the chart's. The overlay and the values file are
written to ``<state dir>/install/``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from ..api.kube import REQUEST_ERRORS
from .cluster import DevCluster, DevClusterError
from .helmbuild import ensure_helm_built
from .images.numalign_image import IMAGE, build_image
from .images.oci import ImageError
from .realnode import RealNode
from .realnode_config import MODE_NRI, TAINT

Log = Callable[[str], None]

METHODS = ("kustomize", "helm")
NAMESPACE = "numalign-system"
RELEASE = "numalign"
REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "config"
CHART = REPO / "charts" / "numalign"
TOLERATION = {"key": TAINT["key"], "operator": "Equal", "value": TAINT["value"],
              "effect": TAINT["effect"]}
CRD_LABEL = "app.kubernetes.io/part-of=numalign"


class InstallError(DevClusterError):
    """numalign could not be installed; the message says why."""


def _quiet(_m: str) -> None:
    pass


def _components(real: RealNode) -> list[str]:
    return ["kubelet-resources", *(["nri"] if real.mode == MODE_NRI else [])]


def helm_values(real: RealNode) -> dict[str, Any]:
    repository, _, tag = IMAGE.rpartition(":")
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        "operator": {"tolerations": [TOLERATION],
                     "resources": {"requests": {"cpu": "0", "memory": "128Mi"},
                                   "limits": {"cpu": "1", "memory": "512Mi"}}},
        "agent": {"hostSys": str(real.dir / "sys"),
                  "resources": {"requests": {"cpu": "0", "memory": "64Mi"},
                                "limits": {"cpu": "500m", "memory": "256Mi"}}},
        "kubeletResources": {"enabled": True,
                             "podResourcesDir": str(real.pod_resources_socket.parent),
                             "configFile": str(real.kubelet_config)},
        "nri": {"enabled": real.mode == MODE_NRI, "socketDir": str(real.nri_socket.parent)},
    }


def kustomization(real: RealNode, at: Path) -> dict[str, Any]:
    """An overlay of config/default in folder ``at`` for this node."""
    repository, _, tag = IMAGE.rpartition(":")
    volumes = [{"name": "sys", "hostPath": {"path": str(real.dir / "sys")}},
               {"name": "pod-resources",
                "hostPath": {"path": str(real.pod_resources_socket.parent)}},
               {"name": "kubelet-config", "hostPath": {"path": str(real.kubelet_config)}}]
    if real.mode == MODE_NRI:
        volumes.append({"name": "nri", "hostPath": {"path": str(real.nri_socket.parent)}})
    agent = {"apiVersion": "apps/v1", "kind": "DaemonSet",
             "metadata": {"name": "numalign-agent"},
             "spec": {"template": {"spec": {
                 "volumes": volumes,
                 "containers": [{"name": "agent", "resources": {"requests": {"cpu": "0"}}}]}}}}
    operator = {"apiVersion": "apps/v1", "kind": "StatefulSet",
                "metadata": {"name": "numalign-operator"},
                "spec": {"template": {"spec": {
                    "tolerations": [TOLERATION],
                    "containers": [{"name": "operator",
                                    "resources": {"requests": {"cpu": "0"}}}]}}}}
    return {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(CONFIG / "default", at)],
        "components": [os.path.relpath(CONFIG / c, at) for c in _components(real)],
        "images": [{"name": "ghcr.io/numalign/numalign", "newName": repository,
                    "newTag": tag}],
        "patches": [{"patch": yaml.safe_dump(agent)}, {"patch": yaml.safe_dump(operator)}],
    }


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s values, mappings merged key by key (Helm's ``-f`` order)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


class Installer:
    """Installs numalign into ``cluster`` for its running real node ``real``
    (``values``: with helm, chart values beyond this node's, e.g. optional components)."""

    def __init__(self, cluster: DevCluster, real: RealNode, method: str,
                 values: dict[str, Any] | None = None) -> None:
        if method not in METHODS:
            raise InstallError(f"--install {method!r}: expected one of {', '.join(METHODS)}")
        if values and method != "helm":
            raise InstallError("chart values need --install helm")
        self.cluster, self.real, self.method = cluster, real, method
        self.values = values or {}
        self.dir = cluster.state_dir / "install"
        self.env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))

    def run(self, *argv: str, timeout: float = 180.0) -> str:
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=self.env,
                              timeout=timeout, check=False)
        if proc.returncode != 0:
            raise InstallError(f"'{' '.join(argv[:3])} ...' failed: "
                               f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
        return proc.stdout

    def kubectl(self, *args: str, timeout: float = 180.0) -> str:
        exe = shutil.which("kubectl")
        if exe is None:
            raise InstallError("kubectl is not on PATH: install kubectl and run again")
        return self.run(exe, *args, timeout=timeout)

    def install(self, log: Log | None = None, timeout: float = 300.0) -> float:
        """Import the image, install, wait until every numalign pod is Ready; returns the
        seconds from the start of the install to Ready."""
        say = log or _quiet
        t = time.monotonic()
        try:
            archive, _ = build_image(log=say)
        except ImageError as e:
            raise InstallError(f"the image: {e}") from None
        self.real.import_archive(archive)
        say(f"{IMAGE} imported into the real node's containerd ({time.monotonic() - t:.1f}s)")
        t = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.method == "helm":
            self._helm(say)
        else:
            self._kustomize(say)
        self.wait_ready(time.monotonic() + timeout)
        took = time.monotonic() - t
        say(f"numalign installed with {self.method}: every pod Ready {took:.1f}s after "
            "the install began")
        return took

    def _helm(self, say: Log) -> None:
        helm = ensure_helm_built(log=say)
        values = self.dir / "values.yaml"
        values.write_text(yaml.safe_dump(merged(helm_values(self.real), self.values),
                                         sort_keys=False))
        if not self.kubectl("get", "namespace", NAMESPACE, "--ignore-not-found", "-o", "name"):
            self.kubectl("create", "namespace", NAMESPACE)
        # README "Install with Helm": the agent's host paths need the privileged level.
        self.kubectl("label", "--overwrite", "namespace", NAMESPACE,
                     "pod-security.kubernetes.io/enforce=privileged")
        self.run(str(helm), "upgrade", "--install", RELEASE, str(CHART), "--namespace",
                 NAMESPACE, "--values", str(values), "--kubeconfig",
                 str(self.cluster.kubeconfig))
        say(f"helm upgrade --install {RELEASE} {CHART} -n {NAMESPACE} -f {values}")

    def _kustomize(self, say: Log) -> None:
        (self.dir / "kustomization.yaml").write_text(
            yaml.safe_dump(kustomization(self.real, self.dir), sort_keys=False))
        try:
            self.kubectl("apply", "--server-side", "-k", str(self.dir))
        except InstallError:
            # The ClusterKopfPeering needs Kopf's CRDs, created by the same apply: once
            # they are Established, the second apply creates it (README "Install on a
            # cluster" does the same in two steps).
            self.kubectl("wait", "--for", "condition=Established", "crd", "-l", CRD_LABEL,
                         "--timeout=60s")
            self.kubectl("apply", "--server-side", "-k", str(self.dir))
        say(f"kubectl apply --server-side -k {self.dir}")

    def ready(self) -> bool:
        """The operator's StatefulSet and the agent's DaemonSet have every pod Ready."""
        kube = self.cluster.kube()
        base = f"/apis/apps/v1/namespaces/{NAMESPACE}"
        try:
            sts = kube.get_quiet(f"{base}/statefulsets/numalign-operator") or {}
            ds = kube.get_quiet(f"{base}/daemonsets/numalign-agent") or {}
        except REQUEST_ERRORS:
            return False
        want = int((sts.get("spec") or {}).get("replicas") or 0)
        s_status, d_status = sts.get("status") or {}, ds.get("status") or {}
        desired = int(d_status.get("desiredNumberScheduled") or 0)
        return (want > 0 and int(s_status.get("readyReplicas") or 0) == want
                and int(s_status.get("updatedReplicas") or 0) == want
                and desired > 0 and int(d_status.get("numberReady") or 0) == desired
                and int(d_status.get("updatedNumberScheduled") or 0) == desired)

    def wait_ready(self, deadline: float) -> None:
        while not self.ready():
            if time.monotonic() > deadline:
                pods = self.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide")
                raise InstallError(f"numalign's pods are not all Ready:\n{pods}")
            time.sleep(0.5)
