"""The real node: a kubelet v1.37.2 and containerd built from source, the kubelet seeing
``realnode-2numa`` (two NUMA nodes of one CPU each) with the static CPU manager (one
reserved CPU) and the ``single-numa-node`` Topology Manager policy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from agent_helpers import given
from e2e_helpers import wait_for
from numalign.agent.podresources import PodResourcesError
from numalign.api.names import (
    EVENT_REDEPLOY,
    EVENT_REDEPLOY_EXHAUSTED,
    EVENT_REDEPLOY_GAVE_UP,
    EVENT_REDEPLOY_REPEAT,
    LABEL_MANAGED,
)
from operator_helpers import delete_policy, operator, policy
from realnode_helpers import (
    DEVICE,
    REDEPLOY,
    avoids_the_real_node,
    beside_an_emulated_node,
    burstable_pod,
    events_of,
    kubelet_get,
    prefers_the_real_node,
    real_node_can_take,
    running_real_node,
    status_line,
    story,
    wait_running,
    workload_pod,
)
from realnode_reports import explain, nodetopology, nrt_fingerprint, podresources

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def real_node(dev_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real kubelet and containerd (``numalign dev up --real-node``) in the session's
    cluster for this module's tests (removed after them, its Node and NodeTopology too),
    seeing ``realnode-2numa`` (this machine's first two CPUs as two NUMA nodes) with the
    ``single-numa-node`` policy. Skipped only where containers cannot run."""
    logs = tmp_path_factory.mktemp("realnode-logs")
    with running_real_node(dev_cluster, logs, "realnode", policy="single-numa-node") as node:
        yield node


@pytest.fixture
def namespace(namespace: str, real_node: Any, core: client.CoreV1Api) -> Iterator[str]:
    """The test's namespace; its pods deleted after it, and gone from the kubelet (so
    that the next test finds the node's CPUs and devices free)."""
    yield namespace
    _delete_and_forget(core, real_node, namespace)


def _cpu_manager_state(node: Any) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((node.kubelet_dir / "cpu_manager_state").read_text())
    return state


def test_a_guaranteed_pod_runs_pinned_by_the_static_cpu_manager(
        real_node: Any, core: client.CoreV1Api, namespace: str, kubectl: Any) -> None:
    core.create_namespaced_pod(namespace, workload_pod("pinned"))
    pod = wait_running(core, namespace, "pinned")
    assert pod.spec.node_name == "localhost"
    # Kubelet-managed: the Node does not say numalign manages it (dev up --real-node --nri).
    assert LABEL_MANAGED not in (core.read_node("localhost").metadata.labels or {})
    state = _cpu_manager_state(real_node)
    assert state["policyName"] == "static"
    assigned = state["entries"][pod.metadata.uid]["work"]
    reserved = real_node.state()["reservedCPUs"]
    assert assigned and assigned != reserved
    assert reserved in state["defaultCpuSet"]

    # The workload's own output, through the API server and the kubelet.
    def logged() -> str | None:
        out = kubectl("logs", "-n", namespace, "pinned", check=False)
        return out.stdout if "Cpus_allowed_list" in out.stdout else None

    logs = wait_for(logged, 60, "the workload's first lines")
    assert status_line(logs, "Cpus_allowed_list") == assigned
    # Memory stays the real machine's: the kubelet runs no memory manager here.
    assert status_line(logs, "Mems_allowed_list")

    out = kubectl("exec", "-n", namespace, "pinned", "--", "/workload", "status")
    assert status_line(out.stdout, "Cpus_allowed_list") == assigned


