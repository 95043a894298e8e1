"""DRA devices mapped to NUMA nodes (numalign.api.dra, agent/dra.py): each rule in order,
the node's sysfs for pcieRoot / pciBusID (a real machine's dump), and bad input that gets a
clear message and spoils nothing else."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import pytest

import testdata
from numalign.agent.dra import DraDevices, pci_topology
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api.dra import (
    MAX_DRA_DEVICES,
    NodeDraDevices,
    PciTopology,
    node_devices,
    slice_devices,
)
from numalign.api.nodetopology import NodeTopologyStatus
from numalign.topology.machine import machine_from_dict

NODE = "node-a"
MACHINE = {0, 1}
PCI = PciTopology(numa={"0000:3b:00.0": 1, "0000:00:02.0": 0, "0000:00:03.0": None,
                        "0000:5e:00.0": 0, "0000:5f:00.0": 1},
                  root={"0000:3b:00.0": "pci0000:3a", "0000:00:02.0": "pci0000:00",
                        "0000:00:03.0": "pci0000:00", "0000:5e:00.0": "pci0000:5d",
                        "0000:5f:00.0": "pci0000:5d"})


def rslice(name: str, devices: list[Any], *, node: str = NODE, driver: str = "gpu.example.com",
           pool: str = "p", generation: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"nodeName": node, "driver": driver,
                     "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
                     "devices": devices}}


def dev(name: str) -> dict[str, Any]:
    return {"name": name, "attributes": {"model": {"string": "m"}}}


STD = "resource.kubernetes.io/"


def one(device: dict[str, Any], *, driver: str = "gpu.example.com",
        pci: PciTopology | None = PCI) -> Any:
    found = slice_devices(rslice("s1", [device], driver=driver), NODE, pci, MACHINE)
    assert len(found) == 1
    return found[0]


def test_standard_numa_node_integer() -> None:
    d = one({"name": "gpu-0", "attributes": {STD + "numaNode": {"int": 1}}})
    assert (d.numa_nodes, d.source, d.problem) == ((1,), "numaNode", None)
    assert d.to_json() == {"slice": "s1", "driver": "gpu.example.com", "pool": "p",
                           "device": "gpu-0", "numaNodes": [1], "source": "numaNode",
                           "attributes": {STD + "numaNode": "1"}}


def test_standard_numa_node_list_keeps_the_physical_node_first() -> None:
    d = one({"name": "gpu-0", "attributes": {STD + "numaNode": {"ints": [1, 0, 1]}}})
    assert (d.numa_nodes, d.source) == ((1, 0), "numaNode")


def test_numa_node_wins_over_pci_attributes() -> None:
    d = one({"name": "g", "attributes": {STD + "numaNode": {"int": 0},
                                         STD + "pciBusID": {"string": "0000:3b:00.0"}}})
    assert (d.numa_nodes, d.source) == ((0,), "numaNode")


def test_pcie_root_through_sysfs() -> None:
    d = one({"name": "nic", "attributes": {STD + "pcieRoot": {"string": "pci0000:3a"}}})
    assert (d.numa_nodes, d.source, d.problem) == ((1,), "pcieRoot", None)


def test_pcie_root_spanning_nodes_falls_to_the_bus_id() -> None:
    d = one({"name": "nic", "attributes": {STD + "pcieRoot": {"string": "pci0000:5d"},
                                           STD + "pciBusID": {"string": "0000:5F:00.0"}}})
    assert (d.numa_nodes, d.source) == ((1,), "pciBusID")
    assert set(d.attributes) == {STD + "pcieRoot", STD + "pciBusID"}


def test_pci_bus_id_through_sysfs() -> None:
    d = one({"name": "nic", "attributes": {STD + "pciBusID": {"string": "0000:3b:00.0"}}})
    assert (d.numa_nodes, d.source) == ((1,), "pciBusID")


def test_unresolvable_pci_is_unknown_and_says_why() -> None:
    d = one({"name": "nic", "attributes": {STD + "pciBusID": {"string": "0000:00:03.0"}}})
    assert (d.numa_nodes, d.source) == (None, "unknown")
    assert "0000:00:03.0: no NUMA affinity in sysfs" in (d.problem or "")
    d = one({"name": "nic", "attributes": {STD + "pciBusID": {"string": "0000:aa:00.0"}}})
    assert "no such PCI device in this node's sysfs" in (d.problem or "")
    d = one({"name": "nic", "attributes": {STD + "pcieRoot": {"string": "pci0000:3a"}}},
            pci=None)
    assert d.numa_nodes is None and "no sysfs PCI view" in (d.problem or "")


@pytest.mark.parametrize(("driver", "attrs", "want"), [
    ("dra.net", {"dra.net/numaNode": {"int": 1}}, (1,)),
    ("dra.net", {"numaNode": {"int": 0}}, (0,)),  # unqualified: the driver's own domain
    ("dra.cpu", {"numaNodeID": {"int": 1}}, (1,)),
    ("gpu.nvidia.com", {"dra.net/numaNode": {"int": 0}}, (0,)),
])
def test_known_drivers_attributes(driver: str, attrs: dict[str, Any],
                                  want: tuple[int, ...]) -> None:
    d = one({"name": "d", "attributes": attrs}, driver=driver)
    assert (d.numa_nodes, d.source, d.problem) == (want, "driverAttribute", None)


def test_an_unqualified_name_of_another_driver_is_not_taken() -> None:
    d = one({"name": "d", "attributes": {"numaNode": {"int": 0}}}, driver="gpu.example.com")
    assert (d.numa_nodes, d.source, d.problem) == (None, "unknown", None)


def test_no_attribute_is_unknown_never_guessed() -> None:
    d = one({"name": "d", "attributes": {"model": {"string": "x"}}})
    assert (d.numa_nodes, d.source, d.problem) == (None, "unknown", None)
    assert "numaNodes" not in d.to_json()


@pytest.mark.parametrize(("value", "shown"), [
    ({"string": "x"}, '"x"'), ({"bool": True}, "true"), ({"ints": []}, "[]"),
    ({"ints": [0, "1"]}, '[0, "1"]'), ({}, "{}"), ("zero", '"zero"'),
])
def test_malformed_numa_node(value: Any, shown: str) -> None:
    d = one({"name": "gpu-0", "attributes": {STD + "numaNode": value,
                                             STD + "pciBusID": {"string": "0000:3b:00.0"}}})
    assert (d.numa_nodes, d.source) == (None, "unknown")  # not taken from the next rule
    assert d.problem == (f"ResourceSlice s1: device gpu-0: attribute {STD}numaNode: want an "
                         f"integer or a list of integers, got {shown}")


def test_numa_node_the_machine_lacks() -> None:
    d = one({"name": "gpu-0", "attributes": {STD + "numaNode": {"ints": [0, 7]}}})
    assert d.numa_nodes is None
    assert d.problem == (f"ResourceSlice s1: device gpu-0: attribute {STD}numaNode: NUMA node 7 "
                         f"is not on this machine (its NUMA nodes: 0,1)")
    d = one({"name": "gpu-0", "attributes": {STD + "numaNode": {"int": -1}}})
    assert "NUMA node -1 is out of range" in (d.problem or "")


def test_malformed_pci_attributes() -> None:
    d = one({"name": "n", "attributes": {STD + "pciBusID": {"int": 3}}})
    assert d.problem and f"attribute {STD}pciBusID: want a string, got 3" in d.problem
    d = one({"name": "n", "attributes": {STD + "pcieRoot": {"string": "root-0"}}})
    assert d.problem and "want pci<domain>:<bus>" in d.problem


def test_bad_slices_and_devices_spoil_nothing_else() -> None:
    good = rslice("good", [{"name": "gpu-0", "attributes": {STD + "numaNode": {"int": 0}}}])
    slices: list[Any] = [
        good,
        {"metadata": {"name": "no-driver"}, "spec": {"nodeName": NODE}},
        {"metadata": {"name": "devices-not-a-list"},
         "spec": {"nodeName": NODE, "driver": "d.io", "pool": {"name": "q"}, "devices": 5}},
        rslice("mixed", [None, {"name": "ok", "attributes": []},
                         {"name": "dup"}, {"name": "dup"}], driver="z.io"),
        rslice("other-node", [dev("x")], node="node-b"),
        "not an object",
    ]
    found = node_devices(slices, NODE, PCI, MACHINE)
    by = {(d.slice, d.device): d for d in found.devices}
    assert by[("good", "gpu-0")].numa_nodes == (0,)
    assert by[("no-driver", None)].problem == "ResourceSlice no-driver: spec.driver: missing"
    assert "spec.devices: want a list, got 5" in (by[("devices-not-a-list", None)].problem or "")
    assert by[("mixed", None)].problem == "ResourceSlice mixed: spec.devices[0]: no name"
    assert "attributes: want a map" in (by[("mixed", "ok")].problem or "")
    assert ("ResourceSlice mixed: device dup: listed twice in the slice; the first is kept"
            in [d.problem for d in found.devices])
    assert not any(d.slice == "other-node" for d in found.devices)
    NodeTopologyStatus.model_validate({"draDevices": found.entries()})  # the CRD's shape


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    old = rslice("old", [dev("a")], generation=1)
    new = rslice("new", [dev("b")], generation=2)
    found = node_devices([old, new], NODE, PCI, MACHINE)
    assert [d.device for d in found.devices] == ["b"]


def test_per_device_node_selection() -> None:
    s = rslice("s", [{"name": "mine", "nodeName": NODE}, {"name": "theirs", "nodeName": "b"}])
    del s["spec"]["nodeName"]
    s["spec"]["perDeviceNodeSelection"] = True
    assert [d.device for d in node_devices([s], NODE, PCI, MACHINE).devices] == ["mine"]


def test_oversized_input_is_bounded() -> None:
    huge = "x" * 100_000
    slices = [rslice(f"s{i:03}", [{"name": f"d{j}", "attributes": {
        STD + "numaNode": {"string": huge}}} for j in range(128)]) for i in range(20)]
    found = node_devices(slices, NODE, PCI, MACHINE)
    assert found.total == 20 * 128
    assert len(found.devices) == MAX_DRA_DEVICES
    assert found.omitted == 20 * 128 - MAX_DRA_DEVICES
    assert all(len(d.problem or "") <= 512 for d in found.devices)
    assert all(len(v) <= 64 for d in found.devices for v in d.attributes.values())
    NodeTopologyStatus.model_validate({"draDevices": found.entries()})


def test_pci_topology_from_a_real_machine(tmp_path: Path) -> None:
    with tarfile.open(testdata.SYSFS / "fakepcilocalities.tar.bz2") as tf:
        tf.extractall(tmp_path, filter="data")
    pci = pci_topology(tmp_path / "fakepcilocalities")
    assert pci is not None
    assert pci.numa["0000:43:00.0"] == 1
    assert pci.root["0000:02:00.0"] == "pci0000:00"  # behind a bridge
    assert pci.root_numa("pci0000:c0") == {3}
    machine = {0, 1, 2, 3}
    d = slice_devices(rslice("s", [{"name": "nic", "attributes": {
        STD + "pcieRoot": {"string": "pci0000:c0"}}}]), NODE, pci, machine)[0]
    assert (d.numa_nodes, d.source) == ((3,), "pcieRoot")
    d = slice_devices(rslice("s", [{"name": "nic", "attributes": {
        STD + "pciBusID": {"string": "0000:43:00.0"}}}]), NODE, pci, {0})[0]
    assert d.numa_nodes is None
    assert "sysfs says NUMA node 1, which is not on this machine" in (d.problem or "")
    assert pci_topology(tmp_path / "nothing") is None


def _state() -> NodeState:
    m = machine_from_dict({"name": "m", "numaNodes": [
        {"id": 0, "cpus": "0-3", "memory": "8Gi"}, {"id": 1, "cpus": "4-7", "memory": "8Gi"}]})
    return NodeState(NODE, m, admits=False)


def test_status_lists_and_counts_the_devices() -> None:
    st = _state()
    assert "draDevices" not in build_status(st)  # not read: nothing said
    changes: list[NodeDraDevices] = []
    watch = DraDevices(None, NODE, [0, 1], PCI, changes.append)  # type: ignore[arg-type]
    good = rslice("s1", [{"name": "gpu-0", "attributes": {STD + "numaNode": {"int": 1}}},
                         {"name": "gpu-1", "attributes": {STD + "numaNode": {"string": "x"}}}])
    watch.on_list([good, rslice("s2", [dev("z")], node="node-b")])
    assert len(changes) == 1
    st.dra = changes[-1]
    status = build_status(st)
    assert status["summary"]["draDevices"] == 2
    assert [(d["device"], d.get("numaNodes"), d["source"]) for d in status["draDevices"]] == [
        ("gpu-0", [1], "numaNode"), ("gpu-1", None, "unknown")]
    NodeTopologyStatus.model_validate(status)
    watch.on_event("MODIFIED", good)  # nothing changed: no republish
    assert len(changes) == 1
    watch.on_event("DELETED", good)
    assert changes[-1].total == 0 and len(changes) == 2


def test_emulated_nodes_get_their_own_slices_only_once_they_have_some() -> None:
    from numalign.agent.dra import FleetDraDevices

    changes: list[tuple[str, int]] = []
    fleet = FleetDraDevices(None, {"e-0": [0, 1], "e-1": [0]},  # type: ignore[arg-type]
                            lambda n, d: changes.append((n, d.total)))
    a = rslice("a", [{"name": "g", "attributes": {STD + "numaNode": {"int": 1}}}], node="e-0")
    fleet.on_list([a, rslice("x", [dev("z")], node="real-node")])
    assert changes == [("e-0", 1)]  # e-1 has none: nothing said of it
    assert fleet.current["e-0"].devices[0].numa_nodes == (1,)
    b = rslice("b", [{"name": "g", "attributes": {STD + "numaNode": {"int": 1}}}], node="e-1")
    fleet.on_event("ADDED", b)  # NUMA node 1 is not on e-1's machine
    assert changes[-1] == ("e-1", 1)
    assert "NUMA node 1 is not on this machine" in (fleet.current["e-1"].devices[0].problem or "")
    moved = rslice("a", [dev("g")], node="e-1", pool="p2")  # a slice cannot move, but still
    fleet.on_event("MODIFIED", moved)
    assert fleet.current["e-0"].total == 0 and fleet.current["e-1"].total == 2
    fleet.on_event("DELETED", moved)
    assert fleet.current["e-1"].total == 1
