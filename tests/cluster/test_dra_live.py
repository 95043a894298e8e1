"""DRA devices through a real API server: the real-node agent lists its node's
ResourceSlices (resource.k8s.io/v1), maps each device to NUMA nodes (the standard
attribute, or the PCI device through the node's sysfs, a real machine's dump) and shows
them in NodeTopology status and ``kubectl get nt``; a bad device or another node's slice
spoils nothing; a slice change is republished."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import testdata

pytestmark = pytest.mark.cluster

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
DUMP = "fakepcilocalities"  # NUMA nodes 0-3; PCI device 0000:43:00.0 on node 1
STD = "resource.kubernetes.io/"


def _slice(name: str, node: str, devices: list[dict[str, Any]], generation: int = 1) -> str:
    return json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "driver": "gpu.example.com",
                 "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                 "devices": devices}})


def test_agent_shows_its_nodes_dra_devices(kubeconfig: Path, kubectl: Kubectl,
                                           wait: Callable[..., Any], tmp_path: Path) -> None:
    with tarfile.open(testdata.SYSFS / f"{DUMP}.tar.bz2") as tar:
        tar.extractall(tmp_path / "root", filter="data")
    root = tmp_path / "root" / DUMP
    node = f"dra-{uuid.uuid4().hex[:6]}"
    mine, other = f"{node}-gpus", f"{node}-elsewhere"
    devices = [
        {"name": "gpu-0", "attributes": {STD + "numaNode": {"int": 2}}},
        {"name": "gpu-1", "attributes": {STD + "numaNode": {"string": "x"}}},
        {"name": "nic-0", "attributes": {STD + "pciBusID": {"string": "0000:43:00.0"}}},
        {"name": "nic-1", "attributes": {STD + "numaNode": {"int": 9}}},
    ]
    kubectl("apply", "-f", "-", input=_slice(mine, node, devices))
    kubectl("apply", "-f", "-", input=_slice(other, "some-other-node",
                                             [{"name": "gpu-9", "attributes": {}}]))
    log = tmp_path / "agent.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "numalign.cli", "agent", "--kubeconfig", str(kubeconfig),
         "--node", node, "--root", str(root)],
        stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        def dra(count: int) -> Any:
            p = kubectl("get", "nodetopology", node, "-o", "json", check=False)
            doc = json.loads(p.stdout) if p.returncode == 0 else {}
            st = doc.get("status") or {}
            got = st.get("draDevices")
            return got if got is not None and len(got) == count else None

        got = wait(lambda: dra(4), 60, "the node's DRA devices in NodeTopology status")
        by = {d["device"]: d for d in got}
        assert set(by) == {"gpu-0", "gpu-1", "nic-0", "nic-1"}  # not the other node's
        assert (by["gpu-0"]["numaNodes"], by["gpu-0"]["source"]) == ([2], "numaNode")
        assert (by["nic-0"]["numaNodes"], by["nic-0"]["source"]) == ([1], "pciBusID")
        assert "numaNodes" not in by["gpu-1"] and by["gpu-1"]["source"] == "unknown"
        assert by["gpu-1"]["problem"] == (
            f"ResourceSlice {mine}: device gpu-1: attribute {STD}numaNode: want an integer or "
            f"a list of integers, got \"x\"")
        assert "NUMA node 9 is not on this machine (its NUMA nodes: 0,1,2,3)" in (
            by["nic-1"]["problem"])
        assert all(d["driver"] == "gpu.example.com" and d["pool"] == node for d in got)

        table = kubectl("get", "nt", node).stdout.splitlines()
        header = table[0].split()
        assert header[-2:] == ["DRA", "AGE"]
        assert table[1].split()[-2] == "4"  # DRA (AGE after it)

        # A slice change is republished: one device gone, one with a list of NUMA nodes
        # (DRAListTypeAttributes, enabled in the dev cluster).
        changed = [{"name": "gpu-0", "attributes": {STD + "numaNode": {"ints": [3, 2]}}},
                   devices[2]]
        kubectl("apply", "-f", "-", input=_slice(mine, node, changed, generation=2))
        got = wait(lambda: dra(2), 60, "the changed slice republished")
        by = {d["device"]: d for d in got}
        assert by["gpu-0"]["numaNodes"] == [3, 2]
        assert by["nic-0"]["numaNodes"] == [1]
        kubectl("delete", "resourceslice", mine)
        wait(lambda: dra(0) is not None, 60, "the deleted slice's devices gone")
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(15)
        for name in (mine, other):
            kubectl("delete", "resourceslice", name, "--ignore-not-found", check=False)
        kubectl("delete", "nodetopology", node, "--ignore-not-found", check=False)
        kubectl("delete", "lease", "-n", "default", f"numalign-agent-{node}",
                "--ignore-not-found", check=False)
        sys.stderr.write(log.read_text()[-3000:])


def test_emulated_node_shows_its_dra_devices(start_agent: Any, kubectl: Kubectl,
                                             wait: Callable[..., Any]) -> None:
    agent = start_agent()  # seed-figure1: NUMA nodes 0 and 1; no sysfs
    node, name = agent.node, f"dra-emu-{uuid.uuid4().hex[:6]}"
    devices = [{"name": "gpu-0", "attributes": {STD + "numaNode": {"int": 1}}},
               {"name": "nic-0", "attributes": {STD + "pciBusID": {"string": "0000:43:00.0"}}}]
    kubectl("apply", "-f", "-", input=_slice(name, node, devices))
    try:
        def dra() -> Any:
            p = kubectl("get", "nodetopology", node, "-o", "json", check=False)
            doc = json.loads(p.stdout) if p.returncode == 0 else {}
            got = (doc.get("status") or {}).get("draDevices")
            return got if got and len(got) == 2 else None

        by = {d["device"]: d for d in wait(dra, 60, "the emulated node's DRA devices")}
        assert by["gpu-0"]["numaNodes"] == [1]
        assert "numaNodes" not in by["nic-0"]  # no sysfs to resolve it: unknown, not guessed
        assert "no sysfs PCI view on this node" in by["nic-0"]["problem"]
    finally:
        kubectl("delete", "resourceslice", name, "--ignore-not-found", check=False)
