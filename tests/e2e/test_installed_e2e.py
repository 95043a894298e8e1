"""numalign installed the way users install it (issue 19): ``numalign dev up --real-node
--nri --install helm`` -- the chart, the image ``numalign.local/numalign:dev`` imported
into the real node's containerd, the operator (StatefulSet, two replicas in peering) and
the real node's agent (DaemonSet) running as pods, reaching the API server through the
``kubernetes`` Service (kube-proxy), the API server calling the webhooks through their
Service. No numalign process runs on the host.

One cluster of its own for the module (its API server listens on an address pods reach),
started once; the tests run in file order on it:

1. a pod's policy is resolved at creation by the in-cluster webhook and the in-cluster
   agent places it through NRI: its process's ``Cpus_allowed_list`` is its
   ``numalign.io/allocation`` is NodeTopology's;
2. a pod the agent rejects (TopologyAffinityError) is redeployed by the in-cluster
   operator;
3. the active operator replica stopped: the standby takes over, handles the next
   rejection, and the webhooks keep answering meanwhile;
4. ``helm upgrade`` with a changed value reaches the pods; ``helm uninstall`` leaves
   nothing but the CRDs (README "Install with Helm").

Printed: the seconds from ``dev up --install helm`` to every numalign pod Ready, and from
the active replica's stop to the standby's redeploy of the next rejection."""

from __future__ import annotations

import contextlib
import json
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
import yaml
from kubernetes import client, config

from e2e_helpers import MACHINES, wait_for
from nri_helpers import admitted, admitted_container_cpus, allocation, exclusive, running
from numalign.api.names import ANN_RESOLVED, EVENT_REDEPLOY, REJECT_REASON
from numalign.devcluster import DevCluster, ensure_built
from numalign.devcluster.helmbuild import ensure_helm_built
from numalign.devcluster.install import CHART, NAMESPACE, RELEASE, Installer
from numalign.devcluster.nodebuild import ensure_node_built
from numalign.devcluster.realnode import RealNode, cannot_run_containers
from realnode_helpers import DEVICE, REDEPLOY, workload_pod

pytestmark = pytest.mark.cluster

OPERATOR = "numalign-operator"


@dataclass
class Installed:
    cluster: DevCluster
    node: RealNode
    installer: Installer
    api: Any
    ready_s: float

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    def helm(self, *args: str) -> str:
        proc = subprocess.run([str(ensure_helm_built()), *args, "--namespace", NAMESPACE,
                               "--kubeconfig", str(self.cluster.kubeconfig)],
                              capture_output=True, text=True, timeout=300, check=False)
        assert proc.returncode == 0, f"helm {' '.join(args)}:\n{proc.stderr}"
        return proc.stdout


def _say(m: str) -> None:
    print(f"[installed] {m}", flush=True)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """``numalign dev up --real-node --nri --install helm`` in a cluster of its own."""
    reason = cannot_run_containers()
    if reason is not None:
        pytest.skip(f"this machine cannot run containers: {reason}")
    ensure_built(log=_say)
    ensure_node_built(log=_say)
    ensure_helm_built(log=_say)
    state = Path(tempfile.mkdtemp(prefix="numalign-in-"))
    cluster = DevCluster(state, name="installed", ephemeral=True)
    logs = tmp_path_factory.mktemp("installed-logs")
    try:
        t0 = time.monotonic()
        cluster.up(in_cluster=True, log=_say)
        node = RealNode(cluster, MACHINES / "realnode-2numa.yaml", mode="nri",
                        host_agent=False).up(log=_say, timeout=300)
        installer = Installer(cluster, node, "helm")
        installer.install(log=_say, timeout=300)
        ready_s = time.monotonic() - t0
        _say(f"dev up --install helm: every numalign pod Ready in {ready_s:.1f}s")
        api = config.new_client_from_config(str(cluster.kubeconfig))
        try:
            yield Installed(cluster, node, installer, api, ready_s)
        finally:
            api.close()
    finally:
        for src in (state / "realnode" / "logs", state / "logs"):
            if src.is_dir():
                shutil.copytree(src, logs / src.parent.name, dirs_exist_ok=True)
        _say(f"its logs are kept in {logs}")
        cluster.down(log=_say)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture
def ns(installed: Installed) -> Iterator[str]:
    name = f"inst-{uuid.uuid4().hex[:6]}"
    installed.core.create_namespace({"metadata": {"name": name}})
    wait_for(lambda: installed.core.list_namespaced_service_account(
        name, field_selector="metadata.name=default").items, 30, "the default account")
    try:
        yield name
    finally:
        with contextlib.suppress(client.ApiException):
            installed.core.delete_namespace(name)


def _resolved_at_creation(installed: Installed, ns: str) -> dict[str, Any] | None:
    """What the webhook resolves for a pod created in ``ns`` now (a dry run: nothing is
    stored); None when the pod came back unresolved (no webhook answered)."""
    pod = installed.core.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
        "spec": {"containers": [{"name": "c", "image": "numalign.local/none"}]}},
        dry_run="All")
    text = (pod.metadata.annotations or {}).get(ANN_RESOLVED)
    return json.loads(text) if text else None


