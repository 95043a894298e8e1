"""The numalign-managed real node (``numalign dev up --real-node --nri``): the kubelet's
CPU, memory and Topology managers at ``none``, the Node labelled ``numalign.io/managed=nri``
and numalign's agent placing each container through containerd's NRI socket, under the
policy its pod resolves to (issue 13).

``realnode-2numa`` is this machine's two CPUs as two NUMA nodes of one CPU each, one
sample device on each; CPU 0 is reserved, so CPU 1 is the one CPU numalign can give a
container exclusively, and the shared pool is CPU 0 while it does."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from e2e_helpers import node_topology, wait_for
from nri_helpers import (
    Running,
    admitted,
    admitted_container_cpus,
    allocation,
    app_containers,
    container_id,
    containers,
    cpus,
    exclusive,
    held_exclusively,
    no_cpu_twice,
    running,
    sample,
    scrape,
)
from numalign.api.allocation import Allocation
from numalign.api.names import (
    ANN_ALLOCATION,
    ANN_POLICY,
    ANN_RESOLVED,
    EVENT_REDEPLOY,
    LABEL_MANAGED,
    MANAGED_NRI,
    REJECT_REASON,
    TOPOLOGY_MESSAGE,
)
from numalign.devcluster import command as dev
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
    running_real_node,
    status_line,
    story,
    wait_running,
    workload_pod,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def nri_node(dev_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real kubelet and containerd in nri mode (``numalign dev up --real-node --nri``) in
    the session's cluster for this module's tests, seeing ``realnode-2numa`` (this
    machine's first two CPUs as two NUMA nodes, CPU 0 reserved); removed after them.
    Skipped only where containers cannot run."""
    logs = tmp_path_factory.mktemp("realnode-nri-logs")
    with running_real_node(dev_cluster, logs, "realnode-nri", mode="nri") as node:
        yield node


def _configz(node: Any) -> dict[str, Any]:
    """The running kubelet's configuration (its /configz; the kubelet listens on loopback,
    which the API server's node proxy refuses, so it is asked directly, with a client
    certificate the cluster's CA signed)."""
    doc: dict[str, Any] = json.loads(kubelet_get(node, "/configz"))["kubeletconfig"]
    return doc




def test_nri_mode_brings_the_node_up_managed_by_numalign(
        nri_node: Any, core: client.CoreV1Api, k8s_client: Any) -> None:
    configz = _configz(nri_node)
    assert configz["cpuManagerPolicy"] == "none"
    assert configz["memoryManagerPolicy"] == "None"
    assert configz["topologyManagerPolicy"] == "none"
    assert configz["reservedSystemCPUs"] == nri_node.state()["reservedCPUs"]
    # Its CPU manager holds no assignment of its own.
    state = json.loads((nri_node.kubelet_dir / "cpu_manager_state").read_text())
    assert state["policyName"] == "none" and not state.get("entries")

    node = core.read_node("localhost")
    assert (node.metadata.labels or {}).get(LABEL_MANAGED) == MANAGED_NRI
    assert nri_node.state()["mode"] == "nri"

    # The agent runs, publishes the node's NodeTopology, and was handed containerd's NRI
    # socket where this numalign's agent can take it.
    assert nri_node.process("agent").is_running()
    argv = nri_node.state()["commands"]["agent"]["argv"]
    assert argv[argv.index("--node") + 1] == "localhost"
    assert argv[argv.index("--nri-socket") + 1] == str(nri_node.nri_socket)
    assert nri_node.nri_socket.is_socket()  # containerd serves NRI there
    wait_for(lambda: ((node_topology(k8s_client, "localhost") or {}).get("status") or {})
             .get("zones"), 90, "the agent to publish NodeTopology localhost")

    # dev status says which mode the node runs in.
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        dev.main(["status", "--state-dir", str(nri_node.cluster.state_dir)])
    assert "real node localhost: mode nri" in out.getvalue()


