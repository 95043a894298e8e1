"""The scheduler extender against the real kube-scheduler of the session's cluster (its
configuration names the extender, ignorable; this module runs ``numalign extender``):
pods are placed right the first time, a burst beyond the aligned room waits Pending
(never Failed), parked pods run soon after room appears, best-effort pods still land on
fragmented nodes, and with the extender stopped pods schedule and the redeploy catches the
rejections.

Nodes (see conftest.py): 2 x fragmented-8numa (8 NUMA nodes of 4 CPUs) and 2 x
dual-16core (2 NUMA nodes of 16 CPUs). A 6-CPU single-numa-node pod fits only a
dual-16core NUMA node: 2 per NUMA node, 8 in all, although the scheduler sees 128 CPUs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from e2e_helpers import (
    AgentProcess,
    delete_namespaces,
    deployment,
    guaranteed_pod,
    node_topology,
    phase,
    pods,
    redeploy_selector,
    rejected_uids,
    wait_for,
)
from numalign.devcluster import DevCluster
from operator_helpers import OperatorProcess, delete_policy, operator, policy

pytestmark = pytest.mark.cluster

CPU = 6
ALIGNED_ROOM = 8  # 6-CPU pods on one NUMA node: 2 per dual-16core NUMA node


@pytest.fixture(scope="module")
def extender(dev_cluster: DevCluster) -> Iterator[DevCluster]:
    """``numalign extender`` where the session's kube-scheduler calls it."""
    dev_cluster.start_extender()
    try:
        yield dev_cluster
    finally:
        dev_cluster.stop_extender()


@pytest.fixture(scope="module")
def module_operator(kubeconfig: Path, k8s_client: Any,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """One operator for the module: it resolves the namespaces' policy and redeploys."""
    log = tmp_path_factory.mktemp("extender-op") / "op.log"
    with operator(kubeconfig, k8s_client, log) as op:
        yield op
        assert "Traceback" not in op.text(), op.text()[-4000:]


@pytest.fixture
def snn(core: Any, k8s_client: Any, namespace: str, e2e_agent: AgentProcess,
        module_operator: OperatorProcess) -> Iterator[str]:
    """The test's namespace under single-numa-node (pod scope) with redeploy, on empty
    nodes."""
    name = f"ext-{namespace}"[:60]
    policy(k8s_client, name, {
        "policy": "single-numa-node", "scope": "pod", "namespaces": [namespace],
        "redeploy": {"enabled": True, "maxAttempts": 3, "backoffSeconds": 1,
                     "avoidRejectingNodes": True}}, seen=True)

    def empty() -> bool:
        return all(not ((node_topology(k8s_client, n) or {}).get("status") or {}).get(
            "admitted") for n in [*e2e_agent.of("fragmented-8numa"),
                                  *e2e_agent.of("dual-16core")])

    wait_for(empty, 90, "the nodes of this test empty")
    try:
        yield namespace
    finally:
        delete_policy(k8s_client, name)
        delete_namespaces(core, [namespace])


def _by_phase(core: Any, ns: str, app: str | None = None) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for p in pods(core, ns):
        if app is None or (p.metadata.labels or {}).get("app") == app:
            out.setdefault(phase(p), []).append(p)
    return out


def _extender_refusals(core: Any, ns: str) -> list[str]:
    return [e.message for e in core.list_namespaced_event(ns).items
            if e.reason == "FailedScheduling" and "numalign: policy" in (e.message or "")]


def _binds(cluster: DevCluster) -> float:
    """Pods the extender bound (its bind verb: the scheduler's configuration has it), from
    /metrics on its probe port (its verbs' port answers kube-scheduler's certificate only)."""
    url = f"{cluster.extender_probe_url}/metrics"
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
               if s.name == "numalign_extender_binds_total" and s.labels == {"outcome": "bound"})


def _story(core: Any, ns: str, cluster: DevCluster) -> str:
    events = sorted((str(e.last_timestamp), e.reason, e.involved_object.name, e.message)
                    for e in core.list_namespaced_event(ns).items)
    placed = sorted((p.metadata.name, phase(p), p.spec.node_name) for p in pods(core, ns))
    log = cluster.log_file("extender")
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    return f"events {events}\npods {placed}\nextender log:\n{tail}"