def test_a_burstable_pod_shares_the_pool_with_the_reserved_cpu(
        real_node: Any, core: client.CoreV1Api, namespace: str, kubectl: Any) -> None:
    core.create_namespaced_pod(namespace, burstable_pod("shared"))
    got = wait_running(core, namespace, "shared")
    assert got.metadata.uid not in _cpu_manager_state(real_node).get("entries", {})

    # Its cpuset is the shared pool (the reserved CPU and every CPU no pinned container
    # holds), following it as pinned pods come and go (the CPU manager reconciles).
    def follows() -> tuple[str, str] | None:
        pool = _cpu_manager_state(real_node)["defaultCpuSet"]
        out = kubectl("exec", "-n", namespace, "shared", "--", "/workload", "status",
                      check=False).stdout
        return (pool, out) if "Cpus_allowed_list" in out and \
            status_line(out, "Cpus_allowed_list") == pool else None

    pool, _ = wait_for(follows, 60, "the burstable pod's cpuset to be the shared pool")
    assert real_node.state()["reservedCPUs"] in pool


def _delete_and_forget(core: client.CoreV1Api, node: Any, namespace: str) -> None:
    """Delete the namespace's pods (and what would recreate them) and wait until the
    kubelet released what they held."""
    apps = client.AppsV1Api(core.api_client)
    for d in apps.list_namespaced_deployment(namespace).items:
        apps.delete_namespaced_deployment(d.metadata.name, namespace)
    for rs in apps.list_namespaced_replica_set(namespace).items:
        apps.delete_namespaced_replica_set(rs.metadata.name, namespace)
    for pod in core.list_namespaced_pod(namespace).items:
        core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(namespace).items
             and not podresources(node, namespace), 120, "the pods gone from the real node")


def test_pods_with_devices_nodetopology_shows_what_podresources_reports(
        real_node: Any, core: client.CoreV1Api, namespace: str, kubectl: Any,
        k8s_client: Any, kubeconfig: Path) -> None:
    core.create_namespaced_pod(namespace, workload_pod("pinned-dev", extra={DEVICE: "1"}))
    core.create_namespaced_pod(namespace, burstable_pod("shared-dev", extra={DEVICE: "1"}))
    pinned = wait_running(core, namespace, "pinned-dev")
    wait_running(core, namespace, "shared-dev")

    kubelet = wait_for(lambda: (lambda pr: pr if len(pr) == 2 else None)(
        podresources(real_node, namespace)), 60, "PodResources to list both pods")
    cpus, devices = kubelet["pinned-dev"]["work"]
    assert cpus != "" and cpus != real_node.state()["reservedCPUs"]
    assert len(devices[DEVICE]) == 1
    assert kubelet["shared-dev"]["work"][0] == ""  # no exclusive CPUs
    both = devices[DEVICE] + kubelet["shared-dev"]["work"][1][DEVICE]
    assert sorted(both) == ["dev0", "dev1"]
    # single-numa-node: the pinned pod's device is on its CPU's NUMA node.
    numa = {str(c): n.id for n in real_node.machine().numa_nodes for c in n.cpus}
    device_numa = {d.id: d.numa_node for d in real_node.machine().devices}
    assert device_numa[devices[DEVICE][0]] == numa[cpus]

    wait_for(lambda: nodetopology(k8s_client, namespace) == kubelet, 60,
             f"NodeTopology localhost to show what PodResources lists: {kubelet}")
    # Its NodeResourceTopology (dev up --real-node publishes it) carries the pod
    # fingerprint scheduler-plugins computes from the API server's pods: both hold
    # exclusive resources (a pinned pod; a device the object lists).
    wait_for(lambda: nrt_fingerprint(k8s_client, core, namespace, ["pinned-dev", "shared-dev"]),
             60, "NodeResourceTopology localhost to carry the pods' fingerprint")

    logs = wait_for(lambda: (lambda o: o if "Cpus_allowed_list" in o else None)(
        kubectl("logs", "-n", namespace, "pinned-dev", check=False).stdout), 60,
        "the workload's output")
    assert status_line(logs, "Cpus_allowed_list") == cpus
    assert pinned.spec.node_name == "localhost"

    for name in ("pinned-dev", "shared-dev"):
        doc = explain(kubeconfig, namespace, name)
        assert doc["kubelet"]["admit"] is True and doc["kubelet"]["agree"] is True, doc