# ----------------------------------------------------------------- the scenarios


@pytest.fixture
def namespace(namespace: str, nri_node: Any, core: client.CoreV1Api) -> Iterator[str]:
    """The test's namespace; its pods (and what would recreate them) deleted after it,
    and their containers and sandboxes gone from containerd -- the kubelet removes them at
    its next garbage collection, within a minute; numalign gives a pod's CPUs back when its
    sandbox goes -- so that the next test finds CPU 1 and the devices free."""
    yield namespace
    apps = client.AppsV1Api(core.api_client)
    for d in apps.list_namespaced_deployment(namespace).items:
        apps.delete_namespaced_deployment(d.metadata.name, namespace)
    for rs in apps.list_namespaced_replica_set(namespace).items:
        apps.delete_namespaced_replica_set(rs.metadata.name, namespace)
    for pod in core.list_namespaced_pod(namespace).items:
        core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(namespace).items
             and not containers(nri_node, namespace=namespace), 150,
             "the test's pods gone from the API, their containers and sandboxes from "
             "containerd")


def _exec_status(kubectl: Any, namespace: str, pod: str) -> str:
    return str(kubectl("exec", "-n", namespace, pod, "--", "/workload", "status").stdout)


def _printed(kubectl: Any, namespace: str, pod: str) -> str:
    """What the workload printed when it started (its /proc/self/status lines)."""
    return str(wait_for(lambda: (lambda o: o if "Cpus_allowed_list" in o else None)(
        kubectl("logs", "-n", namespace, pod, check=False).stdout), 60,
        f"{pod}'s first lines"))


def test_two_pods_run_where_their_own_policies_put_them(
        nri_node: Any, core: client.CoreV1Api, namespace: str, kubectl: Any,
        k8s_client: Any, kubeconfig: Path, tmp_path: Path) -> None:
    """One pod under its namespace's TopologyPolicy (single-numa-node), one with the
    best-effort override: numalign's decision for each is what its container runs with
    (its printed Cpus_allowed_list, its process and its cgroup), as the pod's allocation
    and ``kubectl get nt`` say; the shared pool excludes the exclusive CPU."""
    name = f"nri-{namespace}"[:60]
    with operator(kubeconfig, k8s_client, tmp_path / "op.log") as op:
        policy(k8s_client, name, {"policy": "single-numa-node", "namespaces": [namespace],
                                  "podOverrides": {"allowed": True,
                                                   "policies": ["best-effort"]}}, seen=True)
        try:
            # Shared: burstable, under the namespace's single-numa-node. Nothing is
            # exclusive yet: its pool is every CPU (the reserved one too).
            core.create_namespaced_pod(namespace, burstable_pod("shared"))
            shared = wait_running(core, namespace, "shared")
            assert json.loads(shared.metadata.annotations[ANN_RESOLVED])["policy"] == \
                "single-numa-node"
            all_cpus = set(nri_node.machine().cpus)
            assert _status_cpus_of(_printed(kubectl, namespace, "shared")) == all_cpus

            # Spread: 1 CPU and both sample devices (one per NUMA node). single-numa-node
            # cannot align that (the next test); its best-effort override admits it.
            spread = workload_pod("spread", extra={DEVICE: "2"})
            spread["metadata"]["annotations"] = {ANN_POLICY: "best-effort"}
            core.create_namespaced_pod(namespace, spread)
            spread_pod = wait_running(core, namespace, "spread")
            resolved = json.loads(spread_pod.metadata.annotations[ANN_RESOLVED])
            assert (resolved["policy"], resolved["source"]) == ("best-effort", "pod")
            alloc = wait_for(lambda: allocation(core.read_namespaced_pod("spread", namespace)),
                             60, "spread's numalign.io/allocation")
            mine = exclusive(alloc, "work")
            reserved = int(nri_node.state()["reservedCPUs"])
            assert len(mine) == 1 and reserved not in mine, alloc
            assert sorted(alloc.containers["work"].devices[DEVICE]) == ["dev0", "dev1"]
            assert _status_cpus_of(_printed(kubectl, namespace, "spread")) == mine

            # The shared pod was moved off the exclusive CPU (NRI container update).
            pool = all_cpus - mine
            wait_for(lambda: _status_cpus_of(_exec_status(kubectl, namespace, "shared"))
                     == pool, 60, f"the shared pod's cpuset to become the pool {pool}")
            got = no_cpu_twice(nri_node, core, namespace)
            by_pod = {r.pod_uid: r for r in got.values()}
            assert by_pod[spread_pod.metadata.uid].cgroup_cpus == mine
            assert by_pod[shared.metadata.uid].cgroup_cpus == pool
            assert by_pod[spread_pod.metadata.uid].id == container_id(
                core.read_namespaced_pod("spread", namespace), "work")

            # kubectl get nt: each pod with its policy and source, the same CPUs.
            def published() -> dict[str, Any] | None:
                doc = yaml.safe_load(kubectl("get", "nt", "localhost", "-o", "yaml").stdout)
                entries = {e["pod"]: e for e in (doc.get("status") or {}).get("admitted") or []
                           if e.get("namespace") == namespace}
                return entries if set(entries) == {"shared", "spread"} else None

            entries = wait_for(published, 60, "both pods in NodeTopology localhost status")
            assert (entries["spread"]["policy"], entries["spread"]["source"]) == (
                "best-effort", "pod")
            assert (entries["shared"]["policy"], entries["shared"]["source"]) == (
                "single-numa-node", f"TopologyPolicy/{name}")
            assert admitted_container_cpus(entries["spread"], "work") == mine
            assert admitted_container_cpus(entries["shared"], "work") == set()
            assert entries["spread"]["uid"] == spread_pod.metadata.uid
            assert "Traceback" not in op.text()
        finally:
            delete_policy(k8s_client, name)


