"""Pure parts of the operator: redeploy naming/backoff/idempotency keys, node avoidance,
fit checks, node-default patches, policy status."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest

from numalign.api.resolution import PolicyRef
from numalign.api.topologypolicy import RedeployPolicy
from numalign.api.zonefit import node_fits, pod_requests
from numalign.controller import avoidance, policies
from numalign.controller.nodedefaults import desired_spec, spec_patch
from numalign.controller.redeploy import (
    Workload,
    WorkloadState,
    backoff_delay,
    build_replacement,
    is_topology_rejected,
    replacement_name,
    with_node_avoidance,
    workload_key,
)


def test_backoff_doubles_and_caps() -> None:
    assert [backoff_delay(10, a) for a in range(4)] == [10, 20, 40, 80]
    assert backoff_delay(10, 100) == 3600
    assert backoff_delay(0, 3) == 0
    # rounds of one attempt per replica: 50 replicas rejected at once all wait 10 s
    assert {backoff_delay(10, a, 50) for a in range(50)} == {10}
    assert [backoff_delay(10, a, 2) for a in range(6)] == [10, 10, 20, 20, 40, 40]


def _workload(failed: dict[str, str], st: WorkloadState,
              settings: RedeployPolicy | None = None) -> Workload:
    pod = {"metadata": {"name": "x", "ownerReferences": [
        {"kind": "ReplicaSet", "uid": "rs", "controller": True}]}}
    return Workload(st, failed, pod, settings or RedeployPolicy())


def test_replacements_held_while_a_rejected_pod_waits_and_once_exhausted() -> None:
    """The ReplicaSet's replacement of a rejected pod is held until the operator decided
    on that pod (its backoff); once the budget is spent, held for good; never when the
    workload has no rejection or its policy does not redeploy."""
    t0 = 1577836800.0  # 2020-01-01T00:00:00Z
    st = WorkloadState()
    assert _workload({}, st).hold(t0) is None
    assert _workload({"f1": "n1"}, st).hold(t0) == "backoff"
    assert _workload({"f1": "n1"}, st).waiting() == ["f1"]
    st.handled = {"f1": {"action": "delete"}}
    assert _workload({"f1": "n1"}, st).hold(t0) is None  # decided: the pod is going away
    assert _workload({"f1": "n1", "f2": "n2"}, st).waiting() == ["f2"]
    st.gave_up = {"f2": "2020-01-01T00:00:00Z"}
    st.exhausted = st.last = "2020-01-01T00:00:00Z"
    assert _workload({"f1": "n1", "f2": "n2"}, st).hold(t0 + 60) == "exhausted"
    assert _workload({}, st).hold(t0 + 60) == "exhausted"
    assert _workload({}, st).hold(t0 + 3601) is None  # expired: released by itself
    off = RedeployPolicy(enabled=False)
    assert _workload({"f3": "n3"}, WorkloadState(), off).hold(t0) is None
    assert _workload({"f3": "n3"}, WorkloadState(), off).avoid(t0) == []


def test_replacements_avoid_rejecting_nodes_newest_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The node of the pod Failed now, then the record's nodes, newest first; with every
    selectable node among them, the one that rejected the workload longest ago is let
    back in."""
    monkeypatch.setattr(avoidance, "unfit_nodes", lambda p, skip=None: [])
    monkeypatch.setattr(avoidance, "selectable_nodes", lambda p: {"new", "now", "old", "spare"})
    t0 = 1577836800.0
    st = WorkloadState(rejections={"old": "2020-01-01T00:00:00Z",
                                   "new": "2020-01-01T00:10:00Z"})
    assert _workload({"f": "now"}, st).avoid(t0 + 700) == ["new", "now", "old"]
    monkeypatch.setattr(avoidance, "selectable_nodes", lambda p: {"new", "now", "old"})
    assert _workload({"f": "now"}, st).avoid(t0 + 700) == ["new", "now"]
    assert _workload({}, WorkloadState()).avoid(t0) == []
    keep_off = RedeployPolicy(avoid_rejecting_nodes=False)
    assert _workload({"f": "now"}, st, keep_off).avoid(t0 + 700) == []


def test_replacement_names_are_deterministic() -> None:
    assert replacement_name("web", 1) == "web-r1"
    assert replacement_name("web", 1) == replacement_name("web", 1)
    long = replacement_name("a" * 300, 12)
    assert len(long) <= 253 and long.endswith("-r12")


def test_workload_keys() -> None:
    owned = {"metadata": {"name": "x", "ownerReferences": [
        {"kind": "ReplicaSet", "uid": "u-1", "controller": True},
        {"kind": "Other", "uid": "u-2"}]}}
    assert workload_key(owned) == "owner-u-1"
    bare = {"metadata": {"name": "web-r2", "annotations": {"numalign.io/redeploy-base": "web"}}}
    assert workload_key(bare) == "pod-web"
    assert workload_key({"metadata": {"name": "web"}}) == "pod-web"
    assert len(workload_key({"metadata": {"name": "a" * 300}})) <= 200


