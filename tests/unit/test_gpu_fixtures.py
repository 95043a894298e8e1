"""GPU group allocation on the fixture machines (tests/fixtures/machines)."""

from __future__ import annotations

import pytest

import testdata
from numalign.topology.gpu import (
    GpuAllocationError,
    allocate,
    hints,
    parse_gpu_requests,
    trees_of,
)
from numalign.topology.hints import TopologyHint, mask_ids, mask_of
from numalign.topology.machine import Machine, load_machine

MACHINES = testdata.MACHINES


def machine(name: str) -> Machine:
    path = MACHINES / name
    return load_machine(path)


class Node:
    """A node's free devices, updated as pods are admitted."""

    def __init__(self, m: Machine) -> None:
        self.m = m
        self.free = {res: set(t.ids(t.all_mask)) for res, t in trees_of(m).items()}

    def admit(self, annotation: str, mask: int | None = None) -> dict[str, list[str]]:
        reqs = parse_gpu_requests(annotation, self.m)
        a = allocate(self.m, self.free, reqs, mask)
        for res, ids in a.devices.items():
            assert set(ids) <= self.free[res]
            self.free[res] -= set(ids)
        return {**a.gpus, **{f"{k}/with": v for k, v in a.attached.items()}}


def test_group4_memory_then_nvlink() -> None:
    m = machine("group4-gpu.yaml")
    node = Node(m)
    big = '[{"count": 2, "minMemory": "10Gi"}]'
    reqs = parse_gpu_requests(big, m)
    assert hints(m, node.free, reqs)[0] == TopologyHint(mask_of([0]), True)
    assert node.admit(big) == {"gpu-0": ["gpu0", "gpu1"]}
    # Asked again: no set fits. Empty hints = cannot satisfy (restricted rejects).
    assert hints(m, node.free, reqs) == []
    with pytest.raises(GpuAllocationError, match="minMemory 10Gi"):
        node.admit(big)
    small = '[{"count": 2, "minMemory": "4Gi", "sameGroup": "nvlink"}]'
    hs = hints(m, node.free, parse_gpu_requests(small, m))
    assert [h for h in hs if h.preferred] == [TopologyHint(mask_of([1]), True)]
    assert node.admit(small, hs[0].mask) == {"gpu-0": ["gpu2", "gpu3"]}


def test_group8_pair_and_quad_keep_pairs_whole() -> None:
    m = machine("group8-gpu.yaml")
    node = Node(m)
    pair = node.admit('[{"count": 2, "sameGroup": "grp0"}]')["gpu-0"]
    four = node.admit('[{"count": 4, "sameGroup": "grp1"}]')["gpu-0"]
    assert pair == ["dev0", "dev1"]
    assert four == ["dev4", "dev5", "dev6", "dev7"]
    # The remaining inner pair is still whole.
    assert node.free["nvidia.com/gpu"] == {"dev2", "dev3"}
    assert node.admit('[{"count": 2, "sameGroup": "grp0"}]')["gpu-0"] == ["dev2", "dev3"]


def test_group8_pack_prefers_broken_groups() -> None:
    m = machine("group8-gpu.yaml")
    node = Node(m)
    assert node.admit('[{"count": 1}]')["gpu-0"] == ["dev0"]
    # The next single GPU completes the broken pair rather than breaking another.
    assert node.admit('[{"count": 1}]')["gpu-0"] == ["dev1"]
    # Four GPUs take a whole outer group, not the leftover pair plus half of the other.
    assert node.admit('[{"count": 4}]')["gpu-0"] == ["dev4", "dev5", "dev6", "dev7"]


def test_group8_one_pod_two_requests() -> None:
    m = machine("group8-gpu.yaml")
    got = Node(m).admit('[{"count": 2, "sameGroup": "grp0", "name": "a"},'
                        ' {"count": 4, "sameGroup": "grp1", "name": "b"}]')
    assert got == {"a": ["dev0", "dev1"], "b": ["dev4", "dev5", "dev6", "dev7"]}


def test_dgx1_quad() -> None:
    m = machine("dgx1-like.yaml")
    node = Node(m)
    assert node.admit('[{"count": 1}]')["gpu-0"] == ["gpu0"]
    quad = node.admit('[{"count": 4, "sameGroup": "quad"}]')["gpu-0"]
    assert quad == ["gpu4", "gpu5", "gpu6", "gpu7"]
    with pytest.raises(GpuAllocationError, match="in one quad group"):
        node.admit('[{"count": 4, "sameGroup": "quad"}]')


def test_dgx_a100_pair_with_nic_single_numa() -> None:
    m = machine("dgx-a100-like.yaml")
    reqs = parse_gpu_requests('[{"count": 2, "withResource": "nvidia.com/hca"}]', m)
    hs = hints(m, None, reqs)
    preferred = [mask_ids(h.mask) for h in hs if h.preferred and h.mask is not None]
    assert preferred == [[1], [3], [5], [7]]
    node = Node(m)
    got = node.admit('[{"count": 2, "withResource": "nvidia.com/hca"}]', mask_of([3]))
    assert got == {"gpu-0": ["gpu0", "gpu1"], "gpu-0/with": ["mlx5_0"]}
    got = node.admit('[{"count": 2, "withResource": {"resource": "nvidia.com/hca", '
                     '"count": 2}}]')
    assert got["gpu-0/with"] in (["mlx5_2", "mlx5_3"], ["mlx5_4", "mlx5_5"],
                                 ["mlx5_6", "mlx5_7"])
    pcie = {d.id: d.group("pcie") for d in m.devices}
    assert {pcie[x] for ids in got.values() for x in ids} == {pcie[got["gpu-0"][0]]}


def test_gb200_34_numa_hints() -> None:
    m = machine("gb200-like-34numa.yaml")
    reqs = parse_gpu_requests('[{"count": 2, "sameGroup": "c2c"}]', m)
    hs = hints(m, None, reqs)
    assert hs[:2] == [TopologyHint(mask_of([0]), True), TopologyHint(mask_of([1]), True)]
    assert all(not h.preferred for h in hs[2:])
    reqs = parse_gpu_requests('[{"count": 3}]', m)
    assert [h for h in hints(m, None, reqs) if h.preferred] == [
        TopologyHint(mask_of([0, 1]), True)]
    a = allocate(m, None, reqs, mask_of([0, 1]))
    assert a.gpus == {"gpu-0": ["gpu0", "gpu1", "gpu2"]}
