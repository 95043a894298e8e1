"""Policy resolution (numalign.api.resolution): pure, no Kubernetes."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from numalign.api.effective import NodePolicy, pod_or_node_default
from numalign.api.resolution import (
    ANN_POLICY,
    ANN_SCOPE,
    NODE_UNKNOWN,
    PodMeta,
    PolicyRef,
    Resolved,
    conflicts,
    matched_namespaces,
    node_default_for,
    node_spec_from,
    policy_problems,
    redeploy_settings,
    resolve,
    specificity,
)
from numalign.api.resolved import resolved_or_none
from numalign.api.selectors import selector_matches, selectors_disjoint
from numalign.topology.policies import names


def tp(name: str, **spec: Any) -> PolicyRef:
    spec.setdefault("policy", "best-effort")
    return PolicyRef(name, spec)


def over(ns: str = "default", labels: dict[str, str] | None = None, policy: str | None = None,
         scope: str | None = None) -> PodMeta:
    ann = {}
    if policy is not None:
        ann[ANN_POLICY] = policy
    if scope is not None:
        ann[ANN_SCOPE] = scope
    return PodMeta(ns, labels or {}, ann)


ML = tp("ml", policy="single-numa-node", scope="pod", namespaces=["ml"],
        podOverrides={"allowed": True, "policies": ["restricted", "single-numa-node"]})
BATCH = tp("batch", policy="best-effort", namespaces=["batch"],
           podOverrides={"allowed": True, "policies": ["restricted"]})


# ----------------------------------------------------------------------------- rule 2


def test_namespace_policies_apply() -> None:
    r = resolve(over("ml"), {}, [ML, BATCH])
    assert (r.policy, r.scope, r.source) == ("single-numa-node", "pod", "TopologyPolicy/ml")
    r = resolve(over("batch"), {}, [ML, BATCH])
    assert (r.policy, r.scope, r.source) == ("best-effort", "container", "TopologyPolicy/batch")
    assert r.governing == "batch" and not r.problems and not r.conflicting


def test_no_match_falls_to_node_default_then_none() -> None:
    r = resolve(over("other"), {}, [ML, BATCH])
    assert (r.policy, r.scope, r.source) == ("none", "container", "none")
    nd = {"policy": "restricted", "scope": "pod", "options": {"preferClosestNumaNodes": True}}
    r = resolve(over("other"), {}, [ML, BATCH], nd)
    assert (r.policy, r.scope, r.source) == ("restricted", "pod", "node-default")
    assert r.options.to_json() == {"preferClosestNumaNodes": True}
    r = resolve(over("other"), {}, [ML], {"policy": None})
    assert r.source == "none"
    r = resolve(over("other"), {}, [], {"policy": "bogus"})
    assert r.source == "none"


def complete_for_node(resolved: Resolved | None, spec: dict[str, Any] | None) -> Resolved:
    """What the operator's backstop writes once the pod is bound (controller/pods.py)."""
    return pod_or_node_default(resolved, NodePolicy.from_nodetopology({"spec": spec}).default)[0]


def test_unbound_pod_defers_to_node() -> None:
    r = resolve(over("other"), {}, [ML], NODE_UNKNOWN)
    assert r.deferred and r.source == "node-default"
    assert json.loads(r.annotation()) == {"policy": None, "scope": None, "options": {},
                                          "source": "node-default"}
    done = complete_for_node(resolved_or_none(r.annotation()), {"policy": "restricted"})
    assert (done.policy, done.scope, done.source) == ("restricted", "container", "node-default")
    assert complete_for_node(r, None).source == "none"
    assert complete_for_node(None, None).policy == "none"
    # A concrete resolution is kept as is.
    r2 = resolve(over("ml"), {}, [ML], NODE_UNKNOWN)
    assert complete_for_node(r2, {"policy": "none"}) is r2


def test_empty_spec_matches_everything() -> None:
    r = resolve(over("anything", {"a": "b"}), {}, [tp("all", policy="restricted")])
    assert r.source == "TopologyPolicy/all" and r.policy == "restricted"