def test_the_kubelet_rejects_what_single_numa_node_cannot_align(
        real_node: Any, core: client.CoreV1Api, namespace: str, kubeconfig: Path) -> None:
    # One CPU is free (on NUMA node 1: CPU 0 is reserved) but two devices span both
    # NUMA nodes: no single NUMA node has both, and the Topology Manager says so.
    core.create_namespaced_pod(namespace, workload_pod("misfit", extra={DEVICE: "2"}))

    def failed() -> Any:
        pod = core.read_namespaced_pod("misfit", namespace)
        if pod.status.phase == "Running":
            raise AssertionError("the kubelet admitted a pod single-numa-node cannot align")
        return pod if pod.status.phase == "Failed" else None

    pod = wait_for(failed, 120, "the kubelet to reject the pod")
    assert pod.spec.node_name == "localhost"
    assert pod.status.reason == "TopologyAffinityError"
    assert "Topology" in (pod.status.message or "")
    assert not podresources(real_node, namespace)
    doc = explain(kubeconfig, namespace, "misfit")
    assert doc["kubelet"]["admit"] is False and doc["admit"] is False, doc
    assert doc["kubelet"]["agree"] is True, doc


def test_restarts_keep_the_pods_and_the_reported_state(
        real_node: Any, core: client.CoreV1Api, namespace: str, kubectl: Any,
        k8s_client: Any) -> None:
    core.create_namespaced_pod(namespace, workload_pod("steady", extra={DEVICE: "1"}))
    before = wait_running(core, namespace, "steady")
    kubelet = wait_for(lambda: podresources(real_node, namespace) or None, 60,
                       "PodResources to list the pod")
    wait_for(lambda: nodetopology(k8s_client, namespace) == kubelet, 60,
             "NodeTopology localhost to show the pod")
    nts = client.CustomObjectsApi(k8s_client)

    # The agent restarted with its NodeTopology gone: it reports the same state again.
    real_node.restart("agent", between=lambda: nts.delete_cluster_custom_object(
        "numalign.io", "v1alpha1", "nodetopologies", "localhost"))

    def republished() -> Any:
        try:
            return nodetopology(k8s_client, namespace) == kubelet
        except client.exceptions.ApiException as e:
            if e.status == 404:
                return False
            raise

    wait_for(republished, 90, f"the restarted agent to report {kubelet} again")

    # The kubelet restarted: the pod keeps running in the same container on the same CPU
    # (the kubelet's checkpoints), and PodResources lists the same allocation.
    cpus_before = _cpu_manager_state(real_node)["entries"][before.metadata.uid]["work"]
    real_node.restart("kubelet")
    after = core.read_namespaced_pod("steady", namespace)
    assert after.status.phase == "Running"
    assert after.status.container_statuses[0].container_id == \
        before.status.container_statuses[0].container_id
    assert after.status.container_statuses[0].restart_count == 0
    assert _cpu_manager_state(real_node)["entries"][before.metadata.uid]["work"] == cpus_before
    def relisted() -> bool:
        try:
            return podresources(real_node, namespace) == kubelet
        except PodResourcesError:  # its socket is not there yet
            return False

    wait_for(relisted, 60, "the restarted kubelet's PodResources to list the same allocation")
    wait_for(lambda: nodetopology(k8s_client, namespace) == kubelet, 60,
             "NodeTopology localhost to show the same allocation")
    out = kubectl("exec", "-n", namespace, "steady", "--", "/workload", "status")
    assert status_line(out.stdout, "Cpus_allowed_list") == cpus_before


def _kubelet_rejected(p: Any) -> None:
    """``p`` as the real kubelet's admission failure leaves it."""
    assert p.spec.node_name == "localhost"
    assert p.status.reason == "TopologyAffinityError", p.status
    assert (p.status.message or "").startswith("Pod was rejected: "), p.status
    assert "Topology" in p.status.message


