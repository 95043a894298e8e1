"""Pod annotations the agent reads (numalign.io/resolved) and writes (numalign.io/allocation)."""

from __future__ import annotations

import json

import pytest

from numalign.agent.annotations import (
    ALLOCATION,
    RESOLVED,
    Allocation,
    AnnotationError,
    ContainerAllocation,
    Resolved,
    parse_allocation,
    parse_resolved,
    resolve_pod,
    resolved_from_spec,
)

DEFAULT = Resolved("restricted", "pod", {}, "node-default")


def _pod(annotations: dict[str, str] | None = None) -> dict[str, object]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1",
                         "annotations": annotations or {}}}


def test_resolved_annotation_parsed() -> None:
    r = parse_resolved(json.dumps({"policy": "single-numa-node", "scope": "pod",
                                   "options": {"preferClosestNumaNodes": True},
                                   "source": "TopologyPolicy/ml"}))
    assert r == Resolved("single-numa-node", "pod", {"prefer-closest-numa-nodes": "true"},
                         "TopologyPolicy/ml")


def test_resolved_defaults_scope_and_source() -> None:
    r = parse_resolved('{"policy": "best-effort"}')
    assert (r.policy, r.scope, r.source) == ("best-effort", "container", "pod")


@pytest.mark.parametrize(("value", "problem"), [
    ("{not json", "is not valid JSON"),
    ('["single-numa-node"]', "must be a JSON object"),
    ('{"policy": "strict"}', "policy must be one of"),
    ('{"policy": "restricted", "scope": "node"}', "scope must be container or pod"),
    ('{"policy": "restricted", "options": {"bogus": 1}}', "unknown option 'bogus'"),
    ('{"policy": "restricted", "options": {"maxAllowableNumaNodes": 4}}', "must be >= 8"),
    ('{"policy": "restricted", "options": []}', "options must be an object"),
])
def test_malformed_resolved_names_the_problem(value: str, problem: str) -> None:
    with pytest.raises(AnnotationError, match=problem) as e:
        parse_resolved(value)
    assert RESOLVED in str(e.value)


def test_resolve_pod_falls_back_to_node_default() -> None:
    assert resolve_pod(_pod(), DEFAULT) == (DEFAULT, None)
    r, problem = resolve_pod(_pod({RESOLVED: '{"policy": 7}'}), DEFAULT)
    assert r == DEFAULT
    assert problem is not None and "policy must be one of" in problem
    r, problem = resolve_pod(_pod({RESOLVED: '{"policy": "none", "source": "none"}'}), DEFAULT)
    assert r.policy == "none" and problem is None


def test_deferred_resolution_takes_the_node_default_without_a_warning() -> None:
    # The operator resolves unbound pods that no policy matches to "this node's default".
    deferred = '{"options":{},"policy":null,"scope":null,"source":"node-default"}'
    assert resolve_pod(_pod({RESOLVED: deferred}), DEFAULT) == (DEFAULT, None)


def test_node_default_from_spec() -> None:
    assert resolved_from_spec(None).policy == "none"
    r = resolved_from_spec({"policy": "single-numa-node", "scope": "pod",
                            "options": {"maxAllowableNumaNodes": 16}, "policyGeneration": 3})
    assert r == Resolved("single-numa-node", "pod", {"max-allowable-numa-nodes": "16"},
                         "node-default")
    assert resolved_from_spec({"policy": "bogus"}).policy == "none"


def test_allocation_round_trip() -> None:
    a = Allocation(numa_nodes=[0], containers={
        "main": ContainerAllocation(cpus=[0, 1], memory={"0": 200 << 20},
                                    devices={"gpu-vendor.com/gpu": ["gpu0"]},
                                    hugepages={"2Mi": {"0": 4 << 20}})},
        gpus={"0": ["gpu0"]})
    text = a.to_annotation()
    doc = json.loads(text)
    assert doc["numaNodes"] == [0]
    assert doc["containers"]["main"]["cpus"] == [0, 1]
    assert doc["containers"]["main"]["memory"] == {"0": 200 << 20}
    assert doc["containers"]["main"]["devices"] == {"gpu-vendor.com/gpu": ["gpu0"]}
    assert doc["gpus"] == {"0": ["gpu0"]}
    back = parse_allocation(text)
    assert back == a
    assert back.cpus == [0, 1]
    assert back.devices == {"gpu-vendor.com/gpu": ["gpu0"]}
    assert back.memory == {"0": 200 << 20}


@pytest.mark.parametrize("value", [
    "nope", "[]", '{"containers": {"c": {"cpus": ["a"]}}}',
    '{"containers": {"c": {"memory": {"0": "lots"}}}}', '{"numaNodes": "0"}',
])
def test_bad_allocation_refused(value: str) -> None:
    with pytest.raises(AnnotationError, match=ALLOCATION):
        parse_allocation(value)