def test_namespace_selector_and_list_must_both_match() -> None:
    both = tp("both", namespaces=["a", "b"], namespaceSelector={"matchLabels": {"t": "x"}})
    assert resolve(over("a"), {"t": "x"}, [both]).source == "TopologyPolicy/both"
    assert resolve(over("a"), {"t": "y"}, [both]).source == "none"
    assert resolve(over("c"), {"t": "x"}, [both]).source == "none"
    sel = tp("sel", namespaceSelector={"matchExpressions": [
        {"key": "team", "operator": "In", "values": ["ml", "ai"]}]})
    assert resolve(over("q"), {"team": "ai"}, [sel]).source == "TopologyPolicy/sel"
    assert resolve(over("q"), {"team": "web"}, [sel]).source == "none"
    assert resolve(over("q"), None, [sel]).source == "none"


def test_pod_selector_must_match() -> None:
    rt = tp("rt", policy="restricted", namespaces=["ml"],
            podSelector={"matchLabels": {"tier": "rt"}})
    assert resolve(over("ml", {"tier": "rt"}), {}, [rt]).source == "TopologyPolicy/rt"
    assert resolve(over("ml", {"tier": "web"}), {}, [rt]).source == "none"
    assert resolve(over("other", {"tier": "rt"}), {}, [rt]).source == "none"


def test_priority_wins_over_specificity() -> None:
    broad = tp("broad", policy="restricted", priority=10)
    narrow = tp("narrow", policy="single-numa-node", namespaces=["ml"],
                podSelector={"matchLabels": {"a": "1"}}, priority=5)
    r = resolve(over("ml", {"a": "1"}), {}, [narrow, broad])
    assert r.source == "TopologyPolicy/broad" and not r.conflicting


def test_specificity_breaks_priority_ties() -> None:
    broad = tp("a-broad", policy="restricted", priority=1)
    ns_sel = tp("b-sel", policy="best-effort", priority=1,
                namespaceSelector={"matchLabels": {"x": "1"}})
    ns_list = tp("c-list", policy="single-numa-node", priority=1, namespaces=["ml"])
    pod_sel = tp("d-pod", policy="none", priority=1, podSelector={"matchLabels": {"p": "1"}})
    p = over("ml", {"p": "1"})
    r = resolve(p, {"x": "1"}, [broad, ns_sel, ns_list, pod_sel])
    assert r.source == "TopologyPolicy/d-pod"
    assert resolve(over("ml"), {"x": "1"}, [broad, ns_sel, ns_list]).source == \
        "TopologyPolicy/c-list"
    assert resolve(over("zz"), {"x": "1"}, [broad, ns_sel]).source == "TopologyPolicy/b-sel"
    assert specificity(pod_sel.model) > specificity(ns_list.model) > specificity(ns_sel.model) \
        > specificity(broad.model)
    two = tp("e-two", priority=1, podSelector={"matchLabels": {"p": "1", "q": "2"}})
    assert resolve(over("ml", {"p": "1", "q": "2"}), {}, [pod_sel, two]).source == \
        "TopologyPolicy/e-two"


def test_equal_rank_is_a_conflict_decided_by_name() -> None:
    a = tp("alpha", policy="restricted", namespaces=["ml"])
    b = tp("beta", policy="single-numa-node", namespaces=["ml"])
    for order in itertools.permutations([a, b]):
        r = resolve(over("ml"), {}, list(order))
        assert r.source == "TopologyPolicy/alpha"
        assert r.conflicting == ("alpha", "beta")
    c = tp("gamma", policy="none", namespaces=["ml"], priority=1)
    assert resolve(over("ml"), {}, [a, b, c]).conflicting == ()


def test_invalid_policies_are_skipped() -> None:
    bad = tp("bad", policy="always", priority=100)
    neg = tp("neg", policy="restricted", priority=-1)
    badopt = tp("badopt", policy="restricted", options={"bogus": True})
    badsel = tp("badsel", policy="restricted",
                podSelector={"matchExpressions": [{"key": "a", "operator": "Near"}]})
    good = tp("good", policy="best-effort")
    r = resolve(over("x"), {}, [bad, neg, badopt, badsel, good])
    assert r.source == "TopologyPolicy/good"


# ----------------------------------------------------------------------------- rule 1