def test_a_kubelet_rejection_is_redeployed_to_an_emulated_node_that_fits(
        real_node: Any, core: client.CoreV1Api, namespace: str, k8s_client: Any,
        kubeconfig: Path, tmp_path: Path) -> None:
    """The kubelet's rejection is Failed with its own reason and message, the operator
    redeploys it, and the ReplicaSet's replacement avoids the real node and runs on the
    emulated one -- no pile of Failed pods on the way."""
    name = f"rr-{namespace}"[:60]
    with beside_an_emulated_node(k8s_client, kubeconfig, namespace, tmp_path) as (
            emulated, label), operator(kubeconfig, k8s_client, tmp_path / "op.log") as op:
        policy(k8s_client, name, {"policy": "single-numa-node", "namespaces": [namespace],
                                  "redeploy": REDEPLOY}, seen=True)
        try:
            prefers_the_real_node(k8s_client, namespace, label)
            rejected: dict[str, Any] = {}
            most_failed = 0

            def placed() -> Any:
                nonlocal most_failed
                now = core.list_namespaced_pod(namespace).items
                failed = [p for p in now if p.status.phase == "Failed"]
                most_failed = max(most_failed, len(failed))
                assert len(failed) <= 2, story(core, namespace)
                rejected.update((p.metadata.uid, p) for p in failed)
                running = [p for p in now if p.status.phase == "Running"]
                return running[0] if running else None

            try:
                new = wait_for(placed, 180, "the replacement Running", interval=0.2)
            except AssertionError as e:
                raise AssertionError(f"{e}: {story(core, namespace)}; operator log "
                                     f"{op.text()[-3000:]}") from None
            print(f"[realnode-redeploy] at most {most_failed} Failed pod(s) at once; "
                  f"{len(rejected)} rejected in all", flush=True)
            assert new.spec.node_name == emulated
            assert len(rejected) == 1, story(core, namespace)
            for p in rejected.values():
                _kubelet_rejected(p)
            redeploys = events_of(core, namespace, EVENT_REDEPLOY)
            assert len(redeploys) == 1, story(core, namespace)
            assert "attempt 1/2" in redeploys[0].message
            assert "avoiding localhost" in redeploys[0].message, redeploys[0].message
            avoids_the_real_node(new)
            assert "Traceback" not in op.text()
        finally:
            delete_policy(k8s_client, name)


def test_a_pile_the_kubelet_rejected_while_the_operator_was_away_spends_one_attempt(
        real_node: Any, core: client.CoreV1Api, namespace: str, k8s_client: Any,
        kubeconfig: Path, tmp_path: Path) -> None:
    """The Deployment is created while no operator runs: the ReplicaSet replaces each
    rejected pod at once and each replacement lands on the real node again -- a pile of
    Failed pods. The operator, started then, counts one attempt for them all (the rest
    repeat a counted rejection: deleted, RedeployRepeat), and the replacement runs on the
    emulated node; the budget is not spent on the pile and nothing is gated."""
    name = f"rp-{namespace}"[:60]
    with beside_an_emulated_node(k8s_client, kubeconfig, namespace, tmp_path) as (
            emulated, label):
        policy(k8s_client, name, {"policy": "single-numa-node", "namespaces": [namespace],
                                  "redeploy": REDEPLOY})
        try:
            prefers_the_real_node(k8s_client, namespace, label)

            def piled() -> list[Any] | None:
                failed = [p for p in core.list_namespaced_pod(namespace).items
                          if p.status.phase == "Failed"]
                return failed if len(failed) >= 5 else None

            pile = wait_for(piled, 120, "a pile of rejected pods")
            for p in pile:
                _kubelet_rejected(p)
            with operator(kubeconfig, k8s_client, tmp_path / "op.log") as op:
                def placed() -> Any:
                    running = [p for p in core.list_namespaced_pod(namespace).items
                               if p.status.phase == "Running"]
                    return running[0] if running else None

                try:
                    new = wait_for(placed, 180, "the replacement Running")
                    wait_for(lambda: not [p for p in core.list_namespaced_pod(namespace).items
                                          if p.status.phase == "Failed"], 60,
                             "the pile cleared")
                except AssertionError as e:
                    raise AssertionError(f"{e}: {story(core, namespace)}; operator log "
                                         f"{op.text()[-3000:]}") from None
                assert new.spec.node_name == emulated
                avoids_the_real_node(new)
                redeploys = events_of(core, namespace, EVENT_REDEPLOY)
                repeats = events_of(core, namespace, EVENT_REDEPLOY_REPEAT)
                print(f"[realnode-redeploy] a pile of {len(pile)}+ Failed pods: "
                      f"{len(redeploys)} attempt, {len(repeats)} repeats", flush=True)
                assert len(redeploys) == 1 and "attempt 1/2" in redeploys[0].message, \
                    story(core, namespace)
                assert len(repeats) >= len(pile) - 1, story(core, namespace)
                assert not events_of(core, namespace, EVENT_REDEPLOY_GAVE_UP), \
                    story(core, namespace)
                assert not events_of(core, namespace, EVENT_REDEPLOY_EXHAUSTED)
                assert "Traceback" not in op.text()
        finally:
            delete_policy(k8s_client, name)


