"""The wire contract: numalign.io/resolved (the operator writes it, the agent reads it),
numalign.io/allocation (the agent writes it) and NodeTopology status.admitted entries."""

from __future__ import annotations

import json

import pytest

from numalign.api.allocation import (
    Admitted,
    Allocation,
    ContainerRecord,
    parse_admitted,
    parse_allocation,
)
from numalign.api.errors import WireError
from numalign.api.names import ANN_ALLOCATION, ANN_RESOLVED
from numalign.api.nodetopology import NodeTopologyStatus
from numalign.api.resolved import NONE, Resolved, node_default, parse_options, parse_resolved
from numalign.topology.policyconfig import PolicyOptions


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
    with pytest.raises(WireError, match=problem) as e:
        parse_resolved(value)
    assert ANN_RESOLVED in str(e.value)


def test_node_default_from_spec() -> None:
    assert node_default(None).policy == "none"
    r = node_default({"policy": "single-numa-node", "scope": "pod",
                            "options": {"maxAllowableNumaNodes": 16}, "policyGeneration": 3})
    assert r == Resolved("single-numa-node", "pod", {"max-allowable-numa-nodes": "16"},
                         "node-default")
    assert node_default({"policy": "bogus"}).policy == "none"


def test_allocation_round_trip() -> None:
    a = Allocation(numa_nodes=[0], containers={
        "main": ContainerRecord(cpus=[0, 1], memory={"0": 200 << 20},
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
    with pytest.raises(WireError, match=ANN_ALLOCATION):
        parse_allocation(value)


def _one_container(**fields: object) -> str:
    return json.dumps({"numaNodes": [0], "containers": {"c": {"cpus": [1], **fields}}})


@pytest.mark.parametrize(("value", "field"), [
    # each parses as JSON and as the right types, but names what no machine has: the
    # restart that reads it back must refuse it with the field, not fail in the engine
    (_one_container(memory={"x": 1024}), r"containers\.c\.memory: zone 'x' is not"),
    (_one_container(memory={"-1": 1024}), r"containers\.c\.memory: zone '-1' is not"),
    (_one_container(hugepages={"2Mi": {"0,x": 2048}}),
     r"containers\.c\.hugepages\.2Mi: zone '0,x' is not"),
    (_one_container(numaNodes=[-1]), r"containers\.c\.numaNodes: -1 is not a NUMA node id"),
    (_one_container(memoryNumaNodes=[10**11]),
     r"containers\.c\.memoryNumaNodes: 100000000000 is not a NUMA node id"),
    (json.dumps({"numaNodes": [256]}), r"allocation\.numaNodes: 256 is not a NUMA node id"),
    (_one_container(cpus=[0, 10**11]), r"containers\.c\.cpus: 100000000000 is not a CPU id"),
    (_one_container(cpus=[1] * 9000), r"containers\.c\.cpus: 9000 ids, at most"),
    (json.dumps({"containers": {"c": {"numaNodes": [0] * 1000}}}),
     r"containers\.c\.numaNodes: 1000 ids, at most"),
    (json.dumps({"containers": {f"c{i}": {} for i in range(2000)}}),
     r"containers: 2000 containers, at most"),
])
def test_an_allocation_naming_what_no_machine_has_is_refused_with_the_field(
        value: str, field: str) -> None:
    with pytest.raises(WireError, match=field):
        parse_allocation(value)
    entry = {"pod": "p", "uid": "u", **json.loads(value)}
    if isinstance(entry.get("containers"), dict):  # status.admitted lists its containers
        entry["containers"] = [{"name": n, **c} for n, c in entry["containers"].items()]
    with pytest.raises(WireError):
        parse_admitted(entry)


def test_multi_node_memory_zones_stay_readable() -> None:
    # a memory block on two NUMA nodes is keyed by both (the kubelet's view of a real node)
    a = parse_allocation(_one_container(memory={"0,1": 1024}))
    assert a.containers["c"].memory == {"0,1": 1024}


# ---------------------------------------------------------------- options, sources


def test_options_are_parsed_once_into_the_engine_value() -> None:
    opts = parse_options({"preferClosestNumaNodes": True, "max-allowable-numa-nodes": "16"})
    assert opts.engine == PolicyOptions(prefer_closest_numa_nodes=True,
                                        max_allowable_numa_nodes=16)
    assert opts.to_json() == {"preferClosestNumaNodes": True, "maxAllowableNumaNodes": 16}
    assert parse_options(None).engine == PolicyOptions() and not parse_options({})
    # The engine's (the kubelet's) wording for a value it cannot read.
    with pytest.raises(WireError, match='bad value for option "prefer-closest-numa-nodes"'):
        parse_options({"preferClosestNumaNodes": "maybe"})
    with pytest.raises(WireError, match="must be >= 8"):
        parse_options({"maxAllowableNumaNodes": 7})


def test_resolved_carries_the_parsed_options() -> None:
    r = parse_resolved('{"policy": "restricted", "scope": "pod", "source": "pod", '
                       '"options": {"maxAllowableNumaNodes": 16}}')
    assert r.options.engine.max_allowable_numa_nodes == 16
    assert json.loads(r.annotation())["options"] == {"maxAllowableNumaNodes": 16}


@pytest.mark.parametrize("source", ["elsewhere", "TopologyPolicy/", "", 7])
def test_resolved_source_must_be_one_the_operator_writes(source: object) -> None:
    with pytest.raises(WireError, match="source must be"):
        parse_resolved(json.dumps({"policy": "none", "scope": "pod", "source": source}))


def test_deferred_resolution_is_one_value() -> None:
    r = parse_resolved('{"options":{},"policy":null,"scope":null,"source":"node-default"}')
    assert r.deferred and r.annotation() == \
        '{"options":{},"policy":null,"scope":null,"source":"node-default"}'
    with pytest.raises(WireError, match="policy must be one of"):
        parse_resolved('{"policy": null, "scope": null, "source": "pod"}')


# ---------------------------------------------------------------- status.admitted


def _held() -> tuple[Resolved, Allocation]:
    alloc = Allocation(numa_nodes=[0, 1], containers={
        "app": ContainerRecord(cpus=[0, 1, 2], memory={"0": 1 << 30, "1": 1 << 30},
                                   devices={"nvidia.com/gpu": ["g0"]}, numa_nodes=[0, 1],
                                   hugepages={"2Mi": {"0": 4 << 20}})},
        gpus={"0": ["g0"]})
    return Resolved("restricted", "pod", {"maxAllowableNumaNodes": 16}, "TopologyPolicy/ml"), \
        alloc


def test_admitted_entry_round_trip() -> None:
    resolved, alloc = _held()
    entry = Admitted("p", "ns", "u1", resolved, alloc).to_json()
    assert entry["cpus"] == "0-2" and entry["options"] == {"maxAllowableNumaNodes": 16}
    assert entry["containers"][0]["cpus"] == "0-2"
    back = parse_admitted(json.loads(json.dumps(entry)))
    assert back == Admitted("p", "ns", "u1", resolved, alloc)
    assert back.resolved.options.engine.max_allowable_numa_nodes == 16


def test_admitted_entry_keeps_the_memory_affinity() -> None:
    """A container whose memory is held on fewer NUMA nodes than its affinity (the memory
    manager's block): the published entry says so, and the NodeTopology schema keeps it
    (a restarted agent and the scheduler extender rebuild the node's ledger from it; read
    as the whole affinity, a later pod's memory hints differ from the node's)."""
    alloc = Allocation(numa_nodes=[0, 1], containers={
        "app": ContainerRecord(cpus=[0, 1], memory={"0": 1 << 30}, numa_nodes=[0, 1],
                               memory_numa_nodes=[0])})
    entry = json.loads(json.dumps(Admitted("p", "ns", "u1", NONE, alloc).to_json()))
    assert entry["containers"][0]["memoryNumaNodes"] == [0]
    assert parse_admitted(entry).allocation.containers["app"].memory_numa_nodes == [0]
    status = NodeTopologyStatus.model_validate({"admitted": [entry]})
    dumped = status.model_dump(by_alias=True, exclude_none=True)
    assert dumped["admitted"][0]["containers"][0]["memoryNumaNodes"] == [0]


def test_admitted_totals_without_containers() -> None:
    got = parse_admitted({"pod": "p", "uid": "u", "policy": "best-effort", "cpus": "0-3",
                          "memory": {"0": "1Gi"}, "numaNodes": [0]})
    c = got.allocation.containers[""]
    assert (c.cpus, c.memory, c.numa_nodes) == ([0, 1, 2, 3], {"0": 1 << 30}, [0])
    assert got.resolved.policy == "best-effort" and got.namespace == "default"


def test_admitted_bad_policy_keeps_the_allocation() -> None:
    got = parse_admitted({"pod": "p", "uid": "u", "policy": "strict", "cpus": "1",
                          "options": {"bogus": 1}})
    assert got.resolved.policy == "none" and got.allocation.cpus == [1]
    assert any("policy" in p for p in got.resolved.problems)
    assert any("bogus" in p for p in got.resolved.problems)


@pytest.mark.parametrize(("entry", "field"), [
    ({"pod": "p", "containers": [{"name": "a", "cpus": "x-y"}]}, r"containers\[0\]\.cpus"),
    ({"pod": "p", "containers": [{"name": "a", "memory": {"0": "lots"}}]},
     r"containers\[0\]\.memory\.0"),
    ({"pod": "p", "containers": [3]}, r"containers\[0\] must be an object"),
    ({"pod": "p", "numaNodes": "0"}, "numaNodes must be a list"),
    ([], "must be an object"),
])
def test_malformed_admitted_entry_names_the_field(entry: object, field: str) -> None:
    with pytest.raises(WireError, match=field):
        parse_admitted(entry, "status.admitted[0]")
