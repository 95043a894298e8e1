"""The dev cluster's kube-scheduler configuration: a ``KubeSchedulerConfiguration`` with
numalign's scheduler extender (``numalign extender``, filter, prioritize and bind, node names
only, ignorable) when the cluster has one, written to ``<state>/scheduler-config.yaml``.
Over HTTPS the entry carries ``tlsConfig``: the CA of the extender's serving certificate
and the scheduler's client certificate (the extender answers no one else).

With a configuration file kube-scheduler ignores its deprecated client flags
(``--kubeconfig``, ``--kube-api-qps``/``--kube-api-burst``), so they are set here too.
The extender entry is the one ``config/extender/scheduler-config.yaml`` ships.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CONFIG_FILE = "scheduler-config.yaml"
EXTENDER_TIMEOUT = "5s"  # a stuck extender costs a pod at most this (then ignored)
# kube-scheduler passes the extender only the nodes its own filters found before it stopped
# looking (by default 50 % - nodes/125 of them, at least 100 nodes and 5 %): every feasible
# node, so that a NUMA-aligned node is not missed (config/extender/scheduler-config.yaml).
PERCENTAGE_OF_NODES_TO_SCORE = 100


@dataclass(frozen=True)
class ExtenderTls:
    """kube-scheduler's ``tlsConfig`` towards the extender (files, PEM)."""

    ca_file: Path  # verifies the extender's serving certificate
    cert_file: Path  # the scheduler's client certificate (the extender's --client-ca signed it)
    key_file: Path

    def config(self) -> dict[str, str]:
        return {"caFile": str(self.ca_file), "certFile": str(self.cert_file),
                "keyFile": str(self.key_file)}


def extender_entry(url: str, tls: ExtenderTls | None = None) -> dict[str, Any]:
    """The ``extenders`` entry of a KubeSchedulerConfiguration for ``numalign extender``
    at ``url`` (``tls``: with an https ``url``, the scheduler's ``tlsConfig``)."""
    https = url.startswith("https:")
    if tls is not None and not https:
        raise ValueError(f"{url}: a tlsConfig needs an https:// extender URL")
    entry: dict[str, Any] = {
        "urlPrefix": url,
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "bindVerb": "bind",
        "weight": 1,
        "nodeCacheCapable": True,
        "ignorable": True,
        "enableHTTPS": https,
        "httpTimeout": EXTENDER_TIMEOUT,
    }
    if tls is not None:
        entry["tlsConfig"] = tls.config()
    return entry


def scheduler_config(kubeconfig: Path, qps_flags: tuple[str, ...],
                     extender_url: str | None,
                     extender_tls: ExtenderTls | None = None) -> dict[str, Any]:
    client: dict[str, Any] = {"kubeconfig": str(kubeconfig)}
    for flag in qps_flags:
        name, _, value = flag.partition("=")
        if name == "--kube-api-qps":
            client["qps"] = float(value)
        elif name == "--kube-api-burst":
            client["burst"] = int(value)
    doc: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": client,
        "leaderElection": {"leaderElect": False},
        "enableProfiling": False,
    }
    if extender_url is not None:
        doc["percentageOfNodesToScore"] = PERCENTAGE_OF_NODES_TO_SCORE
        doc["extenders"] = [extender_entry(extender_url, extender_tls)]
    return doc


def write_scheduler_config(state_dir: Path, kubeconfig: Path, qps_flags: tuple[str, ...],
                           extender_url: str | None,
                           extender_tls: ExtenderTls | None = None) -> Path:
    path = state_dir / CONFIG_FILE
    doc = scheduler_config(kubeconfig, qps_flags, extender_url, extender_tls)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