def test_the_kubelets_misfit_runs_on_the_emulated_node_with_the_extender(
        real_node: Any, dev_cluster: Any, core: client.CoreV1Api, namespace: str,
        k8s_client: Any, kubeconfig: Path, tmp_path: Path) -> None:
    """The pod the kubelet rejects above (its two devices on different NUMA nodes under
    the kubelet's single-numa-node), preferring the real node: with the scheduler
    extender running, the real node is refused before binding (decided by its kubelet's
    policy, from its NodeTopology) and the pod runs on the emulated node the first time."""
    with beside_an_emulated_node(k8s_client, kubeconfig, namespace, tmp_path) as (
            emulated, label):
        dev_cluster.start_extender()
        try:
            prefers_the_real_node(k8s_client, namespace, label)
            seen: dict[str, Any] = {}

            def placed() -> Any:
                now = core.list_namespaced_pod(namespace).items
                seen.update((p.metadata.uid, p) for p in now)
                running = [p for p in now if p.status.phase == "Running"]
                return running[0] if running else None

            pod = wait_for(placed, 120, "the pod Running", interval=0.2)
            assert pod.spec.node_name == emulated, story(core, namespace)
            assert len(seen) == 1, story(core, namespace)  # nothing rejected, replaced
            assert all(p.status.phase != "Failed" for p in seen.values())
        finally:
            dev_cluster.stop_extender()


# The kubelet's manager metrics and numalign's names for them (node and policy labels
# aside); the admission duration histogram is compared by its count.
MANAGER_SERIES = [
    ("topology_manager_admission_requests_total", {}),
    ("topology_manager_admission_errors_total", {}),
    ("container_aligned_compute_resources_count", {"scope": "container",
                                                   "boundary": "numa_node"}),
    ("container_aligned_compute_resources_count", {"scope": "pod", "boundary": "numa_node"}),
    ("container_aligned_compute_resources_failure_count", {"scope": "container",
                                                           "boundary": "numa_node"}),
    ("cpu_manager_pinning_requests_total", {}),
    ("cpu_manager_pinning_errors_total", {}),
    ("memory_manager_pinning_requests_total", {}),
    ("memory_manager_pinning_errors_total", {}),
]
MANAGER_GAUGES = ["cpu_manager_exclusive_cpu_allocation_count",
                  "cpu_manager_shared_pool_size_millicores"]