@contextlib.contextmanager
def topology_policy(installed: Installed, ns: str, name: str,
                    spec: dict[str, Any]) -> Iterator[None]:
    """The TopologyPolicy, once both replicas' webhooks resolve ``ns``'s pods to it (a
    standby refreshes its cache every few seconds: controller/cache.py)."""
    api = client.CustomObjectsApi(installed.api)
    api.create_cluster_custom_object("numalign.io", "v1alpha1", "topologypolicies", {
        "apiVersion": "numalign.io/v1alpha1", "kind": "TopologyPolicy",
        "metadata": {"name": name}, "spec": spec})
    seen = [0]

    def resolves() -> bool:
        got = _resolved_at_creation(installed, ns)
        seen[0] = seen[0] + 1 if got and got["source"] == f"TopologyPolicy/{name}" else 0
        return seen[0] >= 6  # the Service spreads them over both replicas

    try:
        wait_for(resolves, 60, f"the webhooks resolving {ns}'s pods to {name}", interval=0.3)
        yield
    finally:
        api.delete_cluster_custom_object("numalign.io", "v1alpha1", "topologypolicies", name)


def _pods(installed: Installed, component: str) -> list[Any]:
    return installed.core.list_namespaced_pod(
        NAMESPACE, label_selector=f"app.kubernetes.io/name=numalign-{component}").items


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _rejected_and_redeployed(installed: Installed, ns: str, app: str) -> Any:
    """Wait until the agent rejected a pod of Deployment ``app`` and the operator
    redeployed it; return the Redeploy event."""
    def redeployed() -> Any:
        for ev in installed.core.list_namespaced_event(ns).items:
            if ev.reason == EVENT_REDEPLOY and ev.involved_object.name.startswith(app):
                return ev
        return None

    ev = wait_for(redeployed, 180, f"the operator's {EVENT_REDEPLOY} of {app}", interval=0.2)
    rejected = [e for e in installed.core.list_namespaced_event(ns).items
                if e.reason == REJECT_REASON and e.involved_object.name.startswith(app)]
    assert rejected, f"no {REJECT_REASON} event for {app}"
    return ev


def _rejected_deployment(installed: Installed, ns: str, app: str) -> None:
    """A Deployment of one pod that the real node's agent rejects under single-numa-node:
    1 CPU and both sample devices, one on each NUMA node."""
    pod = workload_pod(app, extra={DEVICE: "2"})
    client.AppsV1Api(installed.api).create_namespaced_deployment(ns, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": app},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
                 "template": {"metadata": {"labels": {"app": app}}, "spec": pod["spec"]}}})


def test_numalign_runs_as_pods_behind_its_services(installed: Installed) -> None:
    operators, agents = _pods(installed, "operator"), _pods(installed, "agent")
    assert len(operators) == 2 and len(agents) == 1
    for pod in (*operators, *agents):
        assert pod.spec.node_name == "localhost" and _ready(pod), pod.metadata.name
        [c] = pod.spec.containers
        assert c.image == "numalign.local/numalign:dev"
    assert not installed.node.process("agent").is_running()  # no host agent
    assert "operator" not in installed.cluster.processes()  # nor a host operator
    # The webhooks are called through their Service; pods reach the API server through
    # the kubernetes Service, whose endpoint is the API server's pod-reachable address.
    admission = client.AdmissionregistrationV1Api(installed.api)
    hooks = admission.read_mutating_webhook_configuration("numalign.io").webhooks
    assert hooks and all(h.client_config.service.name == "numalign-webhook"
                         and h.client_config.url is None for h in hooks)
    ep = installed.core.read_namespaced_endpoints("kubernetes", "default")
    assert [a.ip for s in ep.subsets for a in s.addresses] == [
        installed.cluster.state()["hostAddress"]]
    print(f"dev up --install helm to every numalign pod Ready: {installed.ready_s:.1f}s")


def test_the_in_cluster_webhook_resolves_and_the_agent_places(installed: Installed,
                                                              ns: str) -> None:
    name = f"tp-{ns}"
    with topology_policy(installed, ns, name, {"policy": "single-numa-node",
                                               "namespaces": [ns]}):
        # The mutating webhook answers the create itself: the resolved policy is in the
        # object the API server returns (the backstop would patch it only later).
        created = installed.core.create_namespaced_pod(ns, workload_pod("placed"))
        resolved = json.loads((created.metadata.annotations or {})[ANN_RESOLVED])
        assert (resolved["policy"], resolved["source"]) == (
            "single-numa-node", f"TopologyPolicy/{name}")

        def placed() -> Any:
            pod = installed.core.read_namespaced_pod("placed", ns)
            return pod if pod.status.phase == "Running" and allocation(pod) else None

        pod = wait_for(placed, 180, "pod placed Running with its allocation")
        mine = exclusive(allocation(pod), "work")
        reserved = int(installed.node.state()["reservedCPUs"])
        assert len(mine) == 1 and reserved not in mine
        [run] = [r for r in running(installed.node, namespace=ns).values()
                 if r.pod_uid == pod.metadata.uid]
        assert run.status_cpus == run.cgroup_cpus == mine
        entry = wait_for(lambda: admitted(installed.api).get((ns, "placed")), 60,
                         "the pod in NodeTopology localhost status")
        assert admitted_container_cpus(entry, "work") == mine
        installed.core.delete_namespaced_pod("placed", ns, grace_period_seconds=0)
        wait_for(lambda: not running(installed.node, namespace=ns), 60, "the pod gone")


