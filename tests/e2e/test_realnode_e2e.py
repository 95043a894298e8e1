"""The real node: a kubelet v1.37.2 and containerd built from source, the kubelet seeing
``realnode-2numa`` (two NUMA nodes of one CPU each) with the static CPU manager (one
reserved CPU) and the ``single-numa-node`` Topology Manager policy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from e2e_helpers import wait_for
from numalign.agent.podresources import PodResourcesError
from numalign.api.wire import (
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
    prefers_the_real_node,
    running_real_node,
    status_line,
    story,
    wait_running,
    workload_pod,
)

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


Allocations = dict[str, dict[str, tuple[str, dict[str, list[str]]]]]


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


def _podresources(node: Any, namespace: str) -> Allocations:
    """What the kubelet's PodResources API lists for ``namespace``: pod -> container ->
    (cpulist, {resource: sorted device ids})."""
    import asyncio

    from numalign.agent.podresources import PodResourcesClient
    from numalign.topology.quantity import format_cpulist

    async def read() -> Any:
        c = PodResourcesClient(str(node.pod_resources_socket))
        try:
            return await c.snapshot()
        finally:
            await c.close()

    snap = asyncio.run(read())
    return {p.name: {c.name: (format_cpulist(list(c.cpus)),
                              {d.resource: sorted(d.ids) for d in c.devices})
                     for c in p.containers}
            for p in snap.pods if p.namespace == namespace}


def _nodetopology(k8s_client: Any, namespace: str) -> Allocations:
    """The same, as the real node's NodeTopology status shows it."""
    nt = client.CustomObjectsApi(k8s_client).get_cluster_custom_object(
        "numalign.io", "v1alpha1", "nodetopologies", "localhost")
    out: Allocations = {}
    for pod in (nt.get("status") or {}).get("admitted") or []:
        if pod.get("namespace") != namespace:
            continue
        out[pod["pod"]] = {
            c["name"]: (c.get("cpus") or "",
                        {r: sorted(ids) for r, ids in (c.get("devices") or {}).items()})
            for c in pod.get("containers") or []}
    return out


def _explain(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    """``numalign explain POD -o json`` on the real node: the kubelet's decision beside the
    engine's replay. Prints one row of the engine-vs-kubelet table."""
    proc = subprocess.run([sys.executable, "-m", "numalign.cli", "explain", name, "-n",
                           namespace, "-o", "json"], capture_output=True, text=True,
                          env=dict(os.environ, KUBECONFIG=str(kubeconfig)), timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    kubelet = doc["kubelet"]
    print(f"[engine-vs-kubelet] {name}: kubelet admit={kubelet.get('admit')} "
          f"containers={kubelet.get('containers')}; engine admit={doc.get('admit')} "
          f"allocation={(doc.get('allocation') or {}).get('containers')}; "
          f"agree={kubelet.get('agree')}", flush=True)
    return doc


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
             and not _podresources(node, namespace), 120, "the pods gone from the real node")


def test_pods_with_devices_nodetopology_shows_what_podresources_reports(
        real_node: Any, core: client.CoreV1Api, namespace: str, kubectl: Any,
        k8s_client: Any, kubeconfig: Path) -> None:
    core.create_namespaced_pod(namespace, workload_pod("pinned-dev", extra={DEVICE: "1"}))
    core.create_namespaced_pod(namespace, burstable_pod("shared-dev", extra={DEVICE: "1"}))
    pinned = wait_running(core, namespace, "pinned-dev")
    wait_running(core, namespace, "shared-dev")

    kubelet = wait_for(lambda: (lambda pr: pr if len(pr) == 2 else None)(
        _podresources(real_node, namespace)), 60, "PodResources to list both pods")
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

    wait_for(lambda: _nodetopology(k8s_client, namespace) == kubelet, 60,
             f"NodeTopology localhost to show what PodResources lists: {kubelet}")

    logs = wait_for(lambda: (lambda o: o if "Cpus_allowed_list" in o else None)(
        kubectl("logs", "-n", namespace, "pinned-dev", check=False).stdout), 60,
        "the workload's output")
    assert status_line(logs, "Cpus_allowed_list") == cpus
    assert pinned.spec.node_name == "localhost"

    for name in ("pinned-dev", "shared-dev"):
        doc = _explain(kubeconfig, namespace, name)
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
    assert not _podresources(real_node, namespace)
    doc = _explain(kubeconfig, namespace, "misfit")
    assert doc["kubelet"]["admit"] is False and doc["admit"] is False, doc
    assert doc["kubelet"]["agree"] is True, doc


def test_restarts_keep_the_pods_and_the_reported_state(
        real_node: Any, core: client.CoreV1Api, namespace: str, kubectl: Any,
        k8s_client: Any) -> None:
    core.create_namespaced_pod(namespace, workload_pod("steady", extra={DEVICE: "1"}))
    before = wait_running(core, namespace, "steady")
    kubelet = wait_for(lambda: _podresources(real_node, namespace) or None, 60,
                       "PodResources to list the pod")
    wait_for(lambda: _nodetopology(k8s_client, namespace) == kubelet, 60,
             "NodeTopology localhost to show the pod")
    nts = client.CustomObjectsApi(k8s_client)

    # The agent restarted with its NodeTopology gone: it reports the same state again.
    real_node.restart("agent", between=lambda: nts.delete_cluster_custom_object(
        "numalign.io", "v1alpha1", "nodetopologies", "localhost"))

    def republished() -> Any:
        try:
            return _nodetopology(k8s_client, namespace) == kubelet
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
            return _podresources(real_node, namespace) == kubelet
        except PodResourcesError:  # its socket is not there yet
            return False

    wait_for(relisted, 60, "the restarted kubelet's PodResources to list the same allocation")
    wait_for(lambda: _nodetopology(k8s_client, namespace) == kubelet, 60,
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
                                  "redeploy": REDEPLOY})
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
