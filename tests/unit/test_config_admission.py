"""config/'s admission policies (ValidatingAdmissionPolicies and the
MutatingAdmissionPolicy that marks a creator's own resolution): each is bound to the exact
identity it confines in any overlay, and guards exactly the annotations and marks
numalign's code names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from config_helpers import (
    Obj,
    default_objects,
    default_overlay,
    named,
    of_kind,
    pod_spec,
    role_rules,
)
from numalign.api.names import (
    ANN_ALLOCATION,
    ANN_OVERRIDE_WARNED,
    ANN_REDEPLOY_OF,
    ANN_REDEPLOY_OF_UID,
    ANN_REJECTION,
    ANN_RESOLVED,
    ANN_TOLERATE_UNPLACED,
    REDEPLOY_GATE,
    REJECT_REASON,
)


@pytest.fixture
def default() -> list[Obj]:
    return default_objects()


def test_node_restriction_policy_is_bound(default: list[Obj]) -> None:
    vap = named(default, "ValidatingAdmissionPolicy", "numalign-agent-node-restriction")
    binding = named(default, "ValidatingAdmissionPolicyBinding",
                     "numalign-agent-node-restriction")
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert vap["spec"]["failurePolicy"] == "Fail"
    text = yaml.safe_dump(vap)
    assert "authentication.kubernetes.io/node-name" in text
    rules = vap["spec"]["matchConstraints"]["resourceRules"]
    covered = {r for rule in rules for r in rule["resources"]}
    assert {"nodetopologies", "nodetopologies/status", "pods/status"} <= covered


def _cel_names(policy: Obj, prefix: str = "numalign.io/") -> set[str]:
    """The ``numalign.io/...`` names in a policy's CEL and messages."""
    text = yaml.safe_dump(policy["spec"], width=10_000)
    return set(re.findall(re.escape(prefix) + r"[a-z0-9][a-z0-9.-]*[a-z0-9]", text))


# The mark numalign-resolved-at-creation puts on a pod whose creator brought its own
# numalign.io/resolved (config/tenancy/resolved_at_creation.yaml); nothing in numalign
# reads it: the pod-annotation guard refuses a marked pod.
CREATOR_MARK = "numalign.io/resolved-set-by-creator"


