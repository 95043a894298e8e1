"""Node discovery: the sysfs dumps in tests/fixtures/sysfs, synthetic trees for the cases a
user relies on, the nvidia-smi parsers and the conversion to the engine's machine model."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

import testdata
from numalign.agent.discovery import (
    DiscoveryError,
    NvidiaSmiError,
    discover,
    gpu_groups,
    machine_dict,
    nvlink_islands,
    parse_gpu_query,
    parse_topo_matrix,
    to_machine,
)
from numalign.commands import discover as discover_cmd
from numalign.topology.machine import load_machine, machine_from_dict

SYSFS = testdata.SYSFS
SMI = Path(__file__).resolve().parents[1] / "fixtures" / "nvidia-smi"
DUMPS = sorted(SYSFS.glob("*.tar.bz2")) if SYSFS.is_dir() else []


def _unpack(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tf:
        tf.extractall(dest, filter="data")
    return dest / archive.name.removesuffix(".tar.bz2")


# --------------------------------------------------------------------------- real machines


@pytest.mark.parametrize("archive", DUMPS, ids=lambda p: p.name.removesuffix(".tar.bz2"))
def test_sysfs_dump_matches_expected(archive: Path, tmp_path: Path) -> None:
    root = _unpack(archive, tmp_path)
    expected = json.loads(archive.with_name(
        archive.name.removesuffix(".tar.bz2") + ".expected.json").read_text())
    dm = discover(root, gpus=False)
    got = json.loads(json.dumps(dm.to_json()))
    for key, want in expected.items():
        assert got[key] == want, key
    # the same machine converts to a valid machine model
    m = to_machine(dm, "dump")
    assert m.numa_ids == [int(k) for k in expected["numaNodes"]]
    for nid, node in expected["numaNodes"].items():
        assert list(m.node(int(nid)).cpus) == node["cpus"]
        assert m.node(int(nid)).memory == node["memoryBytes"]


def test_command_prints_the_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    archive = next((a for a in DUMPS if a.name.startswith("offline-cpu0-node0")), DUMPS[0])
    root = _unpack(archive, tmp_path)
    assert discover_cmd.main(["--root", str(root)]) == 0
    got = json.loads(capsys.readouterr().out)
    expected = json.loads(archive.with_name(
        archive.name.removesuffix(".tar.bz2") + ".expected.json").read_text())
    assert {k: got[k] for k in expected} == expected
    assert {"cpuTopology", "pciDevices", "hugepages", "gpus"} <= set(got)


# --------------------------------------------------------------------------- synthetic trees


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _cpulist(ids: Iterable[int]) -> str:
    return ",".join(str(i) for i in sorted(ids))


def make_sysfs(root: Path, nodes: Mapping[int, Iterable[int]], *,
               mem_kb: int = 1024 * 1024, distances: bool = True,
               cpus: Iterable[int] | None = None, cpu_online: str | None = "all",
               node_online: str | None = None, threads: int = 1,
               pci: Mapping[str, int] | None = None) -> Path:
    """A sysfs tree: NUMA nodes with their CPUs, 10/20 distances over the node ids,
    CPU dirs with topology (``threads`` consecutive CPUs per core, one socket per node)."""
    node_dir = root / "sys/devices/system/node"
    cpu_dir = root / "sys/devices/system/cpu"
    node_dir.mkdir(parents=True, exist_ok=True)
    cpu_dir.mkdir(parents=True, exist_ok=True)
    ids = sorted(nodes)
    all_cpus = sorted(cpus) if cpus is not None else sorted(c for v in nodes.values() for c in v)
    _write(node_dir / "online", node_online if node_online is not None else _cpulist(ids))
    _write(node_dir / "possible", node_online if node_online is not None else _cpulist(ids))
    for nid, ncpus in nodes.items():
        d = node_dir / f"node{nid}"
        _write(d / "cpulist", _cpulist(ncpus))
        _write(d / "meminfo", f"Node {nid} MemTotal:       {mem_kb} kB\n"
                              f"Node {nid} MemFree:        {mem_kb // 2} kB\n")
        if distances:
            _write(d / "distance", " ".join("10" if j == nid else "20" for j in ids) + "\n")
        _write(d / "hugepages/hugepages-2048kB/nr_hugepages", "4\n")
    numa_of = {c: nid for nid, v in nodes.items() for c in v}
    for c in all_cpus:
        t = cpu_dir / f"cpu{c}" / "topology"
        _write(t / "physical_package_id", f"{numa_of.get(c, 0)}\n")
        _write(t / "core_id", f"{c // threads}\n")
    if cpu_online == "all":
        _write(cpu_dir / "online", _cpulist(all_cpus))
    elif cpu_online is not None:
        _write(cpu_dir / "online", cpu_online)
    for addr, numa in (pci or {}).items():
        dev = root / "sys/devices/pci0000:00" / addr
        _write(dev / "numa_node", f"{numa}\n")
        _write(dev / "class", "0x030200\n")
        _write(dev / "vendor", "0x10de\n")
        _write(dev / "device", "0x20b2\n")
        link = root / "sys/bus/pci/devices" / addr
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path("../../../devices/pci0000:00") / addr)
    return root


def _json(dm: Any) -> dict[str, Any]:
    return dict(json.loads(json.dumps(dm.to_json())))


def test_sparse_numa_ids(tmp_path: Path) -> None:
    ids = [0, 8, 250, 251, 252, 253, 254, 255]
    root = make_sysfs(tmp_path, {nid: [2 * i, 2 * i + 1] for i, nid in enumerate(ids)})
    dm = discover(root, gpus=False)
    doc = _json(dm)
    assert list(doc["numaNodes"]) == [str(i) for i in ids]
    assert doc["numaNodes"]["250"]["cpus"] == [4, 5]
    assert doc["distances"]["8"] == {str(j): (10 if j == 8 else 20) for j in ids}
    m = to_machine(dm, "sparse")
    assert m.numa_ids == ids and m.distances is not None and m.distances[255][0] == 20
    assert m.cpus[5].numa == 250


def test_cpuless_memory_only_nodes(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: range(0, 4), 1: range(4, 8), 2: [], 3: []})
    _write(root / "sys/devices/system/node/node2/cpumap", "00000000\n")
    dm = discover(root, gpus=False)
    doc = _json(dm)
    assert doc["numaNodes"]["2"] == {"cpus": [], "memoryBytes": 1024 ** 3}
    assert doc["numaNodes"]["3"]["cpus"] == []
    m = to_machine(dm, "cxl")
    assert m.node(3).cpus == () and m.node(3).memory == 1024 ** 3
    assert sorted(m.cpus) == list(range(8))
    assert machine_dict(dm, "cxl")["numaNodes"][2]["cpus"] == ""


@pytest.mark.parametrize("count", [17, 64])
def test_many_numa_nodes(tmp_path: Path, count: int) -> None:
    root = make_sysfs(tmp_path, {n: [n] for n in range(count)})
    dm = discover(root, gpus=False)
    doc = _json(dm)
    assert len(doc["numaNodes"]) == count
    assert all(len(row) == count for row in doc["distances"].values())
    m = to_machine(dm, f"n{count}")
    assert len(m.numa_nodes) == count and m.distances is not None
    assert m.distances[count - 1][count - 1] == 10


def test_offline_cpus_are_left_out(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: range(0, 4), 1: range(4, 8)}, cpu_online="0-2,5-7")
    doc = _json(discover(root, gpus=False))
    assert doc["numaNodes"]["0"]["cpus"] == [0, 1, 2]
    assert doc["numaNodes"]["1"]["cpus"] == [5, 6, 7]
    assert "3" not in doc["cpuTopology"] and "4" not in doc["cpuTopology"]


def test_per_cpu_online_files_without_global_online(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: range(0, 4)}, cpu_online=None)
    _write(root / "sys/devices/system/cpu/cpu2/online", "0\n")
    _write(root / "sys/devices/system/cpu/cpu3/online", "1\n")
    assert _json(discover(root, gpus=False))["numaNodes"]["0"]["cpus"] == [0, 1, 3]


def test_cpus_without_a_cpu_directory_are_left_out(tmp_path: Path) -> None:
    # the node claims 0-7, but only cpu0-cpu3 exist (the rest were never present)
    root = make_sysfs(tmp_path, {0: range(0, 8)}, cpus=range(0, 4), cpu_online=None)
    assert _json(discover(root, gpus=False))["numaNodes"]["0"]["cpus"] == [0, 1, 2, 3]


def test_cpumap_only_and_cpu_entries_only(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: range(0, 4), 1: range(4, 8)})
    n0, n1 = (root / "sys/devices/system/node/node0", root / "sys/devices/system/node/node1")
    (n0 / "cpulist").unlink()
    _write(n0 / "cpumap", "00000000,0000000f\n")
    (n1 / "cpulist").unlink()
    for c in range(4, 8):  # no cpulist, no cpumap: the cpuN links
        (n1 / f"cpu{c}").symlink_to(Path("../../cpu") / f"cpu{c}")
    doc = _json(discover(root, gpus=False))
    assert doc["numaNodes"]["0"]["cpus"] == [0, 1, 2, 3]
    assert doc["numaNodes"]["1"]["cpus"] == [4, 5, 6, 7]


def test_malformed_cpulist_falls_back_to_cpumap(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: range(0, 4)})
    n0 = root / "sys/devices/system/node/node0"
    _write(n0 / "cpulist", "0-x\n")
    _write(n0 / "cpumap", "f\n")
    dm = discover(root, gpus=False)
    assert _json(dm)["numaNodes"]["0"]["cpus"] == [0, 1, 2, 3]
    assert any("node0/cpulist" in w for w in dm.warnings)


def test_malformed_distance_file(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: [0], 1: [1], 2: [2]})
    _write(root / "sys/devices/system/node/node1/distance", "20 ten 20\n")
    _write(root / "sys/devices/system/node/node2/distance", "20 20\n")  # wrong length
    dm = discover(root, gpus=False)
    doc = _json(dm)
    # the node is still there, with its CPUs and memory; only its distances are unknown
    assert list(doc["numaNodes"]) == ["0", "1", "2"]
    assert list(doc["distances"]) == ["0"]
    assert any("node1/distance" in w and "integers" in w for w in dm.warnings)
    assert any("node2/distance" in w and "2 columns" in w for w in dm.warnings)
    m = to_machine(dm, "nodist")  # an incomplete matrix is no matrix
    assert m.distances is None


def test_missing_meminfo(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: [0, 1], 1: [2, 3]})
    (root / "sys/devices/system/node/node1/meminfo").unlink()
    dm = discover(root, gpus=False)
    doc = _json(dm)
    assert doc["numaNodes"]["1"] == {"cpus": [2, 3], "memoryBytes": 0}
    assert doc["numaNodes"]["0"]["memoryBytes"] == 1024 ** 3
    assert any("node1/meminfo" in w and "missing" in w for w in dm.warnings)


def test_garbage_meminfo_and_hugepages(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: [0]})
    n0 = root / "sys/devices/system/node/node0"
    _write(n0 / "meminfo", "\x00\x01garbage\n")
    _write(n0 / "hugepages/hugepages-1048576kB/nr_hugepages", "lots\n")
    dm = discover(root, gpus=False)
    doc = _json(dm)
    assert doc["numaNodes"]["0"]["memoryBytes"] == 0
    assert doc["hugepages"]["0"] == {"2Mi": {"pages": 4, "bytes": 4 * 2 ** 21}}
    assert any("MemTotal" in w for w in dm.warnings)
    assert any("nr_hugepages" in w for w in dm.warnings)


def test_hugepages_per_node(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: [0], 1: [1]})
    _write(root / "sys/devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages",
           "2\n")
    dm = discover(root, gpus=False)
    assert _json(dm)["hugepages"]["1"]["1Gi"] == {"pages": 2, "bytes": 2 * 2 ** 30}
    m = to_machine(dm, "hp")
    assert m.node(1).hugepages == {"2Mi": 4 * 2 ** 21, "1Gi": 2 * 2 ** 30}


def test_distance_columns_are_possible_nodes_when_the_row_says_so(tmp_path: Path) -> None:
    # node 0 is offline (no directory); node 1's row still has a column for it
    root = make_sysfs(tmp_path, {1: [1]}, cpus=[0, 1], node_online="1")
    _write(root / "sys/devices/system/node/possible", "0-1\n")
    _write(root / "sys/devices/system/node/node1/distance", "21 10\n")
    doc = _json(discover(root, gpus=False))
    assert doc["distances"] == {"1": {"0": 21, "1": 10}}
    assert list(doc["numaNodes"]) == ["1"]


def test_no_numa_directories_is_one_node(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: range(4)})
    for d in (root / "sys/devices/system/node").iterdir():
        if d.is_dir():
            for f in sorted(d.rglob("*"), reverse=True):
                f.rmdir() if f.is_dir() else f.unlink()
            d.rmdir()
    _write(root / "proc/meminfo", "MemTotal:        8000000 kB\nMemFree: 1 kB\n")
    dm = discover(root, gpus=False)
    doc = _json(dm)
    assert doc["numaNodes"] == {"0": {"cpus": [0, 1, 2, 3], "memoryBytes": 8000000 * 1024}}
    assert doc["distances"] == {"0": {"0": 10}}
    assert not dm.numa_in_sysfs and dm.warnings


def test_cpu_topology_cores_and_sockets(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: range(0, 4), 1: range(4, 8)}, threads=2)
    dm = discover(root, gpus=False)
    assert dm.cpus[1].core == 0 and dm.cpus[1].threads == [0, 1]
    assert dm.cpus[5].socket == 1
    m = to_machine(dm, "smt")
    assert m.cpus[3].core == m.cpus[2].core != m.cpus[1].core
    assert m.cpus[6].socket == 1


def test_absolute_links_stay_inside_the_root(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path / "r", {0: [0]})
    dev = root / "sys/devices/pci0000:00/0000:00:01.0"
    _write(dev / "numa_node", "0\n")
    link = root / "sys/bus/pci/devices/0000:00:01.0"
    link.parent.mkdir(parents=True)
    link.symlink_to("/sys/devices/pci0000:00/0000:00:01.0")  # absolute: means the root's /
    doc = _json(discover(root, gpus=False))
    assert doc["pci"] == {"0000:00:01.0": 0}


def test_pci_numa_minus_one_is_no_affinity(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: [0]}, pci={"0000:3b:00.0": -1, "0000:5e:00.0": 0})
    doc = _json(discover(root, gpus=False))
    assert doc["pci"] == {"0000:3b:00.0": None, "0000:5e:00.0": 0}
    assert doc["pciDevices"]["0000:3b:00.0"]["vendor"] == "0x10de"


def test_bad_roots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(DiscoveryError, match="does not exist"):
        discover(tmp_path / "nope")
    with pytest.raises(DiscoveryError, match="sysfs"):
        discover(tmp_path)
    for bad in (tmp_path / "nope", tmp_path):
        assert discover_cmd.main(["--root", str(bad)]) == 1
        err = capsys.readouterr().err
        assert str(bad) in err and "Traceback" not in err and err.count("\n") == 1


# --------------------------------------------------------------------------- nvidia-smi


def _smi(name: str, kind: str) -> str:
    return (SMI / f"{name}.{kind}").read_text()


def test_dgx1_hybrid_cube_mesh() -> None:
    topo = parse_topo_matrix(_smi("dgx1-v100", "topo-m.txt"))
    assert topo.gpu_indices() == list(range(8))
    assert topo.cells["GPU0"]["GPU3"] == "NV2" and topo.cells["GPU0"]["GPU5"] == "SYS"
    assert topo.cpu_affinity["GPU4"] == "20-39,60-79"
    # the whole mesh is connected, but the islands are the two fully linked quads
    assert nvlink_islands(topo) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    groups = gpu_groups(topo)
    assert groups[0] == {"nvlink": "nvlink0", "pcie": "pcie0"}
    assert groups[1]["pcie"] == "pcie0" and groups[2]["pcie"] == "pcie1"
    assert groups[7] == {"nvlink": "nvlink1", "pcie": "pcie3"}
    gpus = parse_gpu_query(_smi("dgx1-v100", "query-gpu.csv"))
    assert [g.pci_bus_id for g in gpus][:3] == ["0000:06:00.0", "0000:07:00.0", "0000:0a:00.0"]
    assert gpus[0].memory_bytes == 16160 * 2 ** 20 and gpus[0].name == "Tesla V100-SXM2-16GB"


def test_dgx_a100_all_to_all() -> None:
    topo = parse_topo_matrix(_smi("dgx-a100", "topo-m.txt"))
    assert nvlink_islands(topo) == [list(range(8))]
    assert topo.numa_affinity == {"GPU0": 3, "GPU1": 3, "GPU2": 1, "GPU3": 1,
                                  "GPU4": 7, "GPU5": 7, "GPU6": 5, "GPU7": 5}
    assert topo.nic_names["NIC9"] == "mlx5_9"
    groups = gpu_groups(topo)
    assert {groups[g]["pcie"] for g in range(8)} == {"pcie0", "pcie1", "pcie2", "pcie3"}
    assert groups[4]["pcie"] == groups[5]["pcie"] != groups[6]["pcie"]
    gpus = parse_gpu_query(_smi("dgx-a100", "query-gpu.csv"))
    assert len(gpus) == 8 and gpus[7].memory_bytes == 80 * 2 ** 30


def test_pcie_only_box() -> None:
    topo = parse_topo_matrix(_smi("pcie-4xt4", "topo-m.txt"))
    assert nvlink_islands(topo) == []
    assert gpu_groups(topo) == {0: {"pcie": "pcie0"}, 1: {"pcie": "pcie0"},
                                2: {"pcie": "pcie1"}, 3: {"pcie": "pcie2"}}


@pytest.mark.parametrize("variant", ["spaces", "crlf", "no-ansi", "colour"])
def test_topo_format_variants(variant: str) -> None:
    text = _smi("dgx1-v100", "topo-m.txt")
    if variant == "spaces":
        text = text.expandtabs(8)
    elif variant == "crlf":
        text = text.replace("\n", "\r\n")
    elif variant == "no-ansi":
        text = text.replace("\x1b[4m", "").replace("\x1b[0m", "")
    else:
        text = text.replace("NV1", "\x1b[32mNV1\x1b[0m")
    assert nvlink_islands(parse_topo_matrix(text)) == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("text, problem", [
    ("", "no header"),
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
     "no header"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tNV1\t0-3\n", "no rows for GPU1"),
    ("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \n", "has 1 cells"),
    ("\tGPU0\tGPU1\nGPU0\t X \tWAT\nGPU1\tWAT\t X \n", "unknown link 'WAT'"),
    ("\tGPU0\tGPU0\n", "repeats"),
])
def test_topo_garbage(text: str, problem: str) -> None:
    with pytest.raises(NvidiaSmiError, match=problem):
        parse_topo_matrix(text)


@pytest.mark.parametrize("text, problem", [
    ("0, GPU-x, 00000000:07:00.0\n", "5 comma-separated"),
    ("x, GPU-x, 00000000:07:00.0, 100, T4\n", "index"),
    ("0, GPU-x, 07.0, 100, T4\n", "PCI bus id"),
    ("0, GPU-x, 00000000:07:00.0, lots, T4\n", "memory.total"),
    ("0, a, 0000:07:00.0, 1, T4\n0, b, 0000:08:00.0, 1, T4\n", "twice"),
])
def test_gpu_query_garbage(text: str, problem: str) -> None:
    with pytest.raises(NvidiaSmiError, match=problem):
        parse_gpu_query(text)


def test_gpu_query_not_supported_memory() -> None:
    g = parse_gpu_query("0, GPU-a, 00000000:01:00.0, [N/A], NVIDIA GH200, 480GB\n")
    assert g[0].memory_bytes is None and g[0].name == "NVIDIA GH200, 480GB"


def _fake_smi(tmp_path: Path, name: str, *, fail: bool = False) -> Path:
    script = tmp_path / "nvidia-smi"
    body = "echo 'NVIDIA-SMI has failed' >&2; exit 9" if fail else (
        'case "$1" in\n'
        f"  topo) cat '{SMI / (name + '.topo-m.txt')}' ;;\n"
        f"  --query-gpu=*) cat '{SMI / (name + '.query-gpu.csv')}' ;;\n"
        "  *) exit 3 ;;\n"
        "esac")
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


DGX1_BUS = {"0000:06:00.0": 0, "0000:07:00.0": 0, "0000:0a:00.0": 0, "0000:0b:00.0": 0,
            "0000:85:00.0": 1, "0000:86:00.0": 1, "0000:89:00.0": 1, "0000:8a:00.0": 1}


@pytest.mark.skipif(os.name != "posix", reason="the fake nvidia-smi is a shell script")
def test_gpus_from_nvidia_smi_become_devices(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    root = make_sysfs(tmp_path / "root", {0: range(0, 40), 1: range(40, 80)}, threads=2,
                      pci=DGX1_BUS)
    smi = _fake_smi(tmp_path, "dgx1-v100")
    dm = discover(root, nvidia_smi=str(smi))
    assert [g.numa_node for g in dm.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert dm.gpus[0].nvlinks == {1: 1, 2: 1, 3: 2, 4: 2}
    m = to_machine(dm, "dgx1")
    gpus = m.devices_of("nvidia.com/gpu")
    assert len(gpus) == 8 and gpus[0].id.startswith("GPU-")
    assert gpus[0].memory == 16160 * 2 ** 20 and gpus[4].numa_node == 1
    assert gpus[0].groups == (("nvlink", "nvlink0"), ("pcie", "pcie0"))

    # the machine file round-trips through load_machine
    assert discover_cmd.main(["--root", str(root), "--nvidia-smi", str(smi),
                              "--machine-yaml", "--name", "dgx1"]) == 0
    path = tmp_path / "dgx1.yaml"
    path.write_text(capsys.readouterr().out)
    loaded = load_machine(path)
    assert loaded.numa_ids == m.numa_ids and loaded.devices == m.devices
    assert {c: (x.core, x.socket, x.numa) for c, x in loaded.cpus.items()} == \
        {c: (x.core, x.socket, x.numa) for c, x in m.cpus.items()}

    # JSON lists the GPUs under an extra key
    assert discover_cmd.main(["--root", str(root), "--nvidia-smi", str(smi)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpus"][5]["groups"] == {"nvlink": "nvlink1", "pcie": "pcie2"}


@pytest.mark.skipif(os.name != "posix", reason="the fake nvidia-smi is a shell script")
def test_gpu_numa_from_topo_when_sysfs_lacks_the_device(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path / "root", {n: [n] for n in range(8)})
    dm = discover(root, nvidia_smi=str(_fake_smi(tmp_path, "dgx-a100")))
    assert [g.numa_node for g in dm.gpus] == [3, 3, 1, 1, 7, 7, 5, 5]


@pytest.mark.skipif(os.name != "posix", reason="the fake nvidia-smi is a shell script")
def test_failing_nvidia_smi(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = make_sysfs(tmp_path / "root", {0: [0]})
    smi = _fake_smi(tmp_path, "", fail=True)
    with pytest.raises(NvidiaSmiError, match="status 9: NVIDIA-SMI has failed"):
        discover(root, nvidia_smi=str(smi))
    assert discover_cmd.main(["--root", str(root), "--nvidia-smi", str(smi)]) == 1
    assert "NVIDIA-SMI has failed" in capsys.readouterr().err
    assert discover_cmd.main(["--root", str(root), "--nvidia-smi",
                              str(tmp_path / "missing")]) == 1
    assert "not found" in capsys.readouterr().err
    assert discover_cmd.main(["--root", str(root), "--no-gpus"]) == 0


def test_dumps_do_not_run_the_live_nvidia_smi(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    smi = _fake_smi(tmp_path, "dgx1-v100")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    root = make_sysfs(tmp_path / "root", {0: [0]})
    assert smi.exists() and discover(root).gpus == []


# --------------------------------------------------------------------------- machine model


def test_pci_resources_become_devices(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: [0], 1: [1]},
                      pci={"0000:3b:00.0": 1, "0000:5e:00.0": -1})
    dm = discover(root, gpus=False)
    m = to_machine(dm, "nics", pci_resources={"10de:20b2": "example.com/accel"})
    devs = m.devices_of("example.com/accel")
    assert [(d.id, d.numa_node) for d in devs] == [("0000:3b:00.0", 1), ("0000:5e:00.0", None)]
    assert to_machine(dm, "plain").devices == ()


def test_machine_dict_validates_like_a_machine_file(tmp_path: Path) -> None:
    root = make_sysfs(tmp_path, {0: range(0, 4), 5: range(4, 8), 9: []}, threads=2)
    dm = discover(root, gpus=False)
    doc = machine_dict(dm, "m")
    m = machine_from_dict(doc)
    assert m.numa_ids == [0, 5, 9]
    assert doc["cpuTopology"]["siblings"][0] == "0-1"


def test_hostile_sysfs_files_are_skipped_quickly(tmp_path: Path) -> None:
    """A FIFO meminfo (would block for ever), a 2 MB cpumap (quadratic), a cpulist of a
    billion CPUs (gigabytes) and an oversized distance file: discovery finishes at once,
    with a warning naming each file."""
    root = make_sysfs(tmp_path, {0: range(0, 4), 1: range(4, 8), 2: range(8, 12),
                                 3: range(12, 16)})
    nodes = root / "sys/devices/system/node"
    (nodes / "node0/meminfo").unlink()
    os.mkfifo(nodes / "node0/meminfo")
    (nodes / "node1/cpulist").unlink()
    _write(nodes / "node1/cpumap", "f" * (2 << 20) + "\n")
    _write(nodes / "node2/cpulist", "0-999999999\n")
    _write(nodes / "node2/cpumap", "f00\n")
    _write(nodes / "node2/distance", "20 " * 40000 + "\n")
    (nodes / "node3/cpulist").unlink()
    _write(nodes / "node3/cpumap", "f" * 4096 + "\n")  # 16384 CPUs: within the size cap
    code = ("import sys, json\nfrom numalign.agent.discovery import discover\n"
            "dm = discover(sys.argv[1], gpus=False)\n"
            "print(json.dumps({'nodes': {n.id: n.cpus for n in dm.nodes},"
            " 'warnings': dm.warnings}))\n")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < 30
    out = json.loads(proc.stdout)
    warnings = "\n".join(out["warnings"])
    assert "node0/meminfo: is not a regular file" in warnings
    assert "node1/cpumap: is larger than 65536 bytes" in warnings
    assert "node3/cpumap: not a CPU mask" in warnings
    assert "node2/cpulist: not a cpulist" in warnings
    assert "node2/distance: is larger than" in warnings
    assert out["nodes"]["2"] == [8, 9, 10, 11]  # from the cpumap after the bad cpulist


def test_a_cpumap_at_the_kernel_limit_parses_in_linear_time() -> None:
    from numalign.agent.discovery.sysfs import _parse_cpumask

    text = ",".join(["ffffffff"] * 256)  # 8192 CPUs
    start = time.process_time()
    assert _parse_cpumask(text) == list(range(8192))
    assert time.process_time() - start < 1.0
