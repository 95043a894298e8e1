"""What kind of node this is (``NodeKind.of``, the only classifier) and where a pod's policy
comes from there (``effective_policy``): every decider reads the same answer."""

from __future__ import annotations

from typing import Any

import pytest

import testdata
from nodetopology_docs import nodetopology
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api.effective import (
    NodeKind,
    NodePolicy,
    Origin,
    effective_policy,
    pod_or_node_default,
)
from numalign.api.names import ANN_RESOLVED
from numalign.api.nodetopology import NRI_PLACEMENT
from numalign.api.reads import NodeTopologyRead, PodRead
from numalign.api.resolved import DEFERRED, Resolved, node_default
from numalign.controller.nodedefaults import desired_spec
from numalign.topology.admit import admit_pod
from numalign.topology.ledger import Ledger
from numalign.topology.machine import load_machine
from numalign.topology.pod import pod_from_dict
from numalign.topology.policies import get_policy

SPEC = {"policy": "restricted", "scope": "container"}
KUBELET_SNN = {"topologyManagerPolicy": "single-numa-node", "topologyManagerScope": "pod"}
KUBELET_NONE = {"topologyManagerPolicy": "none", "cpuManagerPolicy": "none"}
SNN = Resolved("single-numa-node", "pod", {}, "TopologyPolicy/ml")


def _nt(kubelet: Any = None, placement: tuple[str, str] | None = None,
        spec: Any = None) -> dict[str, Any]:
    return nodetopology(spec or SPEC, kubelet, placement)


def _pod(resolved: str | None) -> dict[str, Any]:
    ann = {} if resolved is None else {ANN_RESOLVED: resolved}
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": ann}}


@pytest.mark.parametrize(("nt", "kind"), [
    (_nt(), NodeKind.EMULATED),
    (_nt(placement=("True", "Registered")), NodeKind.NUMALIGN_MANAGED),
    (_nt(KUBELET_NONE, ("True", "Registered")), NodeKind.NUMALIGN_MANAGED),
    (_nt(KUBELET_NONE, ("False", "Starting")), NodeKind.NUMALIGN_MANAGED),
    (_nt(KUBELET_NONE, ("False", "RuntimeUnavailable")), NodeKind.NUMALIGN_MANAGED),
    (_nt(KUBELET_SNN), NodeKind.KUBELET_MANAGED),
    (_nt(KUBELET_SNN, ("False", "NotManaged")), NodeKind.KUBELET_MANAGED),
    (_nt(KUBELET_SNN, ("False", "KubeletManagersOn")), NodeKind.KUBELET_MANAGED),
    # malformed parts read as absent
    (None, NodeKind.EMULATED),
    ({}, NodeKind.EMULATED),
    ({"spec": 3, "status": []}, NodeKind.EMULATED),
    ({"metadata": "x", "status": {"conditions": "x", "kubelet": ["y"]}}, NodeKind.EMULATED),
    ({"status": {"conditions": [7, None, {"type": NRI_PLACEMENT, "status": "True"}]}},
     NodeKind.NUMALIGN_MANAGED),
    ({"status": {"conditions": [{"type": 5}], "kubelet": {"topologyManagerPolicy": ""}}},
     NodeKind.EMULATED),
    ({"status": {"kubelet": KUBELET_SNN, "conditions": {"type": NRI_PLACEMENT}}},
     NodeKind.KUBELET_MANAGED),
])
def test_node_kind_of_a_nodetopology(nt: Any, kind: NodeKind) -> None:
    assert NodeKind.of(nt) is kind
    assert NodeKind.of(NodeTopologyRead.of(nt)) is kind  # the raw object or its read
    assert NodePolicy.from_nodetopology(nt).kind is kind


def test_a_labelled_node_is_numalign_managed_until_its_agent_says_otherwise() -> None:
    labelled = {"numalign.io/managed": "nri"}
    read = NodeTopologyRead.of(_nt(KUBELET_NONE))
    assert NodeKind.of(read) is NodeKind.KUBELET_MANAGED  # labels not known
    assert NodeKind.of(read.with_node_labels(labelled)) is NodeKind.NUMALIGN_MANAGED
    assert NodeKind.of(read.with_node_labels({})) is NodeKind.KUBELET_MANAGED
    refused = NodeTopologyRead.of(_nt(KUBELET_SNN, ("False", "KubeletManagersOn")))
    assert NodeKind.of(refused.with_node_labels(labelled)) is NodeKind.KUBELET_MANAGED


def test_who_places_on_each_kind() -> None:
    assert [k.placed_by for k in NodeKind] == [
        "numalign's kubelet emulator", "numalign's NRI plugin", "the kubelet"]
    assert [k.by_numalign for k in NodeKind] == [True, True, False]


def test_the_operators_node_default_follows_the_same_kind() -> None:
    pols = [{"metadata": {"name": "all"}, "spec": {"policy": "best-effort", "nodeSelector": {}}}]
    labelled = {"numalign.io/managed": "nri"}
    # the agent refused to place (the kubelet's managers are on): the kubelet decides, so
    # the default is its policy, as effective_policy and the extender see it
    refused = _nt(KUBELET_SNN, ("False", "KubeletManagersOn"))
    assert desired_spec(labelled, pols, refused)["source"] == "kubelet"
    assert NodePolicy.from_nodetopology(refused).kind is NodeKind.KUBELET_MANAGED
    registered = _nt(KUBELET_NONE, ("True", "Registered"))
    assert desired_spec(labelled, pols, registered)["source"] == "TopologyPolicy/all"
    assert desired_spec({}, pols, _nt())["source"] == "TopologyPolicy/all"