def test_pod_annotation_guard_names_wires_annotations(default: list[Obj]) -> None:
    """No drift: the policy guards exactly the annotations numalign.api.names names (and
    the mark of the mutating policy that runs before the webhooks), on pod writes and on
    Bindings, whose annotations the API server merges into the pod."""
    vap = named(default, "ValidatingAdmissionPolicy", "numalign-pod-annotations")
    assert _cel_names(vap) == {ANN_RESOLVED, ANN_ALLOCATION, ANN_REJECTION,
                               ANN_TOLERATE_UNPLACED, CREATOR_MARK}
    binding = named(default, "ValidatingAdmissionPolicyBinding", "numalign-pod-annotations")
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert vap["spec"]["failurePolicy"] == "Fail"
    pods, bindings = vap["spec"]["matchConstraints"]["resourceRules"]
    assert set(pods["operations"]) == {"CREATE", "UPDATE"}
    assert set(pods["resources"]) == {"pods", "pods/status"}
    assert bindings["operations"] == ["CREATE"]
    assert set(bindings["resources"]) == {"pods/binding", "bindings"}
    # The mark is set in the API server, before the webhooks, from the same parameter.
    map_ = named(default, "MutatingAdmissionPolicy", "numalign-resolved-at-creation")
    assert _cel_names(map_) == {ANN_RESOLVED, CREATOR_MARK}
    assert map_["spec"]["failurePolicy"] == "Fail"
    assert map_["spec"]["reinvocationPolicy"] == "Never"
    assert map_["spec"]["paramKind"] == vap["spec"]["paramKind"]
    [rule] = map_["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["operations"], rule["resources"]) == (["CREATE"], ["pods"])
    map_binding = named(default, "MutatingAdmissionPolicyBinding",
                         "numalign-resolved-at-creation")
    assert map_binding["spec"]["paramRef"] == binding["spec"]["paramRef"]
    param = named(default, "ConfigMap", "numalign-pod-annotations")
    assert param["data"]["tolerate-unplaced-namespaces"] == "kube-system"
    assert param["data"]["trusted-groups"] == "system:masters"


def test_operator_restriction_names_the_operators_own_marks(default: list[Obj]) -> None:
    vap = named(default, "ValidatingAdmissionPolicy", "numalign-operator-restriction")
    assert _cel_names(vap) == {ANN_RESOLVED, ANN_OVERRIDE_WARNED, ANN_REDEPLOY_OF,
                               ANN_REDEPLOY_OF_UID, REDEPLOY_GATE}
    text = yaml.safe_dump(vap["spec"], width=10_000)
    assert f"'{REJECT_REASON}'" in text and "'kube-system'" in text
    ops = {(op, r) for rule in vap["spec"]["matchConstraints"]["resourceRules"]
           for op in rule["operations"] for r in rule["resources"]}
    assert {("DELETE", "pods"), ("UPDATE", "pods"), ("CREATE", "pods")} <= ops


def _identity(obj: Obj) -> str:
    return f"system:serviceaccount:{obj['metadata']['namespace']}:{obj['metadata']['name']}"


@pytest.mark.parametrize("fields", [{}, {"namePrefix": "prod-"},
                                    {"namePrefix": "team-a-", "namespace": "numalign-a"}],
                         ids=["default", "prefix", "prefix+namespace"])
def test_admission_policies_bind_the_exact_identities_in_any_overlay(
        tmp_path: Path, fields: dict[str, str]) -> None:
    """Every policy is bound; each binding's parameter is the ServiceAccount that the
    workload it confines runs as; the match is that exact user, not a name suffix."""
    objs = default_overlay(tmp_path, **fields)
    prefix = fields.get("namePrefix", "")
    accounts = {(o["metadata"]["namespace"], o["metadata"]["name"]): o
                for o in of_kind(objs, "ServiceAccount")}
    policies = {o["metadata"]["name"]: o for o in of_kind(objs, "ValidatingAdmissionPolicy")}
    bindings = of_kind(objs, "ValidatingAdmissionPolicyBinding")
    assert {b["spec"]["policyName"] for b in bindings} == set(policies)
    runs_as = {w["kind"]: (w["metadata"]["namespace"], pod_spec(w)["serviceAccountName"])
               for w in of_kind(objs, "DaemonSet", "StatefulSet")}
    confined = {f"{prefix}numalign-agent-node-restriction": runs_as["DaemonSet"],
                f"{prefix}numalign-agent-events": runs_as["DaemonSet"],
                f"{prefix}numalign-agent-lease": runs_as["DaemonSet"],
                f"{prefix}numalign-operator-restriction": runs_as["StatefulSet"]}
    # The pod-annotation guard's parameter is its ConfigMap in the install namespace,
    # whose ServiceAccounts (the operator's and the agent's among them) it trusts.
    [guard] = [b for b in bindings
               if b["spec"]["policyName"] == f"{prefix}numalign-pod-annotations"]
    bindings = [b for b in bindings if b is not guard]
    ref = guard["spec"]["paramRef"]
    [param] = [c for c in of_kind(objs, "ConfigMap") if c["metadata"]["name"] == ref["name"]]
    assert ref["namespace"] == param["metadata"]["namespace"] == runs_as["StatefulSet"][0]
    assert policies[guard["spec"]["policyName"]]["spec"]["paramKind"] == {
        "apiVersion": "v1", "kind": "ConfigMap"}
    # The mutating policy that marks a creator's own numalign.io/resolved reads the same.
    [marker] = of_kind(objs, "MutatingAdmissionPolicyBinding")
    assert marker["spec"]["policyName"] == f"{prefix}numalign-resolved-at-creation"
    assert marker["spec"]["policyName"] in {
        o["metadata"]["name"] for o in of_kind(objs, "MutatingAdmissionPolicy")}
    assert marker["spec"]["paramRef"] == ref
    for b in bindings:
        policy = policies[b["spec"]["policyName"]]
        ref = b["spec"]["paramRef"]
        assert (ref["namespace"], ref["name"]) == confined[policy["metadata"]["name"]]
        assert (ref["namespace"], ref["name"]) in accounts, ref
        assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ServiceAccount"}
        [cond] = policy["spec"]["matchConditions"]
        expr = " ".join(cond["expression"].split())
        assert expr == ("request.userInfo.username == 'system:serviceaccount:' + "
                        "params.metadata.namespace + ':' + params.metadata.name"), expr
        assert "endsWith" not in yaml.safe_dump(policy)
    # The RBAC bindings follow the same renames.
    for rb in of_kind(objs, "ClusterRoleBinding", "RoleBinding"):
        for subject in rb["subjects"]:
            assert (subject["namespace"], subject["name"]) in accounts, (rb, subject)


def test_agent_policies_cover_its_writes_and_events(default: list[Obj]) -> None:
    covered = set()
    for name in ("numalign-agent-node-restriction", "numalign-agent-events",
                 "numalign-agent-lease"):
        vap = named(default, "ValidatingAdmissionPolicy", name)
        for rule in vap["spec"]["matchConstraints"]["resourceRules"]:
            covered |= {(g, r) for g in rule["apiGroups"] for r in rule["resources"]}
    agent = [*role_rules(default, "numalign-agent"),
             *named(default, "Role", "numalign-agent")["rules"]]
    written = {(g, r) for rule in agent for g in rule["apiGroups"] for r in rule["resources"]
               if set(rule["verbs"]) & {"create", "update", "patch", "delete"}}
    assert ("coordination.k8s.io", "leases") in written
    assert written <= covered, written - covered
    assert ("", "events") in covered
    # events.k8s.io Events are converted to core/v1 for it (matchPolicy Equivalent).
    vap = named(default, "ValidatingAdmissionPolicy", "numalign-agent-events")
    assert vap["spec"]["matchConstraints"].get("matchPolicy", "Equivalent") == "Equivalent"
    events = yaml.safe_dump(named(default, "ValidatingAdmissionPolicy",
                                   "numalign-agent-events"))
    assert "involvedObject" in events and "reportingInstance" in events