def _status_cpus_of(text: str) -> set[int]:
    return cpus(status_line(text, "Cpus_allowed_list"))


def test_a_pod_numalign_cannot_align_never_starts_and_is_redeployed(
        nri_node: Any, core: client.CoreV1Api, namespace: str, k8s_client: Any,
        kubeconfig: Path, tmp_path: Path) -> None:
    """1 CPU and both sample devices under single-numa-node (the namespace's policy): the
    kubelet's managers are none and admit it, numalign's agent rejects it the kubelet's
    way -- no container of it ever exists in containerd, the pod is Failed /
    TopologyAffinityError with a Warning event -- and the operator redeploys it to an
    emulated node where it fits."""
    name = f"nrr-{namespace}"[:60]
    seen: set[str] = set()  # uids of the pods that were bound to the real node

    def never_started() -> None:
        for p in core.list_namespaced_pod(namespace).items:
            if p.spec.node_name == "localhost":
                seen.add(p.metadata.uid)
        started = app_containers(nri_node, namespace=namespace)
        assert not started, f"containerd holds containers {started}: {story(core, namespace)}"

    with beside_an_emulated_node(k8s_client, kubeconfig, namespace, tmp_path) as (
            emulated, label), operator(kubeconfig, k8s_client, tmp_path / "op.log") as op:
        policy(k8s_client, name, {"policy": "single-numa-node", "namespaces": [namespace],
                                  "redeploy": REDEPLOY}, seen=True)
        try:
            prefers_the_real_node(k8s_client, namespace, label)
            rejected: dict[str, Any] = {}

            def placed() -> Any:
                never_started()
                now = core.list_namespaced_pod(namespace).items
                rejected.update((p.metadata.uid, p) for p in now
                                if p.status.phase == "Failed")
                up = [p for p in now if p.status.phase == "Running"]
                return up[0] if up else None

            try:
                new = wait_for(placed, 240, "the replacement Running", interval=0.3)
            except AssertionError as e:
                raise AssertionError(f"{e}: {story(core, namespace)}; operator log "
                                     f"{op.text()[-3000:]}") from None
            never_started()
            assert new.spec.node_name == emulated
            avoids_the_real_node(new)
            assert rejected, story(core, namespace)
            assert set(rejected) <= seen
            warnings = {e.involved_object.uid: e for e in events_of(core, namespace,
                                                                    REJECT_REASON)}
            for uid, p in rejected.items():
                assert p.spec.node_name == "localhost"
                assert p.status.reason == REJECT_REASON, p.status
                assert TOPOLOGY_MESSAGE in (p.status.message or ""), p.status
                for st in p.status.container_statuses or []:  # none ever ran
                    assert not (st.state and st.state.running), st
                    assert not (st.last_state and st.last_state.terminated), st
                assert uid in warnings and warnings[uid].type == "Warning", warnings
                assert allocation(p) is None  # nothing recorded for a rejected pod
            redeploys = events_of(core, namespace, EVENT_REDEPLOY)
            assert redeploys and "avoiding localhost" in redeploys[0].message, \
                story(core, namespace)
            assert "Traceback" not in op.text()
        finally:
            delete_policy(k8s_client, name)


