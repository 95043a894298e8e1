"""The emulated DRA driver's ResourceSlices and DeviceClasses built from machine files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import testdata
from numalign.api import dra, draemulated
from numalign.commands import agent as agent_command
from numalign.devcluster import command as dev
from numalign.topology.machine import Device, Machine, NumaNode, load_machine

LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
D = draemulated.DRIVER


def _machine(devices: list[Device]) -> Machine:
    return Machine(name="m", numa_nodes=(NumaNode(id=0, cpus=(0, 1), memory=1 << 30),
                                         NumaNode(id=1, cpus=(2, 3), memory=1 << 30)),
                   cpus={}, devices=tuple(devices))


def test_dgx_devices_carry_numa_kind_memory_and_groups() -> None:
    machine = load_machine(testdata.MACHINES / "dgx-a100-like.yaml")
    slices = draemulated.resource_slices(machine, "node-a")
    assert len(slices) == 1
    spec = slices[0]["spec"]
    assert spec["driver"] == D and spec["nodeName"] == "node-a"
    assert spec["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 1}
    devs = {d["name"]: d for d in spec["devices"]}
    assert len(devs) == len(machine.devices)
    gpu0 = devs["gpu0"]
    assert gpu0["attributes"] == {
        "resource.kubernetes.io/numaNode": {"int": 3},
        f"{D}/resource": {"string": "nvidia.com/gpu"},
        f"{D}/nvswitch": {"string": "nvswitch0"},
        f"{D}/pcie": {"string": "pcie0"},
    }
    assert gpu0["capacity"] == {f"{D}/memory": {"value": "80Gi"}}
    assert devs["gpu4"]["attributes"]["resource.kubernetes.io/numaNode"] == {"int": 7}


def test_item_one_reader_maps_every_emulated_device_to_its_numa_node() -> None:
    machine = load_machine(testdata.MACHINES / "dgx1-like.yaml")
    slices = draemulated.resource_slices(machine, "n1")
    found = dra.node_devices(slices, "n1", None, set(machine.numa_ids))
    assert found.total == len(machine.devices)
    got = {d.device: d.numa_nodes for d in found.devices}
    assert all(d.source == "numaNode" and d.problem is None for d in found.devices)
    assert got == {d.id: (d.numa_node,) for d in machine.devices}


def test_device_without_memory_has_no_capacity_and_unknown_numa_no_attribute() -> None:
    slices = draemulated.resource_slices(
        _machine([Device(resource="example.com/nic", id="nic0", numa_node=None)]), "n")
    dev = slices[0]["spec"]["devices"][0]
    assert "capacity" not in dev
    assert set(dev["attributes"]) == {f"{D}/resource"}


def test_odd_ids_give_unique_dns_labels_within_bounds() -> None:
    devices = [Device(resource="a.com/gpu", id="GPU_0", numa_node=0),
               Device(resource="b.com/gpu", id="gpu-0", numa_node=0),
               Device(resource="b.com/gpu", id="gpu.0", numa_node=1),
               Device(resource="c.com/x", id="___", numa_node=1),
               Device(resource="c.com/x", id="x" * 200, numa_node=1)]
    names = [d["name"] for d in
             draemulated.resource_slices(_machine(devices), "n")[0]["spec"]["devices"]]
    assert len(set(names)) == len(names) == 5
    assert all(LABEL.match(n) and len(n) <= 63 for n in names)
    assert names[0] == "gpu-0"


def test_group_levels_become_valid_attribute_names_and_values_are_bounded() -> None:
    dev = Device(resource="x.com/gpu", id="g", numa_node=0, memory=3 * (1 << 20) + 1,
                 groups=(("nvlink island", "i" * 100), ("9pcie", "p"), ("memory", "m"),
                         ("l" * 50, "v")))
    out = draemulated.device_json(dev, "g")
    names = [k.split("/", 1)[1] for k in out["attributes"]]
    assert all(IDENT.match(n) and len(n) <= 32 for n in names)
    assert len(set(names)) == len(names)
    assert f"{D}/nvlink_island" in out["attributes"]
    assert all(len(v.get("string", "")) <= 64 for v in out["attributes"].values())
    assert out["capacity"][f"{D}/memory"] == {"value": str(3 * (1 << 20) + 1)}


def test_attributes_and_capacity_stay_within_32() -> None:
    groups = tuple((f"lvl{i}", f"g{i}") for i in range(40))
    out = draemulated.device_json(Device(resource="x.com/gpu", id="g", numa_node=0,
                                         memory=1 << 30, groups=groups), "g")
    assert len(out["attributes"]) + len(out["capacity"]) == 32
    assert f"{D}/lvl0" in out["attributes"]


def test_machine_without_devices_publishes_nothing() -> None:
    assert draemulated.resource_slices(_machine([]), "n") == []
    machine = load_machine(testdata.MACHINES / "dual-16core.yaml")
    assert draemulated.resource_slices(machine, "n") == []


def test_many_devices_split_into_slices_of_one_pool() -> None:
    devices = [Device(resource="x.com/gpu", id=f"g{i}", numa_node=i % 2) for i in range(300)]
    slices = draemulated.resource_slices(_machine(devices), "big", generation=4)
    assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    assert {s["spec"]["pool"]["generation"] for s in slices} == {4}
    assert len({s["metadata"]["name"] for s in slices}) == 3
    assert all(SUBDOMAIN.match(s["metadata"]["name"]) for s in slices)
    long = draemulated.slice_name("n" * 253, 0)
    assert len(long) <= 253 and SUBDOMAIN.match(long)


def test_one_device_class_per_kind_selects_the_driver_and_kind() -> None:
    machine = load_machine(testdata.MACHINES / "dgx1-like.yaml")
    classes = draemulated.device_classes(d.resource for d in machine.devices)
    names = [c["metadata"]["name"] for c in classes]
    assert names == ["ib.mellanox.com.emulated.numalign.io",
                     "gpu.nvidia.com.emulated.numalign.io"]
    cel = classes[1]["spec"]["selectors"][0]["cel"]["expression"]
    assert cel == (f'device.driver == "{D}" && '
                   f'device.attributes["{D}"].resource == "nvidia.com/gpu"')


def test_dev_up_dra_is_not_for_the_demo(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    # (with --real-node it is: the real node's devices come through its DRA kubelet
    # plugin, tests/e2e/test_realnode_dra_e2e.py)
    state = ["--state-dir", str(tmp_path / "s")]
    assert dev.main(["up", *state, "--dra", "--demo"]) == 2
    assert "--dra runs the emulated nodes (--machine)" in capsys.readouterr().err
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").iterdir())


def test_agent_dra_is_a_mode_of_emulate(capsys: pytest.CaptureFixture[str]) -> None:
    assert agent_command.main(["--node", "n", "--dra"]) == 2
    assert "--dra is a mode of --emulate" in capsys.readouterr().err