def _sums(text: str, prefix: str) -> dict[str, float]:
    """``name{labels}`` -> value, summed over the labels the kubelet does not have (node,
    policy), for the manager metrics under ``prefix``."""
    from prometheus_client.parser import text_string_to_metric_families

    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
    out: dict[str, float] = {}
    duration = {"kubelet_": "topology_manager_admission_duration_ms_count",
                "numalign_": "topology_manager_admission_duration_seconds_count"}[prefix]
    wanted = [*MANAGER_SERIES, *((g, {}) for g in MANAGER_GAUGES), (duration, {})]
    for name, labels in wanted:
        key = f"{name}{sorted(labels.items())}" if labels else name
        key = key.replace(duration, "admission_duration_count")
        # the parser names a counter's samples <family>_total, the kubelet's aligned
        # counters included (exposed without the suffix)
        names = {prefix + name, prefix + name + "_total"}
        out[key] = sum(s.value for s in samples if s.name in names
                       and all(s.labels.get(k) == v for k, v in labels.items()))
    per_numa = [s for s in samples if s.name == prefix + "cpu_manager_allocation_per_numa"]
    for numa in {s.labels["numa_node"] for s in per_numa}:
        out[f"per_numa{numa}"] = sum(s.value for s in per_numa if s.labels["numa_node"] == numa)
    return out


def _replay_node(node: Any) -> Any:
    """A NodeState as numalign's agent would decide this node's pods: the machine its agent
    discovers (with the devices the kubelet reports), the kubelet's policy and managers,
    its reserved CPUs held."""
    import asyncio

    from numalign.agent.kubelet_config import load_kubelet_config
    from numalign.agent.kubelet_view import machine_with_devices
    from numalign.agent.managerstats import Managers
    from numalign.agent.node import discover_machine
    from numalign.agent.podresources import PodResourcesClient
    from numalign.agent.state import NodeState
    from numalign.topology.ledger import ContainerAllocation

    async def allocatable() -> Any:
        c = PodResourcesClient(str(node.pod_resources_socket))
        try:
            return (await c.snapshot()).allocatable.devices
        finally:
            await c.close()

    machine = machine_with_devices(discover_machine("localhost", str(node.dir)),
                                   asyncio.run(allocatable()))
    config = load_kubelet_config(str(node.kubelet_config))
    st = NodeState("replay-localhost", machine)
    st.managers = Managers(pins_cpus=config.cpu_manager_policy == "static",
                           pins_memory=config.memory_manager_policy == "Static")
    st.ledger.allocate("reserved", "reserved",
                       ContainerAllocation(cpus=tuple(config.reserved_system_cpus)),
                       pod_name="reserved", namespace="")
    return st, config


