"""``numalign explain POD`` on a real node: the kubelet's decision (as the agent publishes
it from PodResources) beside the engine's replay on the same state, agreeing or not."""

from __future__ import annotations

import json
from typing import Any

import pytest

import testdata
from numalign.agent.kubelet_config import parse_kubelet_config
from numalign.agent.kubelet_view import apply_snapshot, kubelet_settings
from numalign.agent.podresources import (
    Allocatable,
    DeviceSet,
    KubeletContainer,
    KubeletPod,
    Snapshot,
)
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.commands import explain
from numalign.topology.machine import load_machine

MACHINE = load_machine(testdata.MACHINES / "seed-figure1.yaml")  # CPUs 0-3 on 0, 4-7 on 1
SAMPLE = "numalign.io/sample-device"
CONFIG = parse_kubelet_config({"cpuManagerPolicy": "static", "reservedSystemCPUs": "0",
                               "topologyManagerPolicy": "single-numa-node"})
DEVICES = (DeviceSet(SAMPLE, ("dev-0",), (0,)), DeviceSet(SAMPLE, ("dev-1",), (1,)))


def pod(name: str, uid: str, phase: str = "Running", **status: Any) -> dict[str, Any]:
    res = {"cpu": "1", "memory": "64Mi", SAMPLE: "1"}
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"nodeName": "real-1", "containers": [
                {"name": "main", "resources": {"requests": res, "limits": res}}]},
            "status": {"phase": phase, **status}}


def nodetopology(pods: list[KubeletPod], uids: dict[tuple[str, str], str]) -> dict[str, Any]:
    """The NodeTopology the agent publishes for this kubelet answer."""
    st = NodeState("real-1", MACHINE, admits=False)
    apply_snapshot(st, MACHINE, Snapshot(pods, Allocatable(tuple(range(1, 8)), DEVICES)),
                   CONFIG, uids)
    st.kubelet = kubelet_settings(CONFIG, None)
    return {"metadata": {"name": "real-1"}, "spec": {"policy": "restricted"},
            "status": json.loads(json.dumps(build_status(st)))}


class FakeClient:
    objects: dict[str, Any] = {}

    def __init__(self, kubeconfig: str | None, context: str | None) -> None:
        self.namespace = "ns"

    def get_pod(self, namespace: str, name: str) -> Any:
        return self.objects.get(f"pod/{namespace}/{name}")

    def get_nodetopology(self, name: str) -> Any:
        return self.objects.get(f"nt/{name}")

    def close(self) -> None:
        pass


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        objects: dict[str, Any], name: str, *extra: str) -> dict[str, Any]:
    monkeypatch.setattr(FakeClient, "objects", objects)
    monkeypatch.setattr(explain, "LiveClient", FakeClient)
    assert explain.main([name, "-n", "ns", *extra]) == 0
    text_rc = explain.main([name, "-n", "ns", "-o", "json", *extra])
    assert text_rc == 0
    out = capsys.readouterr().out
    doc: dict[str, Any] = json.loads(out[out.index("\n{") + 1:])
    doc["text"] = out[:out.index("\n{")]
    return doc


