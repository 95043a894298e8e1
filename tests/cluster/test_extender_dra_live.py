"""The scheduler extender with DRA claims, against the real API server, kube-scheduler
(its DRA allocator, calling the extender) and kube-controller-manager (claims from
templates), on an emulated DRA node: a single-numa-node pod whose claim's only devices
sit on a NUMA node that cannot hold its CPUs stays Pending (the extender refuses the
node, naming the claim) instead of being rejected by the node; an aligned one is bound,
its claim allocated, and its CPUs sit on its device's NUMA node; a claim naming a
missing DeviceClass is refused by name and spoils no other pod."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_dra_claims_live import (
    NODE1,
    SNN,
    Kubectl,
    _get,
    allocation,
    classes,
    create,
    decided,
    events,
    gpu_request,
    pod,
    template,
)

import testdata
from agent_helpers import StartAgent
from numalign.devcluster.cluster import DevCluster

pytestmark = pytest.mark.cluster

MACHINE = testdata.MACHINES / "group4-gpu.yaml"  # 2 NUMA nodes of 16 CPUs, 2 GPUs each

__all__ = ["classes"]  # the fixture, used here


@pytest.fixture
def extender(dev_cluster: DevCluster) -> Iterator[None]:
    """numalign's extender, where the session's kube-scheduler calls it."""
    dev_cluster.start_extender()
    try:
        yield
    finally:
        dev_cluster.stop_extender()


def pending_reason(kubectl: Kubectl, ns: str, name: str, wait: Callable[..., Any]) -> str:
    """The scheduler's FailedScheduling message for a pod that stays unbound."""
    def refused() -> str | None:
        p = _get(kubectl, "pod", "-n", ns, name) or {}
        assert not (p.get("spec") or {}).get("nodeName"), p.get("status")
        msgs = [e["message"] for e in events(kubectl, ns, name)
                if e["reason"] == "FailedScheduling"]
        return next((m for m in msgs if "numalign" in m or "DRA" in m), None)
    got: str = wait(refused, 90, f"pod {name} refused by the extender")
    return got


def test_the_extender_places_claims_where_the_node_admits_them(
        start_agent: StartAgent, kubectl: Kubectl, namespace: str,
        wait: Callable[..., Any], classes: None, extender: None) -> None:
    ns, node = namespace, start_agent(MACHINE, "--dra").node
    wait(lambda: (_get(kubectl, "nodetopology", node) or {}).get("status", {}).get(
        "draDevices"), 60, "the node's DRA devices")
    template(kubectl, ns, "one-far", {"devices": {"requests": [gpu_request("gpu", 1)]}})
    template(kubectl, ns, "nowhere", {"devices": {"requests": [
        gpu_request("gpu", cls="no-such-class")]}})

    # 20 exclusive CPUs and a GPU that can only be on NUMA node 1 (16 CPUs): the node
    # would reject it; the extender refuses the node, so it stays Pending
    create(kubectl, ns, pod("too-big", node, template="one-far", resolved=SNN, cpus=20))
    msg = pending_reason(kubectl, ns, "too-big", wait)
    assert "TopologyAffinityError" in msg and "claim gpus request gpu" in msg, msg
    assert "numalign: policy single-numa-node" in msg, msg
    # a claim naming a missing class: refused by name
    create(kubectl, ns, pod("no-class", node, template="nowhere", resolved=SNN))
    # an aligned one: bound, Running, its CPUs on its GPU's NUMA node
    create(kubectl, ns, pod("aligned", node, template="one-far", resolved=SNN))
    p = decided(kubectl, ns, "aligned", wait)
    assert p["status"]["phase"] == "Running", p["status"]
    alloc = allocation(p)
    assert set(alloc["containers"]["c"]["cpus"]) <= NODE1
    assert alloc["numaNodes"] == [1]
    # the refused pods are still unbound, never rejected by the node
    for name in ("too-big", "no-class"):
        got = _get(kubectl, "pod", "-n", ns, name) or {}
        assert not got["spec"].get("nodeName") and got["status"].get("phase") == "Pending", (
            json.dumps(got.get("status")))
    assert "no-such-class" in " ".join(e["message"] for e in events(kubectl, ns, "no-class"))
