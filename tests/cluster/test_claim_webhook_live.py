"""The operator's numa-constraint webhook against the real API server, kube-scheduler (its
DRA allocator) and kube-controller-manager (claims from templates), on an emulated DRA
node that also offers devices of a driver publishing no NUMA node (a ResourceSlice
written by hand, a DeviceClass selecting it): a single-numa-node pod whose claim asks for
such devices gets its claim allocated and is bound and admitted (a constraint on
``resource.kubernetes.io/numaNode`` would leave it Pending forever); a pod of GPUs that
publish their NUMA node still gets the constraint, and one mixing both gets it over the
GPU request alone."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_dra_claims_live import (
    Kubectl,
    _apply,
    _get,
    classes,
    create,
    decided,
    generated_claim,
    gpu_request,
    pod,
    template,
)

import testdata
from agent_helpers import StartAgent
from operator_helpers import delete_policy, operator, policy

pytestmark = pytest.mark.cluster

MACHINE = testdata.MACHINES / "group4-gpu.yaml"  # 2 NUMA nodes of 16 CPUs, 2 GPUs each
PLAIN = "plain.example.com"  # a driver that publishes no NUMA node
NUMA = "resource.kubernetes.io/numaNode"

__all__ = ["classes"]  # the fixture, used here


@pytest.fixture
def plain_devices(kubectl: Kubectl) -> Iterator[Callable[[str], None]]:
    """``publish(node)``: a slice of four devices without a NUMA attribute on ``node``,
    and the DeviceClass selecting them."""
    published: list[str] = []

    def publish(node: str) -> None:
        _apply(kubectl, {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                         "metadata": {"name": PLAIN}, "spec": {"selectors": [
                             {"cel": {"expression": f'device.driver == "{PLAIN}"'}}]}})
        name = f"{node}-plain"
        _apply(kubectl, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                         "metadata": {"name": name},
                         "spec": {"driver": PLAIN, "nodeName": node,
                                  "pool": {"name": name, "generation": 1,
                                           "resourceSliceCount": 1},
                                  "devices": [{"name": f"acc{i}", "attributes": {
                                      "model": {"string": "x1"}}} for i in range(4)]}})
        published.append(name)

    yield publish
    for name in published:
        kubectl("delete", "resourceslice", name, "--ignore-not-found", check=False)
    kubectl("delete", "deviceclass", PLAIN, "--ignore-not-found", check=False)


def plain_request(name: str) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": PLAIN, "count": 1}}


def test_a_claim_of_devices_without_a_numa_node_is_allocated_and_its_pod_bound(
        start_agent: StartAgent, kubectl: Kubectl, namespace: str, k8s_client: Any,
        kubeconfig: Path, tmp_path: Path, wait: Callable[..., Any], classes: None,
        plain_devices: Callable[[str], None]) -> None:
    ns, node = namespace, start_agent(MACHINE, "--dra").node
    wait(lambda: (_get(kubectl, "nodetopology", node) or {}).get("status", {}).get(
        "draDevices"), 60, "the node's DRA devices")
    plain_devices(node)
    template(kubectl, ns, "plain", {"devices": {"requests": [
        plain_request("a"), plain_request("b")]}})
    template(kubectl, ns, "gpus", {"devices": {"requests": [
        gpu_request("a"), gpu_request("b")]}})
    template(kubectl, ns, "mixed", {"devices": {"requests": [
        gpu_request("gpu"), plain_request("acc")]}})
    name = f"webhook-snn-{ns}"[:60]
    policy(k8s_client, name, {"policy": "single-numa-node", "scope": "pod",
                              "namespaces": [ns]})
    try:
        with operator(kubeconfig, k8s_client, tmp_path / "op.log"):
            for p in ("plain", "gpus", "mixed"):
                create(kubectl, ns, pod(p, node, template=p))
            got = {p: decided(kubectl, ns, p, wait) for p in ("plain", "gpus", "mixed")}
    finally:
        delete_policy(k8s_client, name)
    for p, obj in got.items():
        assert obj["spec"].get("nodeName") == node, (p, obj["status"])
        assert obj["status"]["phase"] == "Running", (p, json.dumps(obj["status"]))
        assert "single-numa-node" in obj["metadata"]["annotations"]["numalign.io/resolved"]

    def claim_of(p: str) -> dict[str, Any]:
        c: dict[str, Any] = _get(kubectl, "resourceclaim", "-n", ns, generated_claim(got[p]))
        assert c["status"]["allocation"]["devices"]["results"], (p, c["status"])
        return c

    # devices without a NUMA node: the claim as the pod asked it, allocated
    plain = claim_of("plain")
    assert "constraints" not in plain["spec"]["devices"], plain["spec"]
    assert {r["driver"] for r in plain["status"]["allocation"]["devices"]["results"]} == {
        PLAIN}
    # GPUs that publish it: tied to one NUMA node, and the allocator kept to it
    gpus = claim_of("gpus")
    assert gpus["spec"]["devices"]["constraints"] == [
        {"requests": ["a", "b"], "matchAttribute": NUMA}]
    numa = {d["name"]: d["attributes"][NUMA]["int"]
            for sl in (_get(kubectl, "resourceslices") or {}).get("items", [])
            if sl["spec"].get("nodeName") == node and NUMA in json.dumps(sl["spec"])
            for d in sl["spec"].get("devices") or []}
    results = gpus["status"]["allocation"]["devices"]["results"]
    assert len({numa[r["device"]] for r in results}) == 1, results
    # both: the constraint over the GPU request alone
    mixed = claim_of("mixed")
    assert mixed["spec"]["devices"]["constraints"] == [
        {"requests": ["gpu"], "matchAttribute": NUMA}]