def test_burst_waits_pending_and_runs_when_room_appears(
        core: Any, apps: Any, snn: str, e2e_agent: AgentProcess,
        extender: DevCluster) -> None:
    ns = snn
    dual = set(e2e_agent.of("dual-16core"))
    binds = _binds(extender)
    # Two pods hold room first, then a burst of eight: six fit, two wait.
    nodes = redeploy_selector(e2e_agent)
    apps.create_namespaced_deployment(ns, deployment("holder", 2, CPU, nodes))
    wait_for(lambda: len(_by_phase(core, ns, "holder").get("Running", [])) == 2, 60,
             "the two holders Running")
    apps.create_namespaced_deployment(ns, deployment("burst", ALIGNED_ROOM, CPU,
                                                     redeploy_selector(e2e_agent)))
    wait_for(lambda: len(_by_phase(core, ns, "burst").get("Running", [])) == ALIGNED_ROOM - 2,
             90, "six of the burst Running")
    wait_for(lambda: _extender_refusals(core, ns), 30, "the scheduler's FailedScheduling "
             "event with the extender's refusals")
    time.sleep(5)  # the surplus is parked as unschedulable by now
    state = _by_phase(core, ns)
    assert len(state.get("Pending", [])) == 2, state
    assert not state.get("Failed"), state
    assert all(p.spec.node_name is None for p in state["Pending"])
    assert all(p.spec.node_name in dual for p in state["Running"])
    assert not rejected_uids(core, ns), _story(core, ns, extender)  # no node rejected any
    message = _extender_refusals(core, ns)[-1]
    assert "TopologyAffinityError: Resources cannot be allocated with Topology locality" \
        in message, message
    assert "numalign: policy single-numa-node, scope pod" in message, message
    assert _binds(extender) - binds == 2 + ALIGNED_ROOM - 2  # the extender bound them

    # Room appears: the holders go. The parked pods run within a minute.
    t0 = time.monotonic()
    apps.delete_namespaced_deployment("holder", ns)
    wait_for(lambda: len(_by_phase(core, ns, "burst").get("Running", [])) == ALIGNED_ROOM,
             60, "the parked pods Running after room appeared")
    waited = time.monotonic() - t0
    assert not rejected_uids(core, ns)
    assert not _by_phase(core, ns).get("Failed")
    print(json.dumps({"parked_to_running_seconds": round(waited, 1)}))


def test_best_effort_pod_is_not_kept_off_a_fragmented_node(
        core: Any, snn: str, e2e_agent: AgentProcess, extender: DevCluster,
        kubeconfig: Path) -> None:
    ns = snn
    node = e2e_agent.of("fragmented-8numa")[0]
    pin = {"kubernetes.io/hostname": node}
    for i in range(8):  # 3 of 4 CPUs of every NUMA node taken
        core.create_namespaced_pod(ns, guaranteed_pod(f"frag-{i}", 3, node_selector=pin))
    wait_for(lambda: len(_by_phase(core, ns).get("Running", [])) == 8, 60,
             "eight 3-CPU pods Running on the fragmented node")
    core.create_namespaced_pod(ns, guaranteed_pod("aligned", 2, node_selector=pin))
    burstable = guaranteed_pod("burstable", 1, node_selector=pin)
    burstable["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "500m",
                                                                    "memory": "64Mi"}}
    core.create_namespaced_pod(ns, burstable)
    wait_for(lambda: phase(core.read_namespaced_pod("burstable", ns)) == "Running", 60,
             "the burstable pod Running on the fragmented node")
    wait_for(lambda: _extender_refusals(core, ns), 30, "the 2-CPU pod refused")
    aligned = core.read_namespaced_pod("aligned", ns)
    assert phase(aligned) == "Pending" and aligned.spec.node_name is None
    assert not rejected_uids(core, ns)

    # numalign explain on the Pending pod: which nodes refuse it, and why
    proc = subprocess.run([sys.executable, "-m", "numalign.cli", "explain", "aligned", "-n", ns,
                           "--kubeconfig", str(kubeconfig), "-o", "json"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["bound"] is False
    assert node in doc["refused"], doc["nodes"]
    assert doc["refused"][node].startswith("TopologyAffinityError: ")
    assert node not in doc["fits"]
    assert set(e2e_agent.of("dual-16core")) <= set(doc["fits"])
    assert "TopologyAffinityError" in (doc["scheduler"] or "")


def test_with_the_extender_stopped_pods_schedule_and_the_redeploy_catches_rejections(
        core: Any, apps: Any, snn: str, e2e_agent: AgentProcess,
        extender: DevCluster) -> None:
    """The same Deployment, steered to the fragmented nodes (preferred affinity): placed
    right with the extender; with it stopped, the nodes reject and the operator
    redeploys, and every pod still ends Running."""
    ns = snn
    dual = set(e2e_agent.of("dual-16core"))

    def steered(name: str) -> dict[str, Any]:
        d = deployment(name, 2, CPU, redeploy_selector(e2e_agent))
        d["spec"]["template"]["spec"]["affinity"] = {"nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100, "preference": {"matchExpressions": [{
                    "key": "kubernetes.io/hostname", "operator": "In",
                    "values": e2e_agent.of("fragmented-8numa")}]}}]}}
        return d

    apps.create_namespaced_deployment(ns, steered("placed"))
    wait_for(lambda: len(_by_phase(core, ns, "placed").get("Running", [])) == 2, 60,
             "both pods placed Running")
    assert all(p.spec.node_name in dual for p in _by_phase(core, ns, "placed")["Running"])
    assert not rejected_uids(core, ns)

    extender.stop_extender()
    apps.create_namespaced_deployment(ns, steered("unplaced"))
    wait_for(lambda: rejected_uids(core, ns), 60, "a node rejecting a pod (no extender)")
    wait_for(lambda: len(_by_phase(core, ns, "unplaced").get("Running", [])) == 2, 120,
             "the redeployed pods Running")
    running = _by_phase(core, ns, "unplaced")["Running"]
    assert all(p.spec.node_name in dual for p in running)