def test_the_agent_killed_and_restarted_gives_no_cpu_twice(
        nri_node: Any, core: client.CoreV1Api, namespace: str, kubectl: Any,
        k8s_client: Any) -> None:
    """While a pinned pod and a shared one run and a third is being created, the agent
    is killed (SIGKILL: no goodbye) and started again: it rebuilds its ledger from the
    runtime and the pods' records -- the running pods keep their containers and
    cpusets, the new one ends in the shared pool, and no CPU is given twice."""
    core.create_namespaced_pod(namespace, workload_pod("pinned"))
    pinned = wait_running(core, namespace, "pinned")
    core.create_namespaced_pod(namespace, burstable_pod("shared"))
    shared = wait_running(core, namespace, "shared")
    mine = exclusive(wait_for(lambda: allocation(core.read_namespaced_pod("pinned", namespace)),
                              60, "pinned's numalign.io/allocation"), "work")
    assert len(mine) == 1
    before = no_cpu_twice(nri_node, core, namespace)
    cpusets = {r.pod_uid: (r.id, r.cgroup_cpus) for r in before.values()}
    assert cpusets[pinned.metadata.uid][1] == mine
    assert cpusets[shared.metadata.uid][1] == set(nri_node.machine().cpus) - mine

    agent = nri_node.process("agent")
    pid = agent.pid
    assert pid is not None and agent.is_running()
    os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: not agent.is_running(), 10, "the agent gone")
    core.create_namespaced_pod(namespace, burstable_pod("newcomer"))

    # Meanwhile nothing places containers, and none starts unplaced: containerd requires
    # numalign's plugin, so the kubelet's creation fails (and is retried).
    def refused() -> str | None:
        sts = core.read_namespaced_pod("newcomer", namespace).status.container_statuses or []
        waiting = sts[0].state.waiting if sts else None
        return waiting.message if waiting is not None and waiting.message \
            and "numalign" in waiting.message else None

    why = wait_for(refused, 90, "the newcomer's creation refused while no plugin is there")
    assert "required plugin" in why, why
    newcomer_pod = core.read_namespaced_pod("newcomer", namespace)
    assert app_containers(nri_node, pod_uid=newcomer_pod.metadata.uid) == [], \
        "a container of the newcomer exists while nothing places it"
    nri_node.restart("agent")

    newcomer = wait_running(core, namespace, "newcomer", timeout=180)

    def settled() -> dict[str, Running] | None:
        try:
            got = no_cpu_twice(nri_node, core, namespace)
        except AssertionError:
            return None
        return got if len(got) == 3 else None

    try:
        after = wait_for(settled, 120, "every container's cpuset as numalign decided")
    except AssertionError:
        no_cpu_twice(nri_node, core, namespace)  # says what differs
        raise
    by_pod = {r.pod_uid: (r.id, r.cgroup_cpus) for r in after.values()}
    # The running pods kept their containers and their cpusets.
    assert by_pod[pinned.metadata.uid] == cpusets[pinned.metadata.uid]
    assert by_pod[shared.metadata.uid] == cpusets[shared.metadata.uid]
    assert by_pod[newcomer.metadata.uid][1] == set(nri_node.machine().cpus) - mine
    for name in ("pinned", "shared"):
        st = core.read_namespaced_pod(name, namespace).status.container_statuses[0]
        assert st.restart_count == 0 and st.state.running, st
    # The restarted agent holds the same record and publishes it.
    assert exclusive(allocation(core.read_namespaced_pod("pinned", namespace)), "work") == mine
    wait_for(lambda: admitted_container_cpus(
        admitted(k8s_client).get((namespace, "pinned"), {}), "work") == mine, 90,
        "the restarted agent to publish pinned's CPU in NodeTopology localhost")
    assert _status_cpus_of(_exec_status(kubectl, namespace, "pinned")) == mine