def test_is_topology_rejected() -> None:
    assert is_topology_rejected({"status": {"phase": "Failed", "reason": "TopologyAffinityError"}})
    assert not is_topology_rejected({"status": {"phase": "Failed", "reason": "Evicted"}})
    assert not is_topology_rejected({})


def test_workload_state_round_trip_and_expiry() -> None:
    st = WorkloadState.parse("garbage")
    assert st.attempts == 0
    st.attempts = 2
    st.rejections = {"a": "2020-01-01T00:00:00Z", "b": "2020-01-01T00:50:00Z"}
    st.handled = {"uid": {"action": "recreate", "replacement": "x-r1", "at": "x"}}
    back = WorkloadState.parse(st.dump())
    assert back.attempts == 2 and back.handled == st.handled
    t0 = 1577836800.0  # 2020-01-01T00:00:00Z
    assert back.avoid_nodes(t0 + 1790) == ["b", "a"]  # newest rejection first
    assert back.avoid_nodes(t0 + 1900) == ["b"]
    back.expire(t0 + 3000 + 3600 + 1)
    assert back.attempts == 0 and back.rejections == {}


def test_node_avoidance_is_added_to_every_term() -> None:
    spec: dict[str, Any] = {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]},
            {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}]}]}}}}
    out = with_node_avoidance(spec, ["n2", "n1", "n1"])
    terms = out["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    for t in terms:
        assert t["matchFields"] == [
            {"key": "metadata.name", "operator": "NotIn", "values": ["n1"]},
            {"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}]
    assert "matchFields" not in spec["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert with_node_avoidance({}, []) == {}


def _pinned_to(*nodes: str) -> dict[str, Any]:
    """The affinity the DaemonSet controller gives its pod for one node."""
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": list(nodes)}]}]}}},
        "containers": [{"name": "c"}]}


def test_node_avoidance_never_leaves_a_pod_no_node() -> None:
    # A DaemonSet pod rejected on its node: In [node-a] AND NotIn [node-a] would keep
    # its replacement Pending for ever. It keeps its node.
    spec = _pinned_to("node-a")
    assert with_node_avoidance(spec, ["node-a", "node-b"]) == spec
    # A pod already bound to a node: nothing to avoid.
    bound = {"nodeName": "node-a", "containers": [{"name": "c"}]}
    assert with_node_avoidance(bound, ["node-a"]) == bound
    # Pinned to two nodes, one avoided: the other is still allowed.
    out = with_node_avoidance(_pinned_to("node-a", "node-b"), ["node-a"])
    [term] = out["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert {"key": "metadata.name", "operator": "NotIn", "values": ["node-a"]} in (
        term["matchFields"])
    # Two terms, one still alive after avoidance: avoidance is added.
    two = _pinned_to("node-a")
    two["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"].append({"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["x"]}]})
    assert with_node_avoidance(two, ["node-a"]) != two


def test_build_replacement() -> None:
    pod = {"metadata": {"name": "web", "namespace": "ns", "uid": "u", "labels": {"a": "b"},
                        "annotations": {"numalign.io/resolved": "{}", "keep": "me",
                                        "kopf.zalando.org/x": "y"}},
           "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
           "status": {"phase": "Failed"}}
    new = build_replacement(pod, "web-r1", ["n1"])
    assert new["metadata"]["name"] == "web-r1" and new["metadata"]["labels"] == {"a": "b"}
    assert new["metadata"]["annotations"] == {"keep": "me", "numalign.io/redeploy-of": "web",
                                              "numalign.io/redeploy-of-uid": "u",
                                              "numalign.io/redeploy-base": "web"}
    assert "nodeName" not in new["spec"] and "status" not in new
    assert pod["spec"]["nodeName"] == "n1"  # the original is untouched


def test_pod_requests_and_fit() -> None:
    pod = {"metadata": {"generateName": "web-"}, "spec": {
        "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "6"}}},
                           {"name": "s", "restartPolicy": "Always",
                            "resources": {"requests": {"cpu": "1"}}}],
        "containers": [{"name": "a", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}},
                       {"name": "b", "resources": {"limits": {"cpu": "1",
                                                              "example.com/gpu": "1"}}}]}}
    req = pod_requests(pod)
    assert req == {"cpu": Decimal(6), "memory": Decimal(2**30), "example.com/gpu": Decimal(1)}
    # the engine's rule: a sidecar started before an init container runs beside it
    sidecar_first = {**pod, "spec": {**pod["spec"], "initContainers": [
        pod["spec"]["initContainers"][1], pod["spec"]["initContainers"][0]]}}
    assert pod_requests(sidecar_first)["cpu"] == Decimal(7)
    bad = {**pod, "spec": {"containers": [{"name": "a", "resources": {"requests": {
        "cpu": "lots"}}}]}}
    assert pod_requests(bad) == {}  # not judged: no node is avoided for it
    zones = [{"available": {"cpu": "4", "memory": "4Gi"}},
             {"available": {"cpu": "4", "memory": "4Gi"}}]
    assert node_fits(req, zones, single_zone=False) is True
    assert node_fits(req, zones, single_zone=True) is False
    assert node_fits({"other": Decimal(1)}, zones, single_zone=True) is None
    assert node_fits(req, [], single_zone=False) is None


def test_unfit_nodes_never_exclude_every_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes that cannot fit now are avoided only while some selectable node remains:
    the exclusion is permanent in the replacement's affinity (a Pending pod forever,
    attempts never reaching maxAttempts, is worse than a bounded rejection)."""
    pod: dict[str, Any] = {"spec": {"nodeSelector": {"pool": "a"}}}
    unfit = ["b", "c"]
    selectable = {"a", "b", "c"}
    monkeypatch.setattr(avoidance, "unfit_nodes", lambda p, skip=None: [n for n in unfit
                                                                 if n not in (skip or [])])
    monkeypatch.setattr(avoidance, "selectable_nodes", lambda p: set(selectable))
    assert avoidance.with_unfit(pod, ["x"]) == ["b", "c", "x"]  # "a" still fits: avoid b, c
    unfit = ["a", "b", "c"]
    assert avoidance.with_unfit(pod, ["a"]) == ["a"]  # none fits: avoid only the rejecting node
    unfit = []
    assert avoidance.with_unfit(pod, ["a"]) == ["a"]
    unfit, selectable = ["b"], {"a"}
    # "a", the only candidate, rejected the workload: it is retried rather than leaving
    # the replacement Pending for good (the budget could never be spent)
    assert avoidance.with_unfit(pod, ["a"]) == ["b"]


def test_rejecting_nodes_never_exclude_every_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every selectable node rejected the workload (newest first: c, b, a): all but the
    oldest are avoided, so the replacement lands on "a", is rejected again, and the
    workload's budget runs out (RedeployGaveUp, the gate) instead of a silent stall."""
    pod: dict[str, Any] = {"spec": {"nodeSelector": {"pool": "a"}}}
    monkeypatch.setattr(avoidance, "unfit_nodes", lambda p, skip=None: [])
    monkeypatch.setattr(avoidance, "selectable_nodes", lambda p: {"a", "b", "c"})
    assert avoidance.keep_a_candidate(pod, ["c", "b", "a"]) == ["c", "b"]
    assert avoidance.keep_a_candidate(pod, ["a", "c", "b"]) == ["a", "c"]
    assert avoidance.with_unfit(pod, ["c", "x", "b", "c", "a"]) == ["b", "c", "x"]
    assert avoidance.keep_a_candidate(pod, ["b"]) == ["b"]  # others remain: avoid it
    monkeypatch.setattr(avoidance, "selectable_nodes", lambda p: set())  # selector unknown
    assert avoidance.keep_a_candidate(pod, ["c", "b", "a"]) == ["c", "b", "a"]


def test_node_default_patch() -> None:
    pols = [{"metadata": {"name": "gpu"}, "spec": {
        "policy": "single-numa-node", "scope": "pod", "nodeSelector": {"matchLabels": {"p": "g"}},
        "options": {"maxAllowableNumaNodes": 16}}}]
    want = desired_spec({"p": "g"}, pols)
    assert want == {"policy": "single-numa-node", "scope": "pod",
                    "options": {"maxAllowableNumaNodes": 16}, "source": "TopologyPolicy/gpu"}
    patch = spec_patch({}, want)
    assert patch is not None and patch["policyGeneration"] == 1
    current = {**want, "policyGeneration": 1}
    assert spec_patch(current, want) is None
    cleared = spec_patch(current, desired_spec({}, pols))
    assert cleared == {"policy": None, "scope": None, "options": None, "source": None,
                       "policyGeneration": 2}
    changed = spec_patch({**current, "options": {"maxAllowableNumaNodes": 16,
                                                 "preferClosestNumaNodes": True}}, want)
    assert changed is not None and changed["options"] == {
        "maxAllowableNumaNodes": 16, "preferClosestNumaNodes": None}


def test_node_default_of_a_kubelet_managed_node_is_its_kubelets() -> None:
    pols = [{"metadata": {"name": "all"}, "spec": {"policy": "best-effort", "scope": "pod",
                                                   "nodeSelector": {}}}]
    kubelet = {"topologyManagerPolicy": "single-numa-node",
               "topologyManagerScope": "container", "cpuManagerPolicy": "static"}
    want = desired_spec({}, pols, {"status": {"kubelet": kubelet}})
    assert want == {"policy": "single-numa-node", "scope": "container", "source": "kubelet"}
    patch = spec_patch({"policy": "best-effort", "scope": "pod", "source": "TopologyPolicy/all",
                        "policyGeneration": 3}, want)
    assert patch == {"policy": "single-numa-node", "scope": "container", "options": None,
                     "source": "kubelet", "policyGeneration": 4}
    # a numalign-managed (NRI) node: numalign admits, the TopologyPolicy's default applies
    nri = desired_spec({"numalign.io/managed": "nri"}, pols, {"status": {"kubelet": {
        **kubelet, "topologyManagerPolicy": "none", "cpuManagerPolicy": "none"}}})
    assert nri["policy"] == "best-effort" and nri["source"] == "TopologyPolicy/all"


def test_policy_status() -> None:
    obj = {"metadata": {"name": "a", "generation": 3},
           "spec": {"policy": "restricted", "namespaces": ["ml"]}}
    twin = PolicyRef("b", {"policy": "none", "namespaces": ["ml"]})
    nts = [{"spec": {"source": "TopologyPolicy/a"}, "status": {"admitted": [
        {"source": "TopologyPolicy/a"}, {"source": "node-default"}, {"source": "pod"}]}}]
    rd = WorkloadState(policy="a", handled={"u1": {}}, gave_up={"u2": "t"})
    st = policies.compute_status(obj, [PolicyRef("a", obj["spec"]), twin],
                                 {"ml": {}, "web": {}}, nts, [rd])
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["Valid"]["status"] == "True"
    assert conds["Conflicting"]["status"] == "True" and "b" in conds["Conflicting"]["message"]
    assert conds["RedeployExhausted"]["status"] == "True"
    assert st["matchedNamespaces"] == ["ml"] and st["namespaceSummary"] == "ml"
    assert (st["admittedPods"], st["rejectedPods"], st["observedGeneration"]) == (2, 2, 3)
    bad = {"metadata": {"name": "x"}, "spec": {"policy": "nope"}}
    st = policies.compute_status(bad, [], {}, [], [])
    valid = next(c for c in st["conditions"] if c["type"] == "Valid")
    assert valid["status"] == "False" and "spec.policy" in valid["message"]


def test_unfit_on_a_real_node_judged_by_its_kubelets_policy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A real node's kubelet admits with its own policy (NodeTopology status.kubelet),
    whatever numalign resolved for the pod: two zones of 1 free CPU each cannot fit a
    2-CPU pod under its single-numa-node, though the pod resolved to best-effort."""
    zones = [{"id": 0, "available": {"cpu": 1}}, {"id": 1, "available": {"cpu": 1}}]
    nts = [{"metadata": {"name": "real"}, "spec": {"policy": "best-effort"},
            "status": {"zones": zones, "kubelet": {"topologyManagerPolicy":
                                                   "single-numa-node"}}},
           {"metadata": {"name": "emulated"}, "spec": {"policy": "best-effort"},
            "status": {"zones": zones}}]
    monkeypatch.setattr(avoidance.cache, "node_topologies", lambda: nts)
    pod = {"metadata": {"name": "p", "annotations": {"numalign.io/resolved": json.dumps(
        {"policy": "best-effort", "scope": "container", "source": "namespace-default"})}},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}}
    assert avoidance.unfit_nodes(pod) == ["real"]


def test_unfit_on_a_numalign_managed_node_judged_by_the_pods_own_policy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A numalign-managed (NRI) node publishes its kubelet's managers at none, yet numalign
    places there with the pod's own policy: a single-numa-node pod of 2 CPUs does not fit
    two zones of 1 free CPU each; the same pod under best-effort fits."""
    zones = [{"id": 0, "available": {"cpu": 1}}, {"id": 1, "available": {"cpu": 1}}]
    nri = {"type": "NRIPlacement", "status": "True", "reason": "Registered"}
    nts = [{"metadata": {"name": "nri"}, "spec": {},
            "status": {"zones": zones, "conditions": [nri],
                       "kubelet": {"topologyManagerPolicy": "none"}}}]
    monkeypatch.setattr(avoidance.cache, "node_topologies", lambda: nts)

    def pod(policy: str) -> dict[str, Any]:
        return {"metadata": {"name": "p", "annotations": {"numalign.io/resolved": json.dumps(
            {"policy": policy, "scope": "pod", "source": "pod"})}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]}}

    assert avoidance.unfit_nodes(pod("single-numa-node")) == ["nri"]
    assert avoidance.unfit_nodes(pod("best-effort")) == []
