"""Helpers for the end-to-end scenarios: the emulated-node agent as a subprocess, pods and
Deployments that the real scheduler places, and reading back what happened."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

import testdata
from numalign.api.names import REJECT_REASON
from operator_helpers import wait_for

MACHINES = testdata.MACHINES
POOL_LABEL = "numalign.io/e2e-pool"
ROLE_LABEL = "numalign.io/e2e-role"
PAUSE = "registry.k8s.io/pause:3.10"


@dataclass
class AgentProcess:
    """One ``numalign agent --emulate`` process serving several emulated nodes."""

    kubeconfig: Path
    machines: list[tuple[str, int]]  # machine file stem, count
    start_index: int
    log: Path
    pool: str = ""  # value of POOL_LABEL on every node of this agent
    proc: subprocess.Popen[bytes] | None = None
    nodes: dict[str, str] = field(default_factory=dict)  # node name -> machine stem

    def __post_init__(self) -> None:
        for stem, count in self.machines:
            for i in range(count):
                self.nodes[f"{stem}-{self.start_index + i}"] = stem

    def start(self) -> AgentProcess:
        argv = [sys.executable, "-m", "numalign.cli", "agent", "--kubeconfig",
                str(self.kubeconfig), "--start", str(self.start_index),
                "--publish-interval", "0.3", "--lease-interval", "5"]
        for stem, count in self.machines:
            argv += ["--emulate", f"{MACHINES / f'{stem}.yaml'}={count}"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                         env=dict(os.environ))
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def of(self, stem: str) -> list[str]:
        return sorted(n for n, s in self.nodes.items() if s == stem)


def custom(api: client.ApiClient) -> Any:
    return client.CustomObjectsApi(api)


def node_topology(api: client.ApiClient, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = custom(api).get_cluster_custom_object(
            "numalign.io", "v1alpha1", "nodetopologies", name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return obj


def guaranteed_pod(name: str, cpu: int, *, labels: dict[str, str] | None = None,
                   annotations: dict[str, str] | None = None,
                   node_selector: dict[str, str] | None = None,
                   node_name: str | None = None, memory: str = "1Gi") -> dict[str, Any]:
    """A Guaranteed pod (integer CPUs: exclusive CPUs) the real scheduler places among the
    nodes that ``node_selector`` selects (or bound to ``node_name``)."""
    res = {"cpu": str(cpu), "memory": memory}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": PAUSE,
                        "resources": {"requests": res, "limits": res}}],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
            "spec": spec}


def deployment(name: str, replicas: int, cpu: int,
               node_selector: dict[str, str]) -> dict[str, Any]:
    pod = guaranteed_pod("x", cpu, labels={"app": name}, node_selector=node_selector)
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": pod["metadata"], "spec": pod["spec"]}}}


def pods(core: Any, ns: str) -> list[Any]:
    return list(core.list_namespaced_pod(ns).items)


def phase(pod: Any) -> str:
    return str(pod.status.phase or "")


def annotation_json(pod: Any, key: str) -> dict[str, Any] | None:
    text = (pod.metadata.annotations or {}).get(key)
    if not text:
        return None
    doc: dict[str, Any] = json.loads(text)
    return doc


def rejection_events(core: Any, ns: str) -> list[Any]:
    """The agent's Warning events, one per rejected pod."""
    return [e for e in core.list_namespaced_event(ns).items
            if e.reason == REJECT_REASON and e.type == "Warning"]


def rejected_uids(core: Any, ns: str) -> set[str]:
    return {str(e.involved_object.uid) for e in rejection_events(core, ns)}


def redeploy_records(core: Any, ns: str) -> dict[str, dict[str, Any]]:
    """The operator's durable redeploy records (ConfigMap numalign-redeploy)."""
    try:
        cm = core.read_namespaced_config_map("numalign-redeploy", ns)
    except ApiException as e:
        if e.status == 404:
            return {}
        raise
    return {k: json.loads(v) for k, v in (cm.data or {}).items()}


def delete_namespaces(core: Any, names: Iterable[str], timeout: float = 90) -> None:
    """Delete namespaces and wait until they are gone, so that the agent has released
    every pod's resources before the next scenario uses the same nodes."""
    names = list(names)
    for n in names:
        try:
            core.delete_namespace(n)
        except ApiException as e:
            if e.status != 404:
                raise

    def gone() -> bool:
        for n in names:
            try:
                core.read_namespace(n)
                return False
            except ApiException as e:
                if e.status != 404:
                    raise
        return True

    wait_for(gone, timeout, f"namespaces {', '.join(names)} deleted")


def cpus_free(api: client.ApiClient, node: str) -> str | None:
    nt = node_topology(api, node)
    summary = ((nt or {}).get("status") or {}).get("summary") or {}
    value = summary.get("cpus")
    return str(value) if value is not None else None


def redeploy_selector(agent: AgentProcess) -> dict[str, str]:
    """The node selector of the agent's fragmented-8numa and dual-16core nodes."""
    return {POOL_LABEL: agent.pool, ROLE_LABEL: "redeploy"}