# ----------------------------------------------------------------- one node state (issue 20)


def _published_devices(api: Any) -> set[str]:
    """The sample devices the agent's NodeTopology status shows (those the kubelet reports
    now)."""
    status = (node_topology(api, "localhost") or {}).get("status") or {}
    return {str(d.get("id")) for d in status.get("devices") or []
            if d.get("resource") == DEVICE}


def _cpus_of(node: Any, core: client.CoreV1Api, pod: Any) -> set[int]:
    """The cgroup cpuset of ``pod``'s one running container (waiting a little for it: the
    kubelet may be starting it again)."""
    def one() -> set[int] | None:
        got = list(running(node, pod_uid=pod.metadata.uid).values())
        return got[0].cgroup_cpus if len(got) == 1 else None

    try:
        return wait_for(one, 30, f"one running container of {pod.metadata.name}")
    except AssertionError:
        now = core.read_namespaced_pod(pod.metadata.name, pod.metadata.namespace)
        raise AssertionError(f"{pod.metadata.name}: {now.status}: "
                             f"{story(core, pod.metadata.namespace)}") from None


def test_a_finished_pod_frees_its_cpu_and_a_forged_record_does_not_move_it(
        nri_node: Any, core: client.CoreV1Api, namespace: str, k8s_client: Any) -> None:
    """A Job-like pod (restartPolicy Never) finishes: its exclusive CPU goes to the next
    guaranteed pod at once, while the finished pod still exists. Then an admin rewrites the
    records -- the shared pod's ``numalign.io/allocation`` claims that CPU, the owner's
    claims nothing -- and the agent is killed and started again: it restores from the
    status it published, so the owner keeps its CPU and the claimant stays shared."""
    done = workload_pod("done")
    done["spec"]["restartPolicy"] = "Never"
    done["spec"]["containers"][0]["args"] = ["status"]  # prints its lines and exits
    core.create_namespaced_pod(namespace, done)
    finished = wait_for(lambda: (lambda p: p if p.status.phase == "Succeeded" else None)(
        core.read_namespaced_pod("done", namespace)), 120, "the pod done Succeeded")
    had = exclusive(allocation(finished), "work")
    assert len(had) == 1, allocation(finished)

    core.create_namespaced_pod(namespace, workload_pod("owner"))
    owner = wait_running(core, namespace, "owner")
    owned = wait_for(lambda: allocation(core.read_namespaced_pod("owner", namespace)), 60,
                     "owner's numalign.io/allocation")
    assert exclusive(owned, "work") == had  # the finished pod's CPU, while it still exists
    assert core.read_namespaced_pod("done", namespace).status.phase == "Succeeded"
    core.create_namespaced_pod(namespace, burstable_pod("claimant"))
    claimant = wait_running(core, namespace, "claimant")
    pool = set(nri_node.machine().cpus) - had
    wait_for(lambda: _cpus_of(nri_node, core, claimant) == pool, 60, "claimant in the shared pool")
    wait_for(lambda: admitted_container_cpus(
        admitted(k8s_client).get((namespace, "owner"), {}), "work") == had, 90,
        "owner's CPU in NodeTopology localhost status")

    for name, record in (("claimant", owned), ("owner", Allocation())):
        core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": {
            ANN_ALLOCATION: record.to_annotation()}}})
    agent = nri_node.process("agent")
    assert agent.pid is not None
    os.killpg(agent.pid, signal.SIGKILL)
    wait_for(lambda: not agent.is_running(), 10, "the agent gone")
    nri_node.restart("agent")
    # a new pod runs only once the restarted agent's plugin has synchronized (containerd
    # requires it): by then the ledger is rebuilt
    core.create_namespaced_pod(namespace, burstable_pod("probe"))
    probe = wait_running(core, namespace, "probe", timeout=180)
    assert _cpus_of(nri_node, core, owner) == had
    assert _cpus_of(nri_node, core, claimant) == pool
    assert _cpus_of(nri_node, core, probe) == pool
    # what it publishes: the owner with its CPU (it never showed another list meanwhile,
    # so a second restart would find the same), the claimant with none
    entries = admitted(k8s_client)
    assert admitted_container_cpus(entries.get((namespace, "owner"), {}), "work") == had, \
        entries
    assert admitted_container_cpus(entries.get((namespace, "claimant"), {}), "work") == set()


