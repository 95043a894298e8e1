"""One function decides which policy a pod gets on a node (numalign.api.effective): the
agent's two modes, the redeploy fit check, ``explain`` and the scheduler extender ask it."""

from __future__ import annotations

import json
from typing import Any

from nodetopology_docs import nodetopology
from numalign.api.effective import NodeKind, NodePolicy, Origin, effective_policy
from numalign.api.names import ANN_RESOLVED
from numalign.api.resolved import DEFERRED, Resolved

SNN = Resolved("single-numa-node", "pod", {}, "TopologyPolicy/ml")
SPEC = {"policy": "restricted", "scope": "container"}
KUBELET_NONE = {"topologyManagerPolicy": "none", "topologyManagerScope": "container",
                "cpuManagerPolicy": "none", "memoryManagerPolicy": "None"}
KUBELET_SNN = {"topologyManagerPolicy": "single-numa-node", "topologyManagerScope": "pod",
               "topologyManagerPolicyOptions": {"prefer-closest-numa-nodes": "true",
                                                "some-future-option": "true"}}


def _pod(resolved: str | None) -> dict[str, Any]:
    ann = {} if resolved is None else {ANN_RESOLVED: resolved}
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": ann}}


def _nt(spec: dict[str, Any] | None = None, kubelet: dict[str, Any] | None = None,
        placement: tuple[str, str] | None = None) -> dict[str, Any]:
    return nodetopology(spec, kubelet, placement)


def test_nri_managed_node_applies_the_pods_policy_not_the_kubelets_none() -> None:
    # A numalign-managed node publishes its kubelet's managers at none: the pod's own
    # single-numa-node still decides there (explain and the fit check used `none`).
    nt = _nt(SPEC, KUBELET_NONE, ("True", "Registered"))
    eff = effective_policy(_pod(SNN.annotation()), NodePolicy.from_nodetopology(nt))
    assert (eff.node_kind, eff.origin) == (NodeKind.NUMALIGN_MANAGED, Origin.POD)
    assert (eff.resolved.policy, eff.resolved.scope) == ("single-numa-node", "pod")
    assert not eff.by_kubelet


def test_nri_node_stays_managed_while_the_plugin_starts_or_the_runtime_is_away() -> None:
    for reason in ("Starting", "RuntimeUnavailable"):
        assert NodeKind.of(_nt(SPEC, KUBELET_NONE, ("False", reason))) \
            is NodeKind.NUMALIGN_MANAGED


def test_unlabelled_or_refused_nri_node_is_its_kubelets() -> None:
    for reason in ("NotManaged", "KubeletManagersOn"):
        nt = _nt(SPEC, KUBELET_SNN, ("False", reason))
        eff = effective_policy(_pod(SNN.annotation()), NodePolicy.from_nodetopology(nt))
        assert (eff.node_kind, eff.origin) == (NodeKind.KUBELET_MANAGED, Origin.KUBELET)


def test_kubelet_managed_node_applies_its_kubelets_policy_scope_and_known_options() -> None:
    nt = _nt(SPEC, KUBELET_SNN)
    eff = effective_policy(_pod(Resolved("none").annotation()),
                           NodePolicy.from_nodetopology(nt))
    assert eff.by_kubelet and eff.node_kind == NodeKind.KUBELET_MANAGED
    r = eff.resolved
    assert (r.policy, r.scope, r.source) == ("single-numa-node", "pod", "kubelet")
    assert dict(r.options.given) == {"prefer-closest-numa-nodes": "true"}
    assert r.options.engine.prefer_closest_numa_nodes


def test_kubelet_settings_that_are_not_a_policy_read_as_the_kubelets_defaults() -> None:
    nt = _nt(None, {"topologyManagerPolicy": "bogus", "topologyManagerScope": 7,
                    "topologyManagerPolicyOptions": {"max-allowable-numa-nodes": "2"}})
    r = effective_policy(_pod(None), NodePolicy.from_nodetopology(nt)).resolved
    assert (r.policy, r.scope, dict(r.options.given)) == ("none", "container", {})


def test_emulated_node_pod_resolution_then_node_default() -> None:
    node = NodePolicy.from_nodetopology(_nt(SPEC))
    assert node.kind == NodeKind.EMULATED
    eff = effective_policy(_pod(SNN.annotation()), node)
    assert (eff.origin, eff.resolved) == (Origin.POD, SNN)
    for ann in (None, DEFERRED.annotation()):
        eff = effective_policy(_pod(ann), node)
        assert (eff.origin, eff.resolved.policy, eff.problem) == \
            (Origin.NODE_DEFAULT, "restricted", None)


def test_malformed_resolution_falls_back_to_the_default_and_names_the_problem() -> None:
    node = NodePolicy.from_nodetopology(_nt(SPEC))
    for bad in ('{"policy": 7}', "not json", json.dumps({"policy": "x" * 5000})):
        eff = effective_policy(_pod(bad), node)
        assert eff.origin == Origin.NODE_DEFAULT and eff.resolved.policy == "restricted"
        assert eff.problem is not None and ANN_RESOLVED in eff.problem


def test_garbage_nodetopology_reads_as_an_emulated_node_with_no_default() -> None:
    for nt in (None, {}, {"spec": 3, "status": []},
               {"status": {"conditions": "x", "kubelet": ["y"]}}):
        node = NodePolicy.from_nodetopology(nt)  # type: ignore[arg-type]
        assert node.kind == NodeKind.EMULATED and node.default.policy == "none"
        assert effective_policy({"metadata": None}, node).resolved.policy == "none"
