"""A pod's ResourceClaims read against the node's ResourceSlices: which devices each
container got, on which NUMA nodes, and clear problems for bad input."""

from __future__ import annotations

from typing import Any

from numalign.api.dra import node_devices
from numalign.api.draclaims import pod_claims, pod_dra_devices, uses_claims
from numalign.topology.managers.dra import DraDeviceRef, DraRequest

DRIVER = "gpu.example.com"


def slice_of(devices: list[tuple[str, Any]], name: str = "n0-gpus") -> dict[str, Any]:
    """A ResourceSlice on node n0; each device's numaNode attribute value (None: none)."""
    return {"metadata": {"name": name},
            "spec": {"driver": DRIVER, "nodeName": "n0", "pool": {"name": "n0", "generation": 1},
                     "devices": [{"name": d, "attributes": {} if v is None else {
                         "resource.kubernetes.io/numaNode": v}} for d, v in devices]}}


def claim(name: str, *results: tuple[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"allocation": {"devices": {"results": [
        {"request": r, "driver": DRIVER, "pool": "n0", "device": d} for r, d in results]}}}}


POD: dict[str, Any] = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
    "spec": {
        "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"},
                           {"name": "shared", "resourceClaimName": "team-gpu"}],
        "initContainers": [{"name": "init", "resources": {"claims": [{"name": "shared"}]}}],
        "containers": [
            {"name": "a", "resources": {"claims": [{"name": "gpus", "request": "big"}]}},
            {"name": "b", "resources": {"claims": [{"name": "gpus"}, {"name": "shared"}]}},
            {"name": "c"}]},
    "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus-x1"}]}}

NODE = node_devices([slice_of([("gpu-0", {"int": 0}), ("gpu-1", {"int": 1}),
                               ("gpu-2", {"int": 1}), ("gpu-3", None)])], "n0", None, [0, 1])


def test_claims_are_read_from_spec_and_status() -> None:
    refs, problems = pod_claims(POD)
    assert problems == [] and uses_claims(POD)
    assert [(r.name, r.claim, r.template, r.shared) for r in refs] == [
        ("gpus", "p-gpus-x1", "two-gpus", False), ("shared", "team-gpu", None, True)]
    # before the resourceclaim controller generated the claim: its name is unknown
    pending = {**POD, "status": {}}
    assert [r.claim for r in pod_claims(pending)[0]] == [None, "team-gpu"]
    assert not uses_claims({"spec": {"containers": [{"name": "c"}]}})


def test_each_container_gets_the_devices_of_the_claims_it_names() -> None:
    got = pod_dra_devices(POD, {
        "p-gpus-x1": claim("p-gpus-x1", ("big", "gpu-1"), ("small/fallback", "gpu-0")),
        "team-gpu": claim("team-gpu", ("one", "gpu-2"))}, NODE.devices, [0, 1])
    assert got.ready and got.pending == [] and got.device_problems() == []
    peers = ((0,), (1,), (1,), None)
    ref = {d: DraDeviceRef(DRIVER, "n0", d, n) for d, n in
           (("gpu-0", (0,)), ("gpu-1", (1,)), ("gpu-2", (1,)))}
    assert got.requests() == {
        # only the request it names
        "a": [DraRequest("gpus", "big", (ref["gpu-1"],), peers)],
        # every request of the claim (a subrequest counts as its main request)
        "b": [DraRequest("gpus", "big", (ref["gpu-1"],), peers),
              DraRequest("gpus", "small", (ref["gpu-0"],), peers),
              DraRequest("shared", "one", (ref["gpu-2"],), peers)],
        "init": [DraRequest("shared", "one", (ref["gpu-2"],), peers)]}


def test_a_claim_not_allocated_or_missing_keeps_the_pod_waiting() -> None:
    got = pod_dra_devices(POD, {"p-gpus-x1": {"metadata": {"name": "p-gpus-x1"}}}, NODE.devices)
    assert not got.ready and got.pending == ["gpus", "shared"]
    assert [c.problem for c in got.claims] == [
        "ResourceClaim p-gpus-x1 is not allocated yet", "ResourceClaim team-gpu not found"]


def test_bad_devices_give_no_hint_and_say_why() -> None:
    node = node_devices([slice_of([("gpu-0", {"string": "zero"}), ("gpu-1", {"int": 7}),
                                   ("gpu-2", None)], name="bad-slice")], "n0", None, [0, 1])
    got = pod_dra_devices(
        POD, {"p-gpus-x1": claim("p-gpus-x1", ("big", "gpu-0"), ("big", "gpu-1")),
              "team-gpu": claim("team-gpu", ("one", "gpu-2"), ("one", "gpu-9"))},
        node.devices, [0, 1])
    assert got.ready
    assert [d.numa_nodes for c in got.claims for d in c.devices] == [None] * 4
    assert got.device_problems() == [
        f"claim gpus: device {DRIVER}/n0/gpu-0: ResourceSlice bad-slice: device gpu-0: "
        "attribute resource.kubernetes.io/numaNode: want an integer or a list of integers, "
        'got "zero"',
        f"claim gpus: device {DRIVER}/n0/gpu-1: ResourceSlice bad-slice: device gpu-1: "
        "attribute resource.kubernetes.io/numaNode: NUMA node 7 is not on this machine "
        "(its NUMA nodes: 0,1)",
        f"claim shared: device {DRIVER}/n0/gpu-9: not in this node's ResourceSlices"]
    # a device without any NUMA attribute is unknown without a problem: no hint either
    (shared,) = got.requests()["init"]
    assert [d.numa_nodes for d in shared.devices] == [None, None]


def test_malformed_pods_and_claims_are_read_leniently() -> None:
    refs, problems = pod_claims({"spec": {"resourceClaims": [
        {"name": "x"}, "junk", {"name": "ok", "resourceClaimName": "c"}]}})
    assert [r.name for r in refs] == ["ok"]
    assert problems == ["spec.resourceClaims[0] (x): neither resourceClaimName nor "
                        "resourceClaimTemplateName", "spec.resourceClaims[1]: no name"]
    assert pod_claims({"spec": {"resourceClaims": "junk"}}) == (
        [], ["spec.resourceClaims: want a list"])
    got = pod_dra_devices(POD, {"p-gpus-x1": {"status": {"allocation": {"devices": {
        "results": "junk"}}}}, "team-gpu": claim("team-gpu", ("one", "gpu-2"))},
        NODE.devices)
    assert got.claims[0].problem == (
        "ResourceClaim p-gpus-x1: status.allocation.devices.results: want a list")
    assert "a" not in got.requests()