def _active_replica(installed: Installed) -> str:
    peering = client.CustomObjectsApi(installed.api).get_cluster_custom_object(
        "kopf.dev", "v1", "clusterkopfpeerings", "numalign")
    peers = (peering.get("status") or {})
    assert {p for p in peers if p.startswith(OPERATOR)} == {f"{OPERATOR}-0", f"{OPERATOR}-1"}
    return max(peers, key=lambda p: int(peers[p].get("priority", 0)))


def test_rejections_are_redeployed_and_the_standby_takes_over(installed: Installed,
                                                              ns: str) -> None:
    apps = client.AppsV1Api(installed.api)
    name = f"tp-{ns}"
    with topology_policy(installed, ns, name, {"policy": "single-numa-node",
                                               "namespaces": [ns], "redeploy": REDEPLOY}):
        active = _active_replica(installed)
        assert active == f"{OPERATOR}-1"  # the highest index
        _rejected_deployment(installed, ns, "first")
        ev = _rejected_and_redeployed(installed, ns, "first")
        assert ev.reporting_instance == active, ev
        apps.delete_namespaced_deployment("first", ns)
        wait_for(lambda: not [p for p in installed.core.list_namespaced_pod(ns).items
                              if p.spec.node_name == "localhost"], 60, "the node free")

        # Stop the active replica (the release down to one replica: the StatefulSet stops
        # the highest index with SIGTERM, as a drain or an eviction would) and at once
        # bring the next rejection.
        values = str(installed.installer.dir / "values.yaml")
        installed.helm("upgrade", RELEASE, str(CHART), "--values", values,
                       "--set", "operator.replicas=1")
        t0 = time.monotonic()
        _rejected_deployment(installed, ns, "second")
        ev = _rejected_and_redeployed(installed, ns, "second")
        failover = time.monotonic() - t0
        print(f"operator failover: the active replica stopped -> the standby redeployed the "
              f"next rejection in {failover:.1f}s")
        assert ev.reporting_instance == f"{OPERATOR}-0"
        # The webhooks answer with the active replica gone (the Service routes to the
        # ready standby): pods created now are resolved at creation.
        for _ in range(4):
            got = _resolved_at_creation(installed, ns)
            assert got and got["source"] == f"TopologyPolicy/{name}", got
        installed.helm("upgrade", RELEASE, str(CHART), "--values", values)
        wait_for(installed.installer.ready, 180, "both replicas Ready again")


def test_helm_upgrade_then_uninstall_leaves_only_the_crds(installed: Installed) -> None:
    values = installed.installer.dir / "values.yaml"
    installed.helm("upgrade", RELEASE, str(CHART), "--values", str(values), "--set",
                   "operator.extraArgs={--verbose}")

    def upgraded() -> bool:
        pods = _pods(installed, "operator")
        return len(pods) == 2 and all(
            _ready(p) and p.spec.containers[0].args[-1] == "--verbose" for p in pods)

    wait_for(upgraded, 240, "the operator's pods replaced with --verbose, Ready")
    rendered = [d for d in yaml.safe_load_all(installed.helm(
        "template", RELEASE, str(CHART), "--values", str(values))) if d]
    installed.helm("uninstall", RELEASE, "--wait", "--timeout", "3m")
    kubectl = installed.installer.kubectl
    left = []
    for obj in rendered:
        kind = obj["kind"].lower() + "." + (obj["apiVersion"].rpartition("/")[0] or "")
        ns_args = ["-n", NAMESPACE] if obj["kind"] in {
            "ServiceAccount", "Role", "RoleBinding", "Service", "StatefulSet", "DaemonSet",
            "PodDisruptionBudget", "NetworkPolicy", "ConfigMap"} else []
        out = kubectl("get", kind.rstrip("."), obj["metadata"]["name"], *ns_args,
                      "--ignore-not-found", "-o", "name")
        if out.strip():
            left.append(out.strip())
    assert not left, f"helm uninstall left {left}"
    wait_for(lambda: not installed.core.list_namespaced_pod(NAMESPACE).items, 120,
             "numalign's pods gone")
    # What README says stays: the CRDs (and the operator's certificate Secret).
    for crd in ("nodetopologies.numalign.io", "topologypolicies.numalign.io",
                "clusterkopfpeerings.kopf.dev"):
        kubectl("get", "crd", crd)
    secrets = kubectl("get", "secrets", "-n", NAMESPACE, "-o", "name").split()
    assert secrets == ["secret/numalign-webhook-cert"], secrets
