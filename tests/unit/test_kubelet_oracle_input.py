"""What the kubelet oracle is given: a machine file as cadvisor's MachineInfo and the
node's allocatable, and how its build is cached (no Go needed here)."""

from __future__ import annotations

from pathlib import Path

import pytest

import testdata
from numalign.devcluster import oracle_build
from numalign.testing.kubelet_oracle import machine_info, node_allocatable
from numalign.topology.machine import load_machine, machine_from_dict


def test_machine_info_of_an_smt_machine() -> None:
    m = load_machine(testdata.MACHINES / "dgx1-like.yaml")
    info = machine_info(m)
    assert info["num_cores"] == 80 and info["num_sockets"] == 2
    assert info["num_physical_cores"] == 40
    n0, n1 = info["topology"]
    assert (n0["node_id"], n1["node_id"]) == (0, 1)
    assert n0["memory"] == 256 << 30 and n0["distances"] == [10, 21]
    # sibling threads share a core: cpu 0 and cpu 40 on socket 0
    assert {"core_id": 0, "thread_ids": [0, 40], "socket_id": 0} in n0["cores"]
    assert all(len(c["thread_ids"]) == 2 for n in (n0, n1) for c in n["cores"])


def test_machine_info_hugepages_and_sparse_ids() -> None:
    doc = {"name": "sparse", "numaNodes": [
        {"id": 0, "cpus": "0-1", "memory": "8Gi", "hugepages": {"2Mi": "1Gi", "1Gi": "2Gi"}},
        {"id": 2, "cpus": "2-3", "memory": "8Gi"}],
        "distances": [[10, 20], [20, 10]]}
    info = machine_info(machine_from_dict(doc))
    n0, n2 = info["topology"]
    # cadvisor's node memory includes the hugepages (the memory manager subtracts them)
    assert n0["memory"] == (8 + 1 + 2) << 30 and n2["memory"] == 8 << 30
    assert sorted((h["page_size"], h["num_pages"]) for h in n0["hugepages"]) == \
        [(2048, 512), (1 << 20, 2)]
    assert n2["node_id"] == 2 and n2["distances"] == [20, 10]  # rows in the file's order


def test_node_allocatable_is_the_emulated_nodes() -> None:
    m = load_machine(testdata.MACHINES / "seed-figure1.yaml")
    alloc = node_allocatable(m)
    assert alloc["cpu"] == "8000m" and alloc["memory"] == str(64 << 30)
    assert alloc["pods"] == "110" and alloc["gpu-vendor.com/gpu"] == "2"


def test_oracle_build_is_cached_with_a_stamp_of_its_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMALIGN_CACHE", str(tmp_path))
    assert not oracle_build.is_built()
    out = oracle_build.oracle_dir()
    out.mkdir(parents=True)
    oracle_build.oracle_path().write_text("binary")
    (out / ".complete").write_text("0123456789abcdef v1.37.2 built in 1s\n")
    assert not oracle_build.is_built()  # a stamp of another source: rebuild
    digest = oracle_build._digest()
    (out / ".complete").write_text(f"{digest} v1.37.2 built in 1s\n")
    assert oracle_build.is_built()
    assert oracle_build.ensure_oracle_built() == oracle_build.oracle_path()  # no build
