"""Parsing and validating the numalign.io/gpus annotation."""

from __future__ import annotations

import pytest

import testdata
from numalign.topology.errors import TopologyError
from numalign.topology.gpu import WithResource, parse_gpu_requests
from numalign.topology.machine import Machine, load_machine

MACHINES = testdata.MACHINES


def machine(name: str) -> Machine:
    path = MACHINES / name
    return load_machine(path)


def test_defaults_and_fields() -> None:
    m = machine("dgx-a100-like.yaml")
    reqs = parse_gpu_requests('[{"count": 2, "minMemory": "10Gi", "withResource": '
                              '"nvidia.com/hca"}, {"count": 1, "name": "aux"}]', m)
    assert [r.name for r in reqs] == ["gpu-0", "aux"]
    assert reqs[0].resource == "nvidia.com/gpu"
    assert reqs[0].min_memory == 10 * 2**30
    assert reqs[0].same_group == "any"
    assert reqs[0].with_resource == WithResource("nvidia.com/hca", 1, "pcie")
    # Without a machine the resource is left for allocation time.
    assert parse_gpu_requests('[{"count": 1}]')[0].resource is None


@pytest.mark.parametrize(("text", "message"), [
    ("[{count: 2}]", "numalign.io/gpus: is not valid JSON"),
    ('{"count": 2}', "numalign.io/gpus: must be a JSON list"),
    ("[]", "numalign.io/gpus: must list at least one request"),
    ('[{"count": 0}]', "[0].count: must be an integer >= 1"),
    ('[{"count": "2"}]', "[0].count: must be an integer >= 1"),
    ('[{"count": true}]', "[0].count: must be an integer >= 1"),
    ('[{"minMemory": "1Gi"}]', "[0].count: is required"),
    ('[{"count": 1}, {"count": 2, "sameGroup": "nvlnk"}]',
     "[1].sameGroup: no device has group level 'nvlnk'; levels on this machine: nvswitch, pcie"),
    ('[{"count": 1, "minMemory": "200Gi"}]',
     "[0].minMemory: 200Gi is more than any nvidia.com/gpu device has (80Gi)"),
    ('[{"count": 1, "minMemory": "lots"}]', "[0].minMemory: 'lots' is not a quantity"),
    ('[{"count": 1, "colour": "green"}]', "[0].colour: unknown key; allowed: count,"),
    ('[{"count": 9}]', "[0].count: 9 nvidia.com/gpu devices asked, this machine has 8"),
    ('[{"count": 5}, {"count": 4}]', "[1].count: the requests ask 9 nvidia.com/gpu"),
    ('[{"count": 1, "name": "a"}, {"count": 1, "name": "a"}]', "[1].name: 'a' is used"),
    ('[{"count": 1, "resource": "amd.com/gpu"}]', "[0].resource: no amd.com/gpu device"),
    ('[{"count": 1, "withResource": {"resource": "nvidia.com/hca", "count": 0}}]',
     "[0].withResource.count: must be an integer >= 1"),
    ('[{"count": 1, "withResource": {"resource": "nvidia.com/hca", "sameGroup": "x"}}]',
     "[0].withResource.sameGroup: no nvidia.com/hca device has group level 'x'"),
    ('[{"count": 1, "withResource": {"resource": "nvidia.com/hca", "port": 1}}]',
     "[0].withResource.port: unknown key"),
])
def test_bad_input_names_the_field(text: str, message: str) -> None:
    m = machine("dgx-a100-like.yaml")
    with pytest.raises(TopologyError) as err:
        parse_gpu_requests(text, m)
    assert str(err.value).startswith(message), str(err.value)


def test_group4_unknown_level_lists_levels() -> None:
    m = machine("group4-gpu.yaml")
    with pytest.raises(TopologyError, match=r"levels on this machine: nvlink$"):
        parse_gpu_requests('[{"count": 2, "sameGroup": "pcie"}]', m)
    with pytest.raises(TopologyError, match=r"\(12Gi\)"):
        parse_gpu_requests('[{"count": 2, "minMemory": "13Gi"}]', m)
    with pytest.raises(TopologyError, match=r"^\[0\]\.count: 3 devices with minMemory 10Gi "
                                            r"asked, this machine has 2$"):
        parse_gpu_requests('[{"count": 3, "minMemory": "10Gi"}]', m)
