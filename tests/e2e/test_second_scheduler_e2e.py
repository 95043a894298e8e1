"""The second scheduler, installed as users install it where the cluster's scheduler
cannot be configured (README "Managed control planes"): the chart with
``extender.enabled``, ``extender.tls.generate`` and ``scheduler.enabled`` into a cluster
of its own with a real node (``numalign dev up --real-node --install helm`` plus those
values): kube-scheduler from numalign's image as a Deployment, its profile
``numalign-scheduler`` calling the in-cluster extender over mutual TLS (the client
certificate the chart generated), leader election on its Lease, the RBAC the chart
grants it and nothing more. A pod that names it is bound by it, through the extender
(which counts its filter and binds it); a pod that does not keeps the cluster's default
scheduler.

The dev cluster has no cluster DNS, so the scheduler is pointed at the extender
Service's ClusterIP (``scheduler.extenderURL``, by ``helm upgrade`` once the Service
exists); the certificate is still checked for ``numalign-extender.<namespace>.svc``."""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from e2e_helpers import MACHINES, wait_for
from numalign.devcluster import DevCluster, ensure_built
from numalign.devcluster.helmbuild import ensure_helm_built
from numalign.devcluster.install import CHART, NAMESPACE, RELEASE, TOLERATION, Installer
from numalign.devcluster.nodebuild import ensure_node_built
from numalign.devcluster.realnode import RealNode, cannot_run_containers
from realnode_helpers import burstable_pod

pytestmark = pytest.mark.cluster

PROFILE = "numalign-scheduler"
NO_CPU = {"requests": {"cpu": "0", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "512Mi"}}
VALUES = {
    "extender": {"enabled": True, "tls": {"generate": True}, "tolerations": [TOLERATION],
                 "resources": NO_CPU},
    "scheduler": {"enabled": True, "tolerations": [TOLERATION], "resources": NO_CPU},
}


@dataclass
class Second:
    cluster: DevCluster
    api: Any

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def helm(self, *args: str) -> str:
        proc = subprocess.run([str(ensure_helm_built()), *args, "--namespace", NAMESPACE,
                               "--kubeconfig", str(self.cluster.kubeconfig)],
                              capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stderr}"
        return proc.stdout

    def pod_of(self, component: str) -> Any:
        [pod] = [p for p in self.core.list_namespaced_pod(
            NAMESPACE, label_selector=f"app.kubernetes.io/name=numalign-{component}").items
            if p.metadata.deletion_timestamp is None]
        return pod


def _say(m: str) -> None:
    print(f"[second-scheduler] {m}", flush=True)


def _rolled_out(api: Any, name: str) -> bool:
    dep = client.AppsV1Api(api).read_namespaced_deployment(name, NAMESPACE)
    s = dep.status
    return bool(s.observed_generation and s.observed_generation >= dep.metadata.generation
                and s.updated_replicas == dep.spec.replicas == s.ready_replicas == s.replicas)


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Second]:
    reason = cannot_run_containers()
    if reason is not None:
        pytest.skip(f"this machine cannot run containers: {reason}")
    ensure_built(log=_say)
    ensure_node_built(log=_say)
    ensure_helm_built(log=_say)
    state = Path(tempfile.mkdtemp(prefix="numalign-2s-"))
    cluster = DevCluster(state, name="second-scheduler", ephemeral=True)
    logs = tmp_path_factory.mktemp("second-scheduler-logs")
    try:
        cluster.up(in_cluster=True, log=_say)
        node = RealNode(cluster, MACHINES / "realnode-2numa.yaml",
                        host_agent=False).up(log=_say, timeout=300)
        Installer(cluster, node, "helm", values=VALUES).install(log=_say, timeout=300)
        api = config.new_client_from_config(str(cluster.kubeconfig))
        s = Second(cluster, api)
        try:
            ip = s.core.read_namespaced_service("numalign-extender", NAMESPACE).spec.cluster_ip
            s.helm("upgrade", RELEASE, str(CHART), "--reuse-values", "--set",
                   f"scheduler.extenderURL=https://{ip}:8890")
            t = time.monotonic()
            for name in ("numalign-extender", "numalign-scheduler"):
                wait_for(lambda n=name: _rolled_out(api, n), 240, f"{name} rolled out")
            _say(f"extender and second scheduler Ready {time.monotonic() - t:.1f}s after "
                 "the upgrade")
            yield s
        finally:
            with contextlib.suppress(Exception):
                for component in ("scheduler", "extender"):
                    pod = s.pod_of(component)
                    (logs / f"{component}.log").write_text(s.core.read_namespaced_pod_log(
                        pod.metadata.name, NAMESPACE))
            api.close()
    finally:
        for src in (state / "realnode" / "logs", state / "logs"):
            if src.is_dir():
                shutil.copytree(src, logs / src.parent.name, dirs_exist_ok=True)
        _say(f"its logs are kept in {logs}")
        cluster.down(log=_say)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def ns(second: Second) -> Iterator[str]:
    name = f"second-{uuid.uuid4().hex[:6]}"
    second.core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: second.core.list_namespaced_service_account(
        name, field_selector="metadata.name=default").items, 30, "the default account")
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            second.core.delete_namespace(name)


