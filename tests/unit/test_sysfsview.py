"""The real node's sysfs view: what the kubelet sees of a machine file, read back with
numalign's own discovery (the same reading as cadvisor's)."""

from __future__ import annotations

from pathlib import Path

import pytest

import testdata
from numalign.agent.discovery import discover, to_machine
from numalign.devcluster.sysfsview import SysfsViewError, map_onto, write_sysfs_view
from numalign.topology.machine import Machine, load_machine

MACHINE_FILES = ["realnode-2numa.yaml", "dual-16core.yaml", "fragmented-8numa.yaml",
                 "dgx-a100-like.yaml"]


def _layout(m: Machine) -> dict[str, object]:
    return {
        "nodes": {n.id: (sorted(n.cpus), n.memory, dict(n.hugepages)) for n in m.numa_nodes},
        "cores": sorted({tuple(sorted(c for c, o in m.cpus.items() if o.core == cpu.core))
                         for cpu in m.cpus.values()}),
        "sockets": {c: cpu.socket for c, cpu in m.cpus.items()},
        "distances": ({a: dict(row) for a, row in m.distances.items()}
                      if m.distances is not None else None),
    }


@pytest.mark.parametrize("name", MACHINE_FILES)
def test_discovery_reads_back_the_machine_file(tmp_path: Path, name: str) -> None:
    machine = load_machine(testdata.MACHINES / name)
    real = sorted(machine.cpus)  # a machine with exactly these CPU ids
    mapped = write_sysfs_view(machine, tmp_path, real_cpus=real)
    assert mapped == machine  # nothing to renumber
    dm = discover(tmp_path, gpus=False)
    assert dm.warnings == []
    back = to_machine(dm, machine.name)
    want = _layout(machine)
    if machine.distances is None:
        want["distances"] = {a: {b: 10 if a == b else 20 for b in machine.numa_ids}
                             for a in machine.numa_ids}
    assert _layout(back) == want


def test_cpus_are_renumbered_onto_the_real_ones(tmp_path: Path) -> None:
    machine = load_machine(testdata.MACHINES / "realnode-2numa.yaml")
    mapped = write_sysfs_view(machine, tmp_path, real_cpus=[7, 4, 9])
    assert {n.id: n.cpus for n in mapped.numa_nodes} == {0: (4,), 1: (7,)}
    back = to_machine(discover(tmp_path, gpus=False), "x")
    assert {n.id: list(n.cpus) for n in back.numa_nodes} == {0: [4], 1: [7]}
    node0 = tmp_path / "sys/devices/system/node/node0"
    assert (node0 / "cpulist").read_text() == "4\n"
    assert (node0 / "cpumap").read_text() == "00000010\n"
    assert (node0 / "cpu4" / "topology" / "core_id").read_text() == "4\n"
    assert "Node 0 MemTotal:" in (node0 / "meminfo").read_text()
    assert (node0 / "distance").read_text() == "10 20\n"
    assert (tmp_path / "sys/devices/system/cpu/online").read_text() == "4,7\n"
    assert mapped.devices == machine.devices


def test_hyperthreads_stay_siblings_when_renumbered() -> None:
    machine = load_machine(testdata.MACHINES / "dgx-a100-like.yaml")
    real = [c + 100 for c in sorted(machine.cpus)]
    mapped = map_onto(machine, real)
    for c, cpu in machine.cpus.items():
        for o, other in machine.cpus.items():
            same = mapped.cpus[c + 100].core == mapped.cpus[o + 100].core
            assert same == (cpu.core == other.core)


def test_a_machine_larger_than_this_one_is_refused(tmp_path: Path) -> None:
    machine = load_machine(testdata.MACHINES / "dual-16core.yaml")
    with pytest.raises(SysfsViewError, match=r"32 CPUs but this machine has only 2 usable \(0-1\)"):
        write_sysfs_view(machine, tmp_path, real_cpus=[0, 1])


def test_rewriting_replaces_the_previous_view(tmp_path: Path) -> None:
    write_sysfs_view(load_machine(testdata.MACHINES / "dual-16core.yaml"), tmp_path,
                     real_cpus=range(32))
    write_sysfs_view(load_machine(testdata.MACHINES / "realnode-2numa.yaml"), tmp_path,
                     real_cpus=[0, 1])
    back = to_machine(discover(tmp_path, gpus=False), "x")
    assert sorted(back.cpus) == [0, 1]
