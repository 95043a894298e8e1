"""The dev cluster's kube-scheduler configuration: a ``KubeSchedulerConfiguration`` with
numalign's scheduler extender (``numalign extender``, filter, prioritize and bind, node names
only, ignorable) when the cluster has one, written to ``<state>/scheduler-config.yaml``.

With a configuration file kube-scheduler ignores its deprecated client flags
(``--kubeconfig``, ``--kube-api-qps``/``--kube-api-burst``), so they are set here too.
The extender entry is the one ``config/extender/scheduler-config.yaml`` ships.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CONFIG_FILE = "scheduler-config.yaml"
EXTENDER_TIMEOUT = "5s"  # a stuck extender costs a pod at most this (then ignored)


def extender_entry(url: str) -> dict[str, Any]:
    """The ``extenders`` entry of a KubeSchedulerConfiguration for ``numalign extender``
    at ``url``."""
    return {
        "urlPrefix": url,
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "bindVerb": "bind",
        "weight": 1,
        "nodeCacheCapable": True,
        "ignorable": True,
        "enableHTTPS": url.startswith("https:"),
        "httpTimeout": EXTENDER_TIMEOUT,
    }


def scheduler_config(kubeconfig: Path, qps_flags: tuple[str, ...],
                     extender_url: str | None) -> dict[str, Any]:
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
        doc["extenders"] = [extender_entry(extender_url)]
    return doc


def write_scheduler_config(state_dir: Path, kubeconfig: Path, qps_flags: tuple[str, ...],
                           extender_url: str | None) -> Path:
    path = state_dir / CONFIG_FILE
    path.write_text(yaml.safe_dump(scheduler_config(kubeconfig, qps_flags, extender_url),
                                   sort_keys=False))
    return path
