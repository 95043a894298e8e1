"""Topology Manager policy options, parsed as the kubelet's NewPolicyOptions does."""

from __future__ import annotations

import pytest

from numalign.topology.errors import TopologyError
from numalign.topology.merge import merge
from numalign.topology.policies import check_policy
from numalign.topology.policyconfig import (
    DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
    PolicyOptions,
    check_numa_node_count,
    check_scope,
    go_quote,
    parse_policy_options,
)


@pytest.mark.parametrize(
    ("given", "want"),
    [
        ({}, PolicyOptions(False, DEFAULT_MAX_ALLOWABLE_NUMA_NODES)),
        (None, PolicyOptions(False, 64)),
        ({"prefer-closest-numa-nodes": "true", "max-allowable-numa-nodes": "8"},
         PolicyOptions(True, 8)),
        ({"max-allowable-numa-nodes": "12"}, PolicyOptions(False, 12)),
        ({"max-allowable-numa-nodes": "+128"}, PolicyOptions(False, 128)),
        *[({"prefer-closest-numa-nodes": v}, PolicyOptions(True, 64))
          for v in ("1", "t", "T", "TRUE", "true", "True")],
        *[({"prefer-closest-numa-nodes": v}, PolicyOptions(False, 64))
          for v in ("0", "f", "F", "FALSE", "false", "False")],
    ],
)
def test_parse(given: dict[str, str] | None, want: PolicyOptions) -> None:
    assert parse_policy_options(given) == want


@pytest.mark.parametrize(
    ("given", "field", "message"),
    [
        ({"prefer-closest-numa-nodes": "not a boolean"}, "options.prefer-closest-numa-nodes",
         'bad value for option "prefer-closest-numa-nodes": '
         'strconv.ParseBool: parsing "not a boolean": invalid syntax'),
        ({"prefer-closest-numa-nodes": "yes"}, "options.prefer-closest-numa-nodes",
         'strconv.ParseBool: parsing "yes": invalid syntax'),
        ({"max-allowable-numa-nodes": "can't parse to int"}, "options.max-allowable-numa-nodes",
         'unable to convert policy option to integer "max-allowable-numa-nodes": '
         'strconv.Atoi: parsing "can\'t parse to int": invalid syntax'),
        ({"max-allowable-numa-nodes": ""}, "options.max-allowable-numa-nodes",
         'strconv.Atoi: parsing "": invalid syntax'),
        ({"max-allowable-numa-nodes": "1_000"}, "options.max-allowable-numa-nodes",
         "invalid syntax"),
        ({"max-allowable-numa-nodes": "99999999999999999999"}, "options.max-allowable-numa-nodes",
         'strconv.Atoi: parsing "99999999999999999999": value out of range'),
        ({"max-allowable-numa-nodes": "7"}, "options.max-allowable-numa-nodes",
         'the minimum value of "max-allowable-numa-nodes" should not be less than 8'),
        ({"max-allowable-numa-nodes": "-8"}, "options.max-allowable-numa-nodes",
         "should not be less than 8"),
        ({"this-option-does-not-exist": "true"}, "options",
         'unknown Topology Manager Policy option: "this-option-does-not-exist"'),
    ],
)
def test_errors(given: dict[str, str], field: str, message: str) -> None:
    with pytest.raises(TopologyError) as e:
        parse_policy_options(given)
    assert e.value.field == field
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_policy_and_scope_names() -> None:
    for p in ("none", "best-effort", "restricted", "single-numa-node"):
        assert check_policy(p) == p
    for s in ("container", "pod"):
        assert check_scope(s) == s
    with pytest.raises(TopologyError, match='unknown policy: "strict"'):
        check_policy("strict")
    with pytest.raises(TopologyError, match='unknown scope: "node"'):
        check_scope("node")


def test_numa_node_limit() -> None:
    check_numa_node_count(list(range(64)), PolicyOptions())
    with pytest.raises(TopologyError, match="unsupported on machines with more than 8 NUMA Nodes"):
        check_numa_node_count(list(range(9)), PolicyOptions(False, 8))
    # none builds on any machine: it merges nothing
    assert merge("none", [{}], list(range(100)), None, PolicyOptions(False, 8)).admit
    with pytest.raises(TopologyError, match="more than 8 NUMA Nodes"):
        merge("restricted", [{}], list(range(9)), None, PolicyOptions(False, 8))


def test_go_quote() -> None:
    assert go_quote('a"b\\c\n') == '"a\\"b\\\\c\\n"'
    assert go_quote("\x01") == '"\\x01"'
