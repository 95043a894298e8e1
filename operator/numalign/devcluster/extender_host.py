"""numalign's scheduler extender as a host process of the dev cluster (``numalign
extender``, :meth:`DevCluster.start_extender`), with no more rights than installed:

* towards the API server it is the user ``numalign-extender`` (a client certificate of
  the cluster CA in its own ``extender.kubeconfig``, never the admin's), bound to a
  ClusterRole with the rules of ``config/extender/rbac.yaml``'s ``numalign-extender``:
  get/list/watch pods and NodeTopologies, create pods/binding;
* its verbs (filter, prioritize, bind) are HTTPS on 127.0.0.1 (a serving certificate of
  the extender CA) and answer only a client certificate that CA signed: kube-scheduler's
  (``tlsConfig`` of its configuration, :class:`~.scheduler.ExtenderTls`);
* its probes (``/healthz``, ``/readyz``, ``/metrics``) are plain HTTP on a second
  loopback port (``--probe-port``): the readiness wait and ``dev status`` read them.

The ClusterRole and its binding are named ``numalign-dev-extender``: ``numalign-extender``
belongs to the installed manifests (``dev up --install``), which replace and remove it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ..api.kube import SyncKube
from .certs import EXTENDER_USER, Pki
from .crds import create_or_replace
from .scheduler import ExtenderTls

EXTENDER = "extender"  # its process name (pid file, log)
KUBECONFIG = "extender.kubeconfig"
RBAC_FILE = Path(__file__).resolve().parents[3] / "config" / "extender" / "rbac.yaml"
INSTALLED_ROLE = "numalign-extender"  # the ClusterRole of RBAC_FILE whose rules it gets
ROLE = "numalign-dev-extender"
RBAC_API = "/apis/rbac.authorization.k8s.io/v1"


@dataclass(frozen=True)
class Endpoints:
    """Where the extender listens: its verbs (HTTPS) and its probes (HTTP)."""

    port: int
    probe_port: int

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def probe_url(self) -> str:
        return f"http://127.0.0.1:{self.probe_port}"

    def to_state(self) -> dict[str, Any]:
        return {"port": self.port, "url": self.url, "probePort": self.probe_port,
                "probeUrl": self.probe_url}


def scheduler_tls(pki: Pki) -> ExtenderTls:
    """kube-scheduler's side: trust the extender CA, present its client certificate."""
    return ExtenderTls(ca_file=pki.extender_ca, cert_file=pki.scheduler_extender_client.cert,
                       key_file=pki.scheduler_extender_client.key)


def extender_argv(pki: Pki, kubeconfig: Path, endpoints: Endpoints) -> list[str]:
    """``python`` arguments of the extender process."""
    return ["-m", "numalign.cli", "extender", "--kubeconfig", str(kubeconfig),
            "--addr", "127.0.0.1", "--port", str(endpoints.port),
            "--tls-cert", str(pki.extender_serving.cert),
            "--tls-key", str(pki.extender_serving.key),
            "--client-ca", str(pki.extender_ca),
            "--probe-addr", "127.0.0.1", "--probe-port", str(endpoints.probe_port)]


def rbac_objects(rbac_file: Path = RBAC_FILE) -> list[tuple[str, dict[str, Any]]]:
    """(collection, object): the ClusterRole ``numalign-dev-extender`` with the rules of
    ``rbac_file``'s ClusterRole ``numalign-extender``, and its binding to the user
    ``numalign-extender``. OSError, ValueError: the file is missing or has no such role."""
    docs = [d for d in yaml.safe_load_all(rbac_file.read_text()) if isinstance(d, dict)]
    rules = next((d.get("rules") for d in docs if d.get("kind") == "ClusterRole"
                  and (d.get("metadata") or {}).get("name") == INSTALLED_ROLE), None)
    if not isinstance(rules, list) or not rules:
        raise ValueError(f"{rbac_file}: no ClusterRole {INSTALLED_ROLE} with rules")
    labels = {"app.kubernetes.io/managed-by": "numalign-dev"}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": ROLE, "labels": labels}, "rules": rules}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": ROLE, "labels": labels},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": ROLE},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                             "name": EXTENDER_USER}]}
    return [(f"{RBAC_API}/clusterroles", role), (f"{RBAC_API}/clusterrolebindings", binding)]


def install_rbac(kube: SyncKube, rbac_file: Path = RBAC_FILE) -> None:
    """Create or update :func:`rbac_objects` (as the admin). OSError, ValueError,
    ApiError."""
    for collection, obj in rbac_objects(rbac_file):
        create_or_replace(kube, collection, obj)