def test_agreeing_with_the_kubelet(monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    # What the static CPU manager and the device manager give under single-numa-node with
    # CPU 0 reserved: NUMA node 0, its first free CPU and its device.
    listed = [KubeletPod("ns", "a", (KubeletContainer("main", (1,), (DEVICES[0],)),))]
    objects = {"pod/ns/a": pod("a", "uid-a"),
               "nt/real-1": nodetopology(listed, {("ns", "a"): "uid-a"})}
    doc = run(monkeypatch, capsys, objects, "a")
    assert doc["policy"] == "single-numa-node" and "status.kubelet" in doc["source"]
    assert doc["kubelet"]["admit"] is True and doc["kubelet"]["agree"] is True
    assert doc["kubelet"]["containers"]["main"]["cpus"] == [1]
    assert doc["allocation"]["containers"]["main"]["cpus"] == [1]
    assert any("agrees with the kubelet" in n for n in doc["notes"])
    assert "Kubelet's decision: ADMITTED" in doc["text"]


def test_reserved_cpus_are_not_the_engines_to_give(monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    listed = [KubeletPod("ns", "a", (KubeletContainer("main", (1,), (DEVICES[0],)),))]
    objects = {"pod/ns/a": pod("a", "uid-a"),
               "nt/real-1": nodetopology(listed, {("ns", "a"): "uid-a"})}
    objects["nt/real-1"]["status"]["kubelet"].pop("reservedSystemCPUs")
    doc = run(monkeypatch, capsys, objects, "a")
    # without the reservation the engine would take CPU 0: the check catches it
    assert doc["allocation"]["containers"]["main"]["cpus"] == [0]
    assert doc["kubelet"]["agree"] is False
    assert any("DIFFERS" in n and "CPUs: kubelet [1], engine [0]" in n for n in doc["notes"])


def test_differing_from_the_kubelet_is_said(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    # a kubelet answer the engine would not give (NUMA node 1 while 0 was free)
    listed = [KubeletPod("ns", "a", (KubeletContainer("main", (4,), (DEVICES[1],)),))]
    objects = {"pod/ns/a": pod("a", "uid-a"),
               "nt/real-1": nodetopology(listed, {("ns", "a"): "uid-a"})}
    doc = run(monkeypatch, capsys, objects, "a")
    assert doc["kubelet"]["agree"] is False
    diffs = [n for n in doc["notes"] if "DIFFERS" in n]
    assert any("NUMA nodes: kubelet [1], engine [0]" in n for n in diffs)
    assert any("devices: kubelet" in n for n in diffs)
    assert "DIFFERS" in doc["text"]


def test_kubelet_rejection_replayed(monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    # a holds NUMA node 0's free CPUs and NUMA node 1's device: a 1 CPU + 1 device pod
    # cannot be aligned on one NUMA node
    listed = [KubeletPod("ns", "a", (KubeletContainer("main", (1, 2, 3), (DEVICES[1],)),))]
    msg = "Resources cannot be allocated with Topology locality"
    objects = {"pod/ns/a": pod("a", "uid-a"),
               "pod/ns/c": pod("c", "uid-c", "Failed", reason="TopologyAffinityError",
                               message=msg),
               "nt/real-1": nodetopology(listed, {("ns", "a"): "uid-a"})}
    doc = run(monkeypatch, capsys, objects, "c")
    assert doc["kubelet"] == {"admit": False, "reason": "TopologyAffinityError",
                              "message": msg, "agree": True}
    assert doc["admit"] is False and doc["reason"] == "TopologyAffinityError"
    assert any("agrees with the kubelet: rejected" in n for n in doc["notes"])
    assert "Kubelet's decision: REJECTED (TopologyAffinityError)" in doc["text"]


def test_not_reported_and_what_if(monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    objects = {"pod/ns/b": pod("b", "uid-b", "Pending"), "nt/real-1": nodetopology([], {})}
    doc = run(monkeypatch, capsys, objects, "b")
    assert doc["kubelet"]["admit"] is None and doc["kubelet"]["agree"] is None
    assert any("nothing to compare yet" in n for n in doc["notes"])
    doc = run(monkeypatch, capsys, objects, "b", "--policy", "restricted")
    assert doc["policy"] == "restricted"
    assert any("not compared" in n for n in doc["notes"])


def test_numalign_managed_node_replays_the_pods_own_policy(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """On an NRI-managed node the kubelet's managers are `none` (status.kubelet says so)
    but numalign places with the pod's resolved policy: explain replays that one and does
    not compare with a kubelet decision."""
    nt = nodetopology([], {})
    nt["status"]["kubelet"] = {"topologyManagerPolicy": "none", "cpuManagerPolicy": "none"}
    nt["status"]["conditions"].append({"type": "NRIPlacement", "status": "True",
                                       "reason": "Registered"})
    p = pod("c", "uid-c", "Pending")
    p["metadata"]["annotations"] = {"numalign.io/resolved": json.dumps(
        {"policy": "single-numa-node", "scope": "pod", "source": "TopologyPolicy/rt"})}
    doc = run(monkeypatch, capsys, {"pod/ns/c": p, "nt/real-1": nt}, "c")
    assert (doc["policy"], doc["scope"]) == ("single-numa-node", "pod")
    assert doc["source"] == "TopologyPolicy/rt"
    assert doc.get("kubelet") is None