def test_valid_override() -> None:
    r = resolve(over("batch", policy="restricted"), {}, [ML, BATCH])
    assert (r.policy, r.scope, r.source, r.governing) == ("restricted", "container", "pod",
                                                          "batch")
    assert not r.problems
    r = resolve(over("ml", policy=" restricted ", scope="container"), {}, [ML, BATCH])
    assert (r.policy, r.scope, r.source) == ("restricted", "container", "pod")
    r = resolve(over("ml", scope="container"), {}, [ML])  # scope only keeps the policy
    assert (r.policy, r.scope, r.source) == ("single-numa-node", "container", "pod")


def test_override_takes_options_of_the_governing_policy() -> None:
    p = tp("p", policy="best-effort", options={"maxAllowableNumaNodes": 16},
           podOverrides={"allowed": True})
    r = resolve(over("x", policy="single-numa-node"), {}, [p])
    assert r.options.to_json() == {"maxAllowableNumaNodes": 16} and r.source == "pod"


def test_override_policies_unset_allows_all() -> None:
    p = tp("p", podOverrides={"allowed": True})
    for pol in names():
        assert resolve(over("x", policy=pol), {}, [p]).policy == pol


@pytest.mark.parametrize("value", ["single-numa-node", "none", "bogus", "", "Restricted"])
def test_override_not_in_allowed_list(value: str) -> None:
    r = resolve(over("batch", policy=value), {}, [ML, BATCH])
    assert r.source == "TopologyPolicy/batch" and r.policy == "best-effort"
    assert len(r.problems) == 1
    assert "numalign.io/policy" in r.problems[0]
    assert "allowed values: restricted" in r.problems[0]


def test_unknown_scope_lists_scopes() -> None:
    r = resolve(over("ml", scope="node"), {}, [ML])
    assert r.source == "TopologyPolicy/ml"
    assert r.problems == ("numalign.io/scope: 'node' is not a scope; allowed values: "
                          "container, pod",)


def test_both_bad_reports_both() -> None:
    r = resolve(over("ml", policy="x", scope="y"), {}, [ML])
    assert len(r.problems) == 2


def test_override_refused_when_not_allowed() -> None:
    strict = tp("strict", policy="restricted", namespaces=["prod"])
    r = resolve(over("prod", policy="best-effort"), {}, [strict])
    assert r.source == "TopologyPolicy/strict" and r.policy == "restricted"
    assert "does not allow pod overrides" in r.problems[0]
    denied = tp("denied", podOverrides={"allowed": False})
    assert resolve(over("x", scope="pod"), {}, [denied]).problems


def test_override_without_any_policy() -> None:
    r = resolve(over("x", policy="restricted"), {}, [], {"policy": "best-effort"})
    assert r.source == "node-default" and r.policy == "best-effort"
    assert "no TopologyPolicy that matches this pod allows them" in r.problems[0]
    r = resolve(over("x", policy="restricted"), {}, [], NODE_UNKNOWN)
    assert r.deferred and r.problems


def test_override_uses_the_winning_policy_only() -> None:
    # A lower-priority policy that allows overrides does not help.
    loose = tp("loose", podOverrides={"allowed": True})
    tight = tp("tight", policy="restricted", priority=5)
    r = resolve(over("x", policy="none"), {}, [loose, tight])
    assert r.source == "TopologyPolicy/tight" and r.problems


