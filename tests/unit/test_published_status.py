"""The NodeTopology status the agent publishes, built through the API's model
(``numalign.agent.topostatus``), is the JSON it published when it built the status by hand
(``tests/legacy_status.py``): on every fixture machine, empty and with pods admitted, with
GPU groups, on real nodes (NRI-managed, kubelet-managed), across restarts of conditions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import legacy_status
import testdata
from agent_helpers import given
from numalign.agent import kubelet_status
from numalign.agent.kubelet_config import KubeletConfig
from numalign.agent.kubelet_view import kubelet_settings
from numalign.agent.publish import admitted_entries, build_status
from numalign.agent.state import NodeState
from numalign.api.dra import node_devices
from numalign.api.nodetopology import NodeTopologyStatus
from numalign.api.resolved import Resolved
from numalign.topology.machine import Machine, load_machine

MACHINES = sorted(testdata.MACHINES.glob("*.yaml"))
NOW = "2026-01-02T03:04:05Z"
POLICIES = [Resolved("single-numa-node", "pod", {}, "pod"),
            Resolved("best-effort", "container", {}, "TopologyPolicy/web"),
            Resolved("restricted", "pod", {"prefer-closest-numa-nodes": "true"}, "pod"),
            Resolved("none", "container", {}, "node-default")]


@pytest.fixture(autouse=True)
def _fixed_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kubelet_status, "now_iso", lambda: NOW)


def _text(status: Any) -> str:
    return json.dumps(status, sort_keys=True)


def _same(state: NodeState, previous: Any = None, *, valid: bool = True,
          **kw: Any) -> dict[str, Any]:
    new = build_status(state, previous, **kw)
    old = legacy_status.build_status(state, previous, **kw)
    assert _text(new) == _text(old)
    assert admitted_entries(state) == legacy_status.admitted_entries(state)
    if valid:  # what the API server's schema accepts
        NodeTopologyStatus.model_validate(new)
    return new


def _pod(i: int, machine: Machine, policy: Resolved) -> dict[str, Any]:
    res: dict[str, str] = {"cpu": str(1 + i % 4), "memory": f"{64 * (1 + i % 3)}Mi"}
    if i % 5 == 0 and any(n.hugepages for n in machine.numa_nodes):
        size = sorted(next(n.hugepages for n in machine.numa_nodes if n.hugepages))[0]
        res[f"hugepages-{size}"] = size
    devices = sorted({d.resource for d in machine.devices})
    if devices and i % 2:
        res[devices[i % len(devices)]] = "1"
    containers = [{"name": "main", "resources": {"requests": res, "limits": res}}]
    if i % 3 == 0:
        small = {"cpu": "1", "memory": "32Mi"}
        containers.append({"name": "side", "resources": {"requests": small, "limits": small}})
    return {"metadata": {"name": f"p{i}", "namespace": f"ns{i % 3}", "uid": f"uid-{i}"},
            "spec": {"containers": containers}}


def _filled(path: Path, pods: int) -> NodeState:
    machine = load_machine(path)
    st = NodeState(path.stem, machine)
    for i in range(pods):
        st.decide(_pod(i, machine, POLICIES[i % len(POLICIES)]), given(POLICIES[i % len(POLICIES)]))
    return st


@pytest.mark.parametrize("path", MACHINES, ids=lambda p: p.stem)
def test_every_fixture_machine_empty_and_filled(path: Path) -> None:
    _same(NodeState(path.stem, load_machine(path)))
    st = _filled(path, 40)
    assert st.admitted, "some pods admitted"
    first = _same(st)
    st.observed_generation, st.spec_generation, st.rejected_total = 3, 4, 7
    first["conditions"][0]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    again = _same(st, first, ready=False, message="the kubelet is away")
    assert again["conditions"][1]["status"] == "False"
    _same(st, again)


def test_gpu_groups() -> None:
    path = testdata.MACHINES / "dgx-a100-like.yaml"
    st = NodeState("n", load_machine(path))
    res = {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2", "nvidia.com/hca": "1"}
    gpus = json.dumps([{"count": 2, "sameGroup": "pcie", "withResource": "nvidia.com/hca"}])
    for i in range(3):
        pod = {"metadata": {"name": f"g{i}", "namespace": "ns", "uid": f"uid-g{i}",
                            "annotations": {"numalign.io/gpus": gpus}},
               "spec": {"containers": [{"name": "main",
                                        "resources": {"requests": res, "limits": res}}]}}
        assert st.decide(pod, given(POLICIES[0])).admit
    status = _same(st)
    assert all(e["gpus"] for e in status["admitted"])


def test_real_nodes_nri_and_kubelet_managed() -> None:
    path = testdata.MACHINES / "realnode-2numa.yaml"
    # kubelet-managed: the kubelet's settings, with and without PodResources trouble
    st = _filled(path, 6)
    st.admits = False
    config = KubeletConfig("single-numa-node", "pod", {"prefer-closest-numa-nodes": "true"},
                           "static", "Static", (0, 1))
    st.kubelet = kubelet_settings(config, None)
    st.zone_allocatable = {n.id: {"cpu": len(n.cpus) - 1, "memory": n.memory // 2}
                           for n in st.machine.numa_nodes}
    status = _same(st)
    assert status["conditions"][1]["message"].startswith("the kubelet's Topology Manager")
    st.kubelet = kubelet_settings(None, "PodResources: connection refused")
    _same(st)
    st.kubelet = {"topologyManagerPolicy": "single-numa-node", "topologyManagerScope": "pod",
                  "cpuManagerPolicy": "none"}  # partial, as tests set it by hand
    _same(st, valid=False)
    # numalign-managed (NRI; the kubelet's managers off), every condition reason
    st.kubelet = kubelet_settings(KubeletConfig(), None)
    for placement in [(True, "Registered", "placing"), (False, "Starting", "waiting"),
                      (False, "NotManaged", "no label"), (False, "KubeletManagersOn", "no")]:
        st.placement = placement
        first = _same(st)
        _same(st, first)


def test_dra_devices() -> None:
    # the node's ResourceSlices as the agent read them (agent/dra.py): listed and counted
    st = NodeState("node-a", load_machine(testdata.MACHINES / "dgx-a100-like.yaml"))
    std = "resource.kubernetes.io/"
    devices = [{"name": "gpu-0", "attributes": {f"{std}numaNode": {"int": 1}}},
               {"name": "gpu-1", "attributes": {f"{std}numaNode": {"string": "x"}}},
               {"name": "gpu-2", "attributes": {"model": {"string": "m"}}}]
    st.dra = node_devices([{"metadata": {"name": "s"}, "spec": {
        "nodeName": "node-a", "driver": "gpu.example.com",
        "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
        "devices": devices}}], "node-a", None, set(st.machine.numa_ids))
    status = _same(st)
    assert status["summary"]["draDevices"] == 3
    assert [(d["device"], d.get("numaNodes")) for d in status["draDevices"]] == [
        ("gpu-0", [1]), ("gpu-1", None), ("gpu-2", None)]
