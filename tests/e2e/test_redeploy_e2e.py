"""Redeploy end to end: the real scheduler places Guaranteed single-numa-node pods on
emulated nodes where some cannot fit them, the agent rejects those with
TopologyAffinityError, and the operator redeploys them onto nodes that fit -- bounded,
without runaway pod creation, and with the same end state when the operator is killed
in the middle of a redeploy.

Nodes (see conftest.py): 2 x fragmented-8numa (8 NUMA nodes of 4 CPUs) and
2 x dual-16core (2 NUMA nodes of 16 CPUs). To the scheduler both have 32 CPUs; a 6-CPU
single-numa-node pod fits only a dual-16core NUMA node (2 per NUMA node, 8 in all).

Taking over from a killed active replica (peering) is covered by
tests/cluster/test_operator_redeploy.py::test_standby_takes_over.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e_helpers import (
    POOL_LABEL,
    ROLE_LABEL,
    AgentProcess,
    annotation_json,
    custom,
    delete_namespaces,
    deployment,
    guaranteed_pod,
    phase,
    pods,
    redeploy_records,
    rejected_uids,
    wait_for,
)
from numalign.api.names import (
    ANN_RESOLVED,
    EVENT_REDEPLOY_BACKOFF,
    EVENT_REDEPLOY_EXHAUSTED,
    EVENT_REDEPLOY_GAVE_UP,
    EVENT_REDEPLOY_RELEASED,
    REDEPLOY_GATE,
)
from operator_helpers import delete_policy, operator, policy

pytestmark = pytest.mark.cluster

REPLICAS = 6
CPU = 6
SNN_POD = {"policy": "single-numa-node", "scope": "pod", "options": {}}


def _redeploy_policy(name: str, ns: str, max_attempts: int) -> dict[str, Any]:
    return {"policy": "single-numa-node", "scope": "pod", "namespaces": [ns],
            "redeploy": {"enabled": True, "maxAttempts": max_attempts, "backoffSeconds": 1,
                         "avoidRejectingNodes": True}}


@pytest.fixture
def rd_namespace(core: Any, k8s_client: Any, namespace: str) -> Iterator[str]:
    """The test's namespace under a single-numa-node/pod policy that redeploys (maxAttempts
    2 per replica: a budget of 2 x 6 for the Deployment); waits for its pods to be
    released."""
    name = f"e2e-{namespace}"[:60]
    policy(k8s_client, name, _redeploy_policy(name, namespace, 2))
    try:
        yield namespace
    finally:
        delete_policy(k8s_client, name)
        delete_namespaces(core, [namespace])


def _selector(agent: AgentProcess) -> dict[str, str]:
    return {POOL_LABEL: agent.pool, ROLE_LABEL: "redeploy"}


def _start_workloads(core: Any, apps: Any, ns: str,
                     agent: AgentProcess) -> None:
    """A 6-replica Deployment the scheduler spreads over all four nodes, and a bare pod
    bound to a fragmented node (where it cannot fit)."""
    apps.create_namespaced_deployment(ns, deployment("train", REPLICAS, CPU, _selector(agent)))
    core.create_namespaced_pod(ns, guaranteed_pod(
        "solo", CPU, labels={"app": "solo"}, node_selector=_selector(agent),
        node_name=agent.of("fragmented-8numa")[0]))


def _end_state(core: Any, ns: str, agent: AgentProcess) -> dict[str, Any]:
    """What must hold at the end, with or without an operator crash on the way."""
    fits = set(agent.of("dual-16core"))
    everything = pods(core, ns)
    train = [p for p in everything if (p.metadata.labels or {}).get("app") == "train"]
    solo = [p for p in everything if (p.metadata.labels or {}).get("app") == "solo"]
    return {
        "train": sorted((phase(p), p.spec.node_name in fits) for p in train),
        "solo": sorted((p.metadata.name, phase(p), p.spec.node_name in fits) for p in solo),
        "failed": sorted(p.metadata.name for p in everything if phase(p) == "Failed"),
        "pending": sorted(p.metadata.name for p in everything if phase(p) == "Pending"),
    }


EXPECTED = {
    "train": [("Running", True)] * REPLICAS,
    "solo": [("solo-r1", "Running", True)],
    "failed": [],
    "pending": [],
}


def _wait_end_state(core: Any, ns: str, agent: AgentProcess,
                    timeout: float = 150) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def done() -> bool:
        nonlocal last
        last = _end_state(core, ns, agent)
        return last == EXPECTED

    try:
        wait_for(done, timeout, "6 train replicas and solo-r1 Running on dual-16core nodes")
    except AssertionError as e:
        raise AssertionError(f"{e}; last state {last}") from None
    return last


def _check_bounded(core: Any, ns: str, agent: AgentProcess) -> dict[str, Any]:
    """Rejections: at most 2 per replica, each handled once by the operator; the bare
    pod was recreated exactly once."""
    rejected = rejected_uids(core, ns)
    records = redeploy_records(core, ns)
    solo = records["pod-solo"]
    assert solo["attempts"] == 1 and len(solo["handled"]) == 1, solo
    (decision,) = solo["handled"].values()
    assert decision["action"] == "recreate" and decision["replacement"] == "solo-r1"
    assert decision["node"] == agent.of("fragmented-8numa")[0]
    # Both fragmented nodes are kept off the replacement (one rejected it, both cannot fit).
    assert set(agent.of("fragmented-8numa")) <= set(decision["avoid"])
    (train_key,) = [k for k in records if k.startswith("owner-")]
    train = records[train_key]
    handled = train["handled"]
    train_rejections = len(rejected) - 1
    assert 1 <= train_rejections <= 2 * REPLICAS, (train_rejections, records)
    assert len(handled) == train["attempts"] == train_rejections, records
    assert all(d["action"] == "delete" for d in handled.values())
    assert set(handled) | set(solo["handled"]) == rejected
    assert not train.get("gaveUp")
    return {"train_rejections": train_rejections,
            "rejecting_nodes": sorted({d["node"] for d in handled.values()})}


def test_redeploy_onto_nodes_that_fit(kubeconfig: Path, k8s_client: Any,
                                      core: Any, apps: Any,
                                      e2e_agent: AgentProcess, rd_namespace: str,
                                      tmp_path: Path) -> None:
    ns = rd_namespace
    with operator(kubeconfig, k8s_client, tmp_path / "op.log") as op:
        t0 = time.monotonic()
        _start_workloads(core, apps, ns, e2e_agent)
        _wait_end_state(core, ns, e2e_agent)
        elapsed = time.monotonic() - t0
        counts = _check_bounded(core, ns, e2e_agent)
        # Replacements never went back to a node that cannot fit: only the scheduler's
        # first placements were rejected, and only on fragmented nodes.
        assert set(counts["rejecting_nodes"]) <= set(e2e_agent.of("fragmented-8numa")), counts
        source = "TopologyPolicy/" + f"e2e-{ns}"[:60]
        for p in pods(core, ns):
            assert annotation_json(p, ANN_RESOLVED) == {**SNN_POD, "source": source}
        # No runaway: nothing new shows up after the end state was reached.
        time.sleep(2)
        assert _end_state(core, ns, e2e_agent) == EXPECTED
        assert len(pods(core, ns)) == REPLICAS + 1
        assert "Traceback" not in op.text()
        print(json.dumps({**counts, "seconds": round(elapsed, 1)}))


def test_no_node_fits_stops_at_max_attempts(kubeconfig: Path, k8s_client: Any,
                                            core: Any, namespace: str,
                                            e2e_agent: AgentProcess, tmp_path: Path) -> None:
    """20 CPUs on one NUMA node: no node has such a NUMA node. The bare pod is redeployed
    twice (maxAttempts 2) to other nodes, then left Failed with a Warning event."""
    ns = namespace
    name = f"e2e-nofit-{ns}"[:60]
    policy(k8s_client, name, _redeploy_policy(name, ns, 2))
    try:
        with operator(kubeconfig, k8s_client, tmp_path / "op.log") as op:
            core.create_namespaced_pod(ns, guaranteed_pod(
                "huge", 20, node_selector=_selector(e2e_agent)))
            events = wait_for(lambda: [e for e in core.list_namespaced_event(ns).items
                                       if e.reason == EVENT_REDEPLOY_GAVE_UP], 120,
                              "the RedeployGaveUp Warning event")
            assert events[0].type == "Warning"
            assert "maxAttempts=2" in events[0].message
            assert f"TopologyPolicy/{name}" in events[0].message

            def final() -> list[Any] | None:
                ps = pods(core, ns)
                return ps if len(ps) == 1 else None

            (last,) = wait_for(final, 30, "only the last attempt left")
            assert last.metadata.name == "huge-r2" and phase(last) == "Failed"
            assert last.status.reason == "TopologyAffinityError"
            assert len(rejected_uids(core, ns)) == 3  # the pod and its two replacements
            st = redeploy_records(core, ns)["pod-huge"]
            assert st["attempts"] == 2 and len(st["gaveUp"]) == 1
            # Three different nodes tried: each replacement avoided the rejecting ones.
            assert len({d["node"] for d in st["handled"].values()} | {last.spec.node_name}) == 3

            def status() -> dict[str, Any] | None:
                obj: dict[str, Any] = custom(k8s_client).get_cluster_custom_object(
                    "numalign.io", "v1alpha1", "topologypolicies", name)
                s: dict[str, Any] = obj.get("status") or {}
                conds = {c["type"]: c for c in s.get("conditions") or []}
                c = conds.get("RedeployExhausted")
                return s if c and c["status"] == "True" else None

            st_obj = wait_for(status, 30, "RedeployExhausted in the policy's status")
            assert st_obj["rejectedPods"] == 3
            time.sleep(2)
            assert [p.metadata.name for p in pods(core, ns)] == ["huge-r2"]  # no runaway
            assert "Traceback" not in op.text()
    finally:
        delete_policy(k8s_client, name)
        delete_namespaces(core, [ns])


@pytest.mark.parametrize("fault", ["after-record", "after-create"])
def test_operator_killed_mid_redeploy(kubeconfig: Path, k8s_client: Any,
                                      core: Any, apps: Any,
                                      e2e_agent: AgentProcess, rd_namespace: str,
                                      tmp_path: Path, fault: str) -> None:
    """The operator dies abruptly (os._exit, as SIGKILL would) after recording a
    decision, or after creating a replacement; a new one finishes the job. The end
    state is the one without a crash: no pod lost, none duplicated."""
    ns = rd_namespace
    with operator(kubeconfig, k8s_client, tmp_path / "op1.log",
                  fault=fault) as op:
        _start_workloads(core, apps, ns, e2e_agent)
        wait_for(lambda: not op.alive(), 90, "the injected crash")
    assert f"injected fault at {fault}: exiting" in op.text()
    names = {p.metadata.name for p in pods(core, ns)}
    assert "solo-r2" not in names
    with operator(kubeconfig, k8s_client, tmp_path / "op2.log") as op2:
        _wait_end_state(core, ns, e2e_agent)
        counts = _check_bounded(core, ns, e2e_agent)
        time.sleep(2)
        assert _end_state(core, ns, e2e_agent) == EXPECTED
        assert "Traceback" not in op2.text()
        print(json.dumps(counts))


def test_no_node_fits_deployment_is_gated_not_piled_up(
        kubeconfig: Path, k8s_client: Any, core: Any, apps: Any, namespace: str,
        e2e_agent: AgentProcess, tmp_path: Path) -> None:
    """A 2-replica Deployment that fits nowhere, maxAttempts 2 per replica: 4 redeploys,
    then the workload gives up and its new pods are held by a scheduling gate
    (SchedulingGated, with a Warning event) instead of piling up Failed pods, as a
    ReplicaSet replacing Failed pods at once would (kubernetes#84869). Before that, the
    ReplicaSet's replacement of each rejected pod is held while it waits out its backoff,
    and the avoided nodes never exclude all four (else the budget could never be spent).
    Annotating the ReplicaSet releases them."""
    ns = namespace
    name = f"e2e-gate-{ns}"[:60]
    policy(k8s_client, name, _redeploy_policy(name, ns, 2))
    try:
        with operator(kubeconfig, k8s_client, tmp_path / "op.log") as op:
            apps.create_namespaced_deployment(ns, deployment("huge", 2, 20,
                                                             _selector(e2e_agent)))

            def gated() -> list[Any]:
                return [p for p in pods(core, ns)
                        if any(g.name == REDEPLOY_GATE for g in p.spec.scheduling_gates or [])]

            def record() -> dict[str, Any]:
                recs = [v for k, v in redeploy_records(core, ns).items()
                        if k.startswith("owner-")]
                return recs[0] if recs else {}

            # Meanwhile: never more than one Failed pod per replica and attempt, and a
            # replacement is held while its predecessor waits out its backoff.
            seen_backoff = False
            deadline = time.monotonic() + 150
            while not record().get("exhausted"):
                assert time.monotonic() < deadline, \
                    f"the workload never gave up: {redeploy_records(core, ns)}"
                failed_now = [p for p in pods(core, ns) if phase(p) == "Failed"]
                assert len(failed_now) <= 4, [p.metadata.name for p in failed_now]
                seen_backoff = seen_backoff or bool(gated())
                time.sleep(0.25)
            assert seen_backoff or [e for e in core.list_namespaced_event(ns).items
                                    if e.reason == EVENT_REDEPLOY_BACKOFF]
            # Pods created while it gave up may not be held; replace them: every new
            # pod is held.
            time.sleep(3)
            for p in pods(core, ns):
                if phase(p) != "Failed" and not any(g.name == REDEPLOY_GATE
                                                    for g in p.spec.scheduling_gates or []):
                    core.delete_namespaced_pod(p.metadata.name, ns, grace_period_seconds=0)
            try:
                held = wait_for(lambda: len(gated()) == 2 and gated(), 60,
                                "both replicas held by the scheduling gate")
            except AssertionError as e:
                state = [(p.metadata.name, phase(p), p.spec.scheduling_gates)
                         for p in pods(core, ns)]
                raise AssertionError(f"{e}: {state} {redeploy_records(core, ns)}") from None
            for p in held:
                assert phase(p) == "Pending" and p.spec.node_name is None
                conds = {c.type: c for c in p.status.conditions or []}
                assert conds["PodScheduled"].reason == "SchedulingGated", conds
            rec = record()
            # The budget: 2 attempts per replica, each rejection handled at most once.
            assert rec["attempts"] == 4 and len(rec["handled"]) == 4, rec
            assert rec["exhausted"] and rec["gaveUp"], rec
            events = core.list_namespaced_event(ns).items
            gave_up = [e for e in events if e.reason == EVENT_REDEPLOY_GAVE_UP]
            assert gave_up and "maxAttempts=2 x 2 replicas" in gave_up[0].message
            warned = wait_for(lambda: [e for e in core.list_namespaced_event(ns).items
                                       if e.reason == EVENT_REDEPLOY_EXHAUSTED], 30,
                              "the Warning event on a held pod")
            assert warned[0].type == "Warning"
            assert REDEPLOY_GATE in warned[0].message and "redeploy-reset" in warned[0].message
            # No pile-up: at most the pods in flight when it gave up are left Failed
            # (one or two per replica), and nothing more shows up later.
            failed = [p.metadata.name for p in pods(core, ns) if phase(p) == "Failed"]
            assert 1 <= len(failed) <= 4, failed
            assert len(rejected_uids(core, ns)) == 4 + len(failed)
            assert len(record()["gaveUp"]) == len(failed)
            time.sleep(8)
            assert sorted(p.metadata.name for p in pods(core, ns) if phase(p) == "Failed") \
                == sorted(failed)
            assert len(gated()) == 2 and len(pods(core, ns)) == 2 + len(failed)

            # Releasing: a new value of the reset annotation on the ReplicaSet.
            rs = held[0].metadata.owner_references[0].name
            apps.patch_namespaced_replica_set(
                rs, ns, {"metadata": {"annotations": {"numalign.io/redeploy-reset": "1"}}})
            wait_for(lambda: [e for e in core.list_namespaced_event(ns).items
                              if e.reason == EVENT_REDEPLOY_RELEASED], 60,
                     "the gate removed after the reset")
            assert "Traceback" not in op.text()
    finally:
        delete_policy(k8s_client, name)
        delete_namespaces(core, [ns])