def test_devices_missing_after_a_kubelet_restart_give_no_cpu_twice(
        nri_node: Any, core: client.CoreV1Api, namespace: str, k8s_client: Any) -> None:
    """The kubelet restarts while its device plugin is away: for a while it reports no
    sample device, and the agent's machine lacks the one a running pod holds. That pod
    keeps its CPU in numalign's ledger: a pod created meanwhile runs in the shared pool
    without it; when the plugin is back, the pod holds its device again."""
    core.create_namespaced_pod(namespace, workload_pod("pinned", extra={DEVICE: "1"}))
    pinned = wait_running(core, namespace, "pinned")
    mine = exclusive(wait_for(lambda: allocation(core.read_namespaced_pod("pinned", namespace)),
                              60, "pinned's numalign.io/allocation"), "work")
    assert len(mine) == 1
    wait_for(lambda: _published_devices(k8s_client) == {"dev0", "dev1"}, 60,
             "both sample devices in NodeTopology localhost status")
    plugin = nri_node.process("device-plugin")
    try:
        nri_node.restart("kubelet", between=lambda: plugin.stop(timeout=10))
        wait_for(lambda: not _published_devices(k8s_client), 90,
                 "the agent to see the restarted kubelet report no sample device")
        core.create_namespaced_pod(namespace, burstable_pod("meanwhile"))
        meanwhile = wait_running(core, namespace, "meanwhile", timeout=180)
        pool = set(nri_node.machine().cpus) - mine
        assert _cpus_of(nri_node, core, meanwhile) == pool
        assert _cpus_of(nri_node, core, pinned) == mine
    finally:
        if not plugin.is_running():
            nri_node.restart("device-plugin")
    wait_for(lambda: _published_devices(k8s_client) == {"dev0", "dev1"}, 90,
             "the sample devices back in NodeTopology localhost status")
    no_cpu_twice(nri_node, core, namespace)
    assert _cpus_of(nri_node, core, pinned) == mine


# ----------------------------------------------------------------- the agent's metrics

ADMISSIONS = "numalign_topology_manager_admission_requests_total"
CPU_PINS = "numalign_cpu_manager_pinning_requests_total"
MEMORY_PINS = "numalign_memory_manager_pinning_requests_total"
EXCLUSIVE = "numalign_cpu_manager_exclusive_cpu_allocation_count"
PER_NUMA = "numalign_cpu_manager_allocation_per_numa"
SHARED_POOL = "numalign_cpu_manager_shared_pool_size_millicores"