def test_numalign_counts_what_the_kubelets_managers_count(
        real_node: Any, core: client.CoreV1Api, namespace: str, k8s_client: Any) -> None:
    """The kubelet's own Topology, CPU and memory manager metrics over a pod sequence
    (pinned, shared, rejected for alignment, the pinned one deleted) against numalign's
    metrics for the same pods decided by an agent's NodeState (the replay)."""
    from prometheus_client import CollectorRegistry, generate_latest

    from numalign.agent import metrics
    from numalign.agent.kubelet_view import resolved_of

    real_node_can_take(core, 2)
    st, config = _replay_node(real_node)
    resolved = resolved_of(config)
    registry = CollectorRegistry()
    metrics.register(lambda: [st], registry)

    def kubelet() -> dict[str, float]:
        return _sums(kubelet_get(real_node, "/metrics").decode(), "kubelet_")

    def numalign() -> dict[str, float]:
        return _sums(generate_latest(registry).decode(), "numalign_")

    def replay(name: str) -> None:
        pod = k8s_client.sanitize_for_serialization(core.read_namespaced_pod(name, namespace))
        st.decide(pod, given(resolved))

    start, replay_start = kubelet(), numalign()
    core.create_namespaced_pod(namespace, workload_pod("m-pinned"))
    wait_running(core, namespace, "m-pinned")
    replay("m-pinned")
    core.create_namespaced_pod(namespace, burstable_pod("m-shared"))
    wait_running(core, namespace, "m-shared")
    replay("m-shared")
    # two devices on two NUMA nodes: single-numa-node refuses it
    core.create_namespaced_pod(namespace, burstable_pod("m-misfit", extra={DEVICE: "2"}))
    wait_for(lambda: core.read_namespaced_pod("m-misfit", namespace).status.phase == "Failed",
             120, "the kubelet to reject m-misfit")
    replay("m-misfit")

    got, want = numalign(), kubelet()
    counters = [k for k in want if k not in MANAGER_GAUGES and not k.startswith("per_numa")]
    delta_kubelet = {k: want[k] - start.get(k, 0) for k in counters}
    delta_numalign = {k: got[k] - replay_start.get(k, 0) for k in counters}
    print(f"[manager-metrics] kubelet {delta_kubelet}; numalign {delta_numalign}", flush=True)
    assert delta_numalign == delta_kubelet
    assert delta_kubelet["topology_manager_admission_requests_total"] == 3
    assert delta_kubelet["topology_manager_admission_errors_total"] == 1
    for gauge in MANAGER_GAUGES:
        assert got[gauge] == want[gauge], gauge
    assert got["cpu_manager_exclusive_cpu_allocation_count"] == 1
    # the kubelet sets the NUMA nodes holding exclusive CPUs (and never resets the others)
    held = [k for k, v in got.items() if k.startswith("per_numa") and v]
    assert held and all(want[k] == got[k] for k in held), (got, want)

    uid = core.read_namespaced_pod("m-pinned", namespace).metadata.uid
    core.delete_namespaced_pod("m-pinned", namespace, grace_period_seconds=0)
    wait_for(lambda: kubelet()["cpu_manager_exclusive_cpu_allocation_count"] == 0, 60,
             "the kubelet to release m-pinned's CPU")
    st.release(uid)
    got, want = numalign(), kubelet()
    for gauge in MANAGER_GAUGES:
        assert got[gauge] == want[gauge], gauge


def test_kubectl_get_nt_shows_the_kubelets_policy(
        real_node: Any, k8s_client: Any, kubeconfig: Path, kubectl: Any,
        tmp_path: Path, namespace: str) -> None:
    """On the kubelet-managed real node the POLICY and SCOPE columns and the PolicyApplied
    condition show the kubelet's policy, even where a TopologyPolicy selects the node
    with another node default."""
    name = f"nodes-{namespace}"[:60]
    with operator(kubeconfig, k8s_client, tmp_path / "op.log", webhooks=False) as op:
        policy(k8s_client, name, {
            "policy": "best-effort", "scope": "pod", "namespaces": [namespace],
            "nodeSelector": {"matchLabels": {"kubernetes.io/hostname": "localhost"}}})
        try:
            def shown() -> Any:
                doc = yaml.safe_load(kubectl("get", "nt", "localhost", "-o", "yaml").stdout)
                conds = {c["type"]: c for c in doc["status"].get("conditions") or []}
                applied = conds.get("PolicyApplied") or {}
                return doc if (doc["spec"].get("source") == "kubelet"
                               and applied.get("status") == "True") else None

            doc = wait_for(shown, 60, "the kubelet's policy applied on localhost")
            assert (doc["spec"]["policy"], doc["spec"]["scope"]) == ("single-numa-node",
                                                                     "container")
            applied = next(c for c in doc["status"]["conditions"]
                           if c["type"] == "PolicyApplied")
            assert applied["message"] == ("the kubelet's Topology Manager policy "
                                          "single-numa-node, scope container (the kubelet "
                                          "admits this node's pods)")
            header, row = [line.split() for line in
                           kubectl("get", "nt", "localhost").stdout.splitlines()[:2]]
            assert header[:3] == ["NAME", "POLICY", "SCOPE"]
            assert row[:3] == ["localhost", "single-numa-node", "container"]
            assert "Traceback" not in op.text()
        finally:
            delete_policy(k8s_client, name)