def test_effective_policy_origins() -> None:
    node = NodePolicy.from_nodetopology(_nt())
    eff = effective_policy(_pod(SNN.annotation()), node)
    assert (eff.origin, eff.name, eff.scope, eff.source) == (
        Origin.POD, "single-numa-node", "pod", "TopologyPolicy/ml")
    assert eff.policy is get_policy("single-numa-node") and eff.policy.single_numa
    for ann in (None, DEFERRED.annotation()):
        eff = effective_policy(_pod(ann), node)
        assert (eff.origin, eff.name, eff.source, eff.problem) == (
            Origin.NODE_DEFAULT, "restricted", "node-default", None)
    bad = effective_policy(_pod('{"policy": "sideways"}'), node)
    assert (bad.origin, bad.name) == (Origin.NODE_DEFAULT, "restricted")
    assert bad.problem is not None and "sideways" in bad.problem
    kubelet = effective_policy(_pod(SNN.annotation()),
                               NodePolicy.from_nodetopology(_nt(KUBELET_SNN)))
    assert (kubelet.origin, kubelet.node_kind, kubelet.name, kubelet.source) == (
        Origin.KUBELET, NodeKind.KUBELET_MANAGED, "single-numa-node", "kubelet")
    assert kubelet.by_kubelet and not eff.by_kubelet


def test_what_the_node_recorded_stands_for_its_default_not_for_the_pods_own() -> None:
    node = NodePolicy.from_nodetopology(_nt())
    recorded = Resolved("best-effort", "pod", {}, "node-default")
    eff = effective_policy(_pod(DEFERRED.annotation()), node, recorded=recorded)
    assert (eff.origin, eff.name, eff.scope) == (Origin.RECORDED, "best-effort", "pod")
    eff = effective_policy(_pod(SNN.annotation()), node, recorded=recorded)
    assert (eff.origin, eff.name) == (Origin.POD, "single-numa-node")
    eff = effective_policy(_pod(None), node, recorded=DEFERRED)
    assert (eff.origin, eff.name) == (Origin.NODE_DEFAULT, "restricted")


def test_one_rule_for_deferred_in_the_operator_and_on_the_node() -> None:
    default = node_default(SPEC)
    for value in (None, DEFERRED, SNN):
        # the operator's backstop reads the node's default as NodePolicy does
        assert NodePolicy.from_nodetopology({"spec": SPEC}).default == default
        ann = value.annotation() if value is not None else None
        eff = effective_policy(_pod(ann), NodePolicy(NodeKind.EMULATED, default))
        assert eff.resolved == pod_or_node_default(value, default)[0]


def test_reads_never_raise_and_ignore_what_they_do_not_read() -> None:
    for junk in (None, 3, "x", [], {"metadata": None}, {"metadata": {"annotations": 5}},
                 {"metadata": {"name": 7, "labels": {"a": None, "b": 1}}}):
        pod = PodRead.of(junk)
        assert pod.resolved_annotation is None
    pod = PodRead.of({"metadata": {"name": "p", "uid": "u", "resourceVersion": "9",
                                   "annotations": {ANN_RESOLVED: "{}"}},
                      "spec": {"containers": []}, "extra": 1})
    assert (pod.metadata.name, pod.metadata.resource_version, pod.resolved_annotation) == (
        "p", "9", "{}")
    nt = NodeTopologyRead.of(_nt(KUBELET_SNN))
    assert nt.metadata.name == "n" and nt.spec == SPEC
    assert nt.status.kubelet_policy == "single-numa-node"


def test_the_engine_takes_the_policy_object_or_its_name_alike() -> None:
    machine = load_machine(testdata.MACHINES / "seed-figure1.yaml")
    pod = pod_from_dict({"metadata": {"name": "p", "uid": "u"}, "spec": {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": "2", "memory": "1Gi"},
                                    "limits": {"cpu": "2", "memory": "1Gi"}}}]}})
    by_object = admit_pod(machine, Ledger(machine), pod, get_policy("single-numa-node"))
    by_name = admit_pod(machine, Ledger(machine), pod, "single-numa-node")
    assert by_object.admit and by_name.admit
    assert (by_object.policy, by_object.hint) == (by_name.policy, by_name.hint)


@pytest.mark.parametrize(("placement", "kind"), [
    (None, NodeKind.KUBELET_MANAGED),
    ((False, "NotManaged", "no label"), NodeKind.KUBELET_MANAGED),
    ((False, "KubeletManagersOn", "refused"), NodeKind.KUBELET_MANAGED),
    ((False, "Starting", "reading the Node's labels"), NodeKind.NUMALIGN_MANAGED),
    ((True, "Registered", "placing"), NodeKind.NUMALIGN_MANAGED),
])
def test_the_agent_publishes_the_policy_of_the_kind_every_reader_sees(
        placement: tuple[bool, str, str] | None, kind: NodeKind) -> None:
    st = NodeState("n", load_machine(testdata.MACHINES / "seed-figure1.yaml"))
    st.kubelet = {**KUBELET_SNN, "cpuManagerPolicy": "none"}
    st.placement = placement
    st.default = node_default(SPEC)
    status = build_status(st)
    assert NodeKind.of({"status": status}) is kind
    applied = next(c for c in status["conditions"] if c["type"] == "PolicyApplied")
    by_kubelet = applied["message"].startswith("the kubelet's Topology Manager policy")
    assert by_kubelet == (kind is NodeKind.KUBELET_MANAGED)
    if not by_kubelet:
        assert applied["message"] == "node default policy restricted, scope container"