def test_the_agents_metrics_count_the_pods_numalign_placed(
        nri_node: Any, core: client.CoreV1Api, namespace: str, k8s_client: Any,
        kubeconfig: Path, tmp_path: Path) -> None:
    """The agent's /metrics are numalign's decisions on this node (the NRI placer decides
    in the node state the metrics read): each pod placed is an admission request under its
    policy, each Guaranteed container a CPU and a memory pinning request, and the shared
    pool is the allocatable CPUs no pod holds exclusively."""
    url = nri_node.metrics_url("agent")
    assert url, nri_node.state()["commands"]["agent"]["argv"]
    snn, node = "single-numa-node", "localhost"
    allocatable = set(nri_node.machine().cpus) - cpus(str(nri_node.state()["reservedCPUs"]))
    numa_of = {c.id: c.numa for c in nri_node.machine().cpus.values()}

    def counters() -> tuple[float, ...]:
        got = scrape(url)
        return (*(sample(got, m, node=node, policy=snn)
                  for m in (ADMISSIONS, CPU_PINS, MEMORY_PINS)),
                sample(got, ADMISSIONS, node=node, policy="none"))

    def pool_and_exclusive() -> tuple[float, float]:
        got = scrape(url)
        return sample(got, SHARED_POOL, node=node), sample(got, EXCLUSIVE, node=node,
                                                           policy=snn)

    def expected_pool() -> float:
        return float(len(allocatable - held_exclusively(core, node)) * 1000)

    name = f"nrm-{namespace}"[:60]
    with operator(kubeconfig, k8s_client, tmp_path / "op.log") as op:
        policy(k8s_client, name, {"policy": snn, "namespaces": [namespace]}, seen=True)
        try:
            got = scrape(url)
            assert sample(got, "numalign_agent_node_info", node=node, mode="nri") == 1
            assert sample(got, SHARED_POOL, node=node) == expected_pool(), got
            base = counters()

            def since() -> tuple[float, ...]:
                return tuple(a - b for a, b in zip(counters(), base, strict=True))

            # Guaranteed, 1 CPU: one admission under single-numa-node, its container's CPU
            # and memory pinned; the one allocatable CPU is no longer shared.
            core.create_namespaced_pod(namespace, workload_pod("pinned"))
            wait_running(core, namespace, "pinned")
            mine = exclusive(wait_for(lambda: allocation(core.read_namespaced_pod(
                "pinned", namespace)), 60, "pinned's numalign.io/allocation"), "work")
            assert len(mine) == 1 and mine <= allocatable
            assert since() == (1, 1, 1, 0)
            assert pool_and_exclusive() == (expected_pool(), 1) == (
                len(allocatable - mine) * 1000, 1)
            (cpu,) = mine
            assert sample(scrape(url), PER_NUMA, node=node, policy=snn,
                          numa_node=str(numa_of[cpu])) == 1

            # Burstable: admitted, nothing pinned, in the shared pool.
            core.create_namespaced_pod(namespace, burstable_pod("shared"))
            wait_running(core, namespace, "shared")
            assert since() == (2, 1, 1, 0)

            # Deleted: its CPU is shared again.
            core.delete_namespaced_pod("pinned", namespace, grace_period_seconds=0)
            wait_for(lambda: pool_and_exclusive() == (len(allocatable) * 1000, 0), 60,
                     f"the agent's shared pool back to {sorted(allocatable)}")

            # The next Guaranteed pod takes it.
            core.create_namespaced_pod(namespace, workload_pod("again"))
            wait_running(core, namespace, "again")
            assert since() == (3, 2, 2, 0)
            assert pool_and_exclusive() == (expected_pool(), 1)
            assert "Traceback" not in op.text()
        finally:
            delete_policy(k8s_client, name)