def _metric(second: Second, name: str, **labels: str) -> float:
    """A sample of the extender's /metrics (its probes port, through the API server's pod
    proxy); 0 when absent."""
    pod = second.pod_of("extender").metadata.name
    text = second.core.connect_get_namespaced_pod_proxy_with_path(
        f"{pod}:8891", NAMESPACE, "metrics")
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = rf"^{re.escape(name)}(?:\{{{re.escape(want)}\}})? (\S+)$"
    m = re.search(pattern, text, re.M)
    return float(m.group(1)) if m else 0.0


def _scheduled_by(second: Second, ns: str, pod: str) -> str:
    """The controller that reported the pod's Scheduled event."""
    def event() -> Any:
        for ev in second.core.list_namespaced_event(ns).items:
            if ev.reason == "Scheduled" and ev.involved_object.name == pod:
                return ev
        return None

    ev = wait_for(event, 120, f"{pod}'s Scheduled event")
    return str(ev.reporting_component or ev.source.component)


def test_the_second_scheduler_runs_as_installed(second: Second) -> None:
    pod = second.pod_of("scheduler")
    [c] = pod.spec.containers
    assert c.image == "numalign.local/numalign:dev"
    assert c.command[0] == "/usr/local/bin/kube-scheduler"
    assert pod.spec.service_account_name == "numalign-scheduler"
    # leader election on its own Lease, held by its pod (kube-scheduler's identity is
    # its host name, the pod's name, and a suffix)
    def holder() -> str:
        lease = client.CoordinationV1Api(second.api).read_namespaced_lease(PROFILE, NAMESPACE)
        return str(lease.spec.holder_identity or "")

    wait_for(lambda: holder().startswith(pod.metadata.name + "_"), 90,
             f"{pod.metadata.name} holding the Lease {PROFILE}")
    # what its RBAC does not grant it, it cannot do (no cluster-admin)
    review = client.AuthorizationV1Api(second.api).create_subject_access_review({
        "spec": {"user": f"system:serviceaccount:{NAMESPACE}:numalign-scheduler",
                 "resourceAttributes": {"verb": "get", "resource": "secrets",
                                        "namespace": NAMESPACE}}})
    assert review.status.allowed is False


def test_pods_that_name_it_are_bound_by_it_through_the_extender(second: Second,
                                                                ns: str) -> None:
    filters = _metric(second, "numalign_extender_filter_duration_seconds_count")
    bound = _metric(second, "numalign_extender_binds_total", outcome="bound")
    ours = burstable_pod("ours")
    ours["spec"]["schedulerName"] = PROFILE
    second.core.create_namespaced_pod(ns, ours)
    second.core.create_namespaced_pod(ns, burstable_pod("theirs"))
    for name in ("ours", "theirs"):
        wait_for(lambda n=name: second.core.read_namespaced_pod(n, ns).spec.node_name, 120,
                 f"pod {name} bound")
    assert _scheduled_by(second, ns, "ours") == PROFILE
    assert _scheduled_by(second, ns, "theirs") == "default-scheduler"
    # the extender filtered and bound the second scheduler's pod (it serves that
    # scheduler's pods: --scheduler-name)
    assert _metric(second, "numalign_extender_filter_duration_seconds_count") > filters
    assert _metric(second, "numalign_extender_binds_total", outcome="bound") == bound + 1