def test_malformed_metadata_never_raises() -> None:
    weird: list[Any] = [None, 5, "x", {"metadata": None}, {"metadata": {"labels": "a",
                        "annotations": ["x"]}}, {"metadata": {"annotations": {ANN_POLICY: None}}}]
    for obj in weird:
        meta = PodMeta.from_object(obj)
        assert resolve(meta, {}, [ML, BATCH]).policy == "none"
    m = PodMeta.from_object({"metadata": {"namespace": "ml", "labels": {"a": 1},
                                          "annotations": {ANN_POLICY: 7}}})
    r = resolve(m, {}, [ML])
    assert r.problems and r.source == "TopologyPolicy/ml"


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("spec,field", [
    ({"policy": "always"}, "spec.policy"),
    ({}, "spec.policy"),
    ({"policy": "none", "scope": "node"}, "spec.scope"),
    ({"policy": "none", "priority": -1}, "spec.priority"),
    ({"policy": "none", "priority": True}, "spec.priority"),
    ({"policy": "none", "options": {"nope": 1}}, "spec.options.nope"),
    ({"policy": "none", "options": {"maxAllowableNumaNodes": 4}},
     "spec.options.maxAllowableNumaNodes"),
    ({"policy": "none", "options": {"maxAllowableNumaNodes": 65}},
     "spec.options.maxAllowableNumaNodes"),
    ({"policy": "none", "options": {"preferClosestNumaNodes": "yes"}},
     "spec.options.preferClosestNumaNodes"),
    ({"policy": "none", "namespaces": "ml"}, "spec.namespaces"),
    ({"policy": "none", "podSelector": {"matchLabels": {"a": 1}}}, "spec.podSelector"),
    ({"policy": "none", "nodeSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
     "spec.nodeSelector"),
    ({"policy": "none", "namespaceSelector": {"matchExpressions": [
        {"key": "a", "operator": "Exists", "values": ["x"]}]}}, "spec.namespaceSelector"),
    ({"policy": "none", "podOverrides": {"allowed": "yes"}}, "spec.podOverrides.allowed"),
    ({"policy": "none", "podOverrides": {"allowed": True, "policies": ["x"]}},
     "spec.podOverrides.policies"),
    ({"policy": "none", "redeploy": {"maxAttempts": -1}}, "spec.redeploy.maxAttempts"),
    ({"policy": "none", "redeploy": {"enabled": "no"}}, "spec.redeploy.enabled"),
])
def test_policy_problems_name_the_field(spec: dict[str, Any], field: str) -> None:
    problems = policy_problems(spec)
    assert problems and any(p.startswith(field) for p in problems), problems


def test_valid_policy_has_no_problems() -> None:
    spec = {"policy": "single-numa-node", "scope": "pod",
            "options": {"preferClosestNumaNodes": False, "maxAllowableNumaNodes": 64},
            "namespaces": ["ml"], "podSelector": {"matchLabels": {"tier": "rt"}},
            "nodeSelector": {"matchLabels": {"pool": "gpu"}}, "priority": 10,
            "podOverrides": {"allowed": True, "policies": ["restricted", "single-numa-node"]},
            "redeploy": {"enabled": True, "maxAttempts": 5, "backoffSeconds": 10,
                         "avoidRejectingNodes": True}}
    assert policy_problems(spec) == []
    assert policy_problems(None) == ["spec: must be an object"]


# ----------------------------------------------------------------------------- selectors


@pytest.mark.parametrize("sel,labels,expected", [
    (None, {}, True),
    ({}, {"a": "1"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "1"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"},
     True),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    ({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}, {"a": ""}, False),
    ("nonsense", {}, False),
])
def test_selector_matches(sel: Any, labels: dict[str, str], expected: bool) -> None:
    assert selector_matches(sel, labels) is expected


def test_selectors_disjoint() -> None:
    a = {"matchLabels": {"t": "a"}}
    b = {"matchLabels": {"t": "b"}}
    assert selectors_disjoint(a, b)
    assert not selectors_disjoint(a, {"matchLabels": {"u": "b"}})
    assert not selectors_disjoint(None, a)
    assert selectors_disjoint(a, {"matchExpressions": [{"key": "t", "operator": "DoesNotExist"}]})
    assert selectors_disjoint(a, {"matchExpressions": [
        {"key": "t", "operator": "NotIn", "values": ["a"]}]})
    assert not selectors_disjoint(a, {"matchExpressions": [
        {"key": "t", "operator": "In", "values": ["a", "b"]}]})


# ----------------------------------------------------------------------------- conflicts


def test_conflicts_need_a_shared_namespace() -> None:
    nss = {"ml": {"team": "ml"}, "web": {}}
    a = tp("a", namespaces=["ml"])
    b = tp("b", namespaceSelector={"matchLabels": {"team": "ml"}})  # less specific: no conflict
    c = tp("c", namespaces=["ml", "web"])
    d = tp("d", namespaces=["web"])
    e = tp("e", namespaces=["ml"], podSelector={"matchLabels": {"x": "1"}})
    out = conflicts([a, b, c, d, e], nss)
    assert out == {"a": ["c"], "b": [], "c": ["a", "d"], "d": ["c"], "e": []}
    f = tp("f", namespaces=["ml"], podSelector={"matchLabels": {"x": "2"}})
    assert conflicts([e, f], nss) == {"e": [], "f": []}  # disjoint pods
    g = tp("g", namespaces=["ml"], priority=3)
    assert conflicts([a, g], nss) == {"a": [], "g": []}
    assert matched_namespaces(b, nss) == ["ml"]
    assert matched_namespaces(tp("all"), nss) == ["ml", "web"]


# ----------------------------------------------------------------------------- node defaults


def test_node_default_for() -> None:
    gpu = tp("gpu", policy="single-numa-node", scope="pod",
             nodeSelector={"matchLabels": {"pool": "gpu"}}, options={"maxAllowableNumaNodes": 16})
    any_node = tp("any", policy="best-effort", nodeSelector={})
    hi = tp("hi", policy="restricted", nodeSelector={"matchLabels": {"pool": "gpu"}}, priority=2)
    plain = tp("plain", policy="restricted")  # no nodeSelector: never a node default
    assert node_default_for({"pool": "gpu"}, [gpu, any_node, plain])[0] == gpu
    assert node_default_for({"pool": "cpu"}, [gpu, any_node, plain])[0] == any_node
    assert node_default_for({"pool": "cpu"}, [gpu, plain]) == (None, ())
    assert node_default_for({"pool": "gpu"}, [gpu, hi])[0] == hi
    twin = tp("gpu2", policy="restricted", nodeSelector={"matchLabels": {"pool": "gpu"}})
    winner, tied = node_default_for({"pool": "gpu"}, [twin, gpu])
    assert winner == gpu and tied == ("gpu", "gpu2")
    assert node_spec_from(gpu) == {"policy": "single-numa-node", "scope": "pod",
                                   "options": {"maxAllowableNumaNodes": 16}}
    assert node_spec_from(None) == {}


def test_node_selector_does_not_restrict_pod_resolution() -> None:
    gpu = tp("gpu", policy="single-numa-node", namespaces=["ml"],
             nodeSelector={"matchLabels": {"pool": "gpu"}})
    r = resolve(over("ml"), {}, [gpu], {"policy": "none"})
    assert r.source == "TopologyPolicy/gpu"


# ----------------------------------------------------------------------------- annotation


def test_annotation_round_trip() -> None:
    r = resolve(over("ml"), {}, [tp("ml", policy="restricted",
                                    options={"preferClosestNumaNodes": True})])
    text = r.annotation()
    assert json.loads(text) == {"policy": "restricted", "scope": "container",
                                "options": {"preferClosestNumaNodes": True},
                                "source": "TopologyPolicy/ml"}
    back = resolved_or_none(text)
    assert back is not None and back.to_json() == r.to_json()


@pytest.mark.parametrize("text", [
    None, "", "{", "[]", "null", '{"policy": "x", "scope": "pod", "source": "pod"}',
    '{"policy": "none", "scope": "x", "source": "pod"}',
    '{"policy": "none", "scope": "pod", "source": "elsewhere"}',
    '{"policy": "none", "scope": "pod", "source": "TopologyPolicy/"}',
    '{"policy": "none", "scope": "pod", "source": "pod", "options": {"x": 1}}',
    '{"policy": "none", "scope": "pod", "source": "pod", "options": 3}',
])
def test_parse_resolved_rejects_malformed(text: str | None) -> None:
    assert resolved_or_none(text) is None


def test_resolved_is_plain_data() -> None:
    r = Resolved("none", "container", {}, "none")
    assert not r.deferred and r.annotation() == \
        '{"options":{},"policy":"none","scope":"container","source":"none"}'


def test_redeploy_settings_defaults() -> None:
    d = redeploy_settings(None)
    assert (d.enabled, d.max_attempts, d.backoff_seconds, d.avoid_rejecting_nodes) == \
        (True, 3, 10, True)
    s = redeploy_settings(tp("s", redeploy={"enabled": False, "maxAttempts": 7,
                                            "backoffSeconds": 1, "avoidRejectingNodes": False}))
    assert (s.enabled, s.max_attempts, s.backoff_seconds, s.avoid_rejecting_nodes) == \
        (False, 7, 1, False)
    # An invalid policy governs nothing; its settings are the defaults.
    assert redeploy_settings(tp("x", redeploy={"maxAttempts": "x"})).max_attempts == 3

