"""NodeTopology status -> NodeResourceTopology (topology.node.k8s.io/v1alpha2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import testdata
from numalign.agent import nrt
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api.kube import ApiError
from numalign.topology.machine import load_machine

MACHINES = testdata.MACHINES
CRD = Path(__file__).resolve().parents[2] / "config" / "nrt" / "crd.yaml"


def status_of(machine: str) -> dict[str, Any]:
    return build_status(NodeState("n1", load_machine(MACHINES / machine)))


def test_zones_resources_and_costs_from_a_published_status() -> None:
    obj = nrt.build_nrt("n1", status_of("seed-figure1.yaml"),
                        {"policy": "single-numa-node", "scope": "pod"})
    assert obj["apiVersion"] == "topology.node.k8s.io/v1alpha2"
    assert obj["kind"] == "NodeResourceTopology"
    assert obj["metadata"] == {"name": "n1"}
    assert [z["name"] for z in obj["zones"]] == ["node-0", "node-1"]
    assert {z["type"] for z in obj["zones"]} == {"Node"}
    z0 = obj["zones"][0]
    assert z0["resources"] == [
        {"name": "cpu", "capacity": "4", "allocatable": "4", "available": "4"},
        {"name": "gpu-vendor.com/gpu", "capacity": "1", "allocatable": "1", "available": "1"},
        {"name": "memory", "capacity": "32Gi", "allocatable": "32Gi", "available": "32Gi"},
        {"name": "nic-vendor.com/nic", "capacity": "1", "allocatable": "1", "available": "1"},
    ]
    assert z0["costs"] == [{"name": "node-0", "value": 10}, {"name": "node-1", "value": 21}]
    assert obj["zones"][1]["costs"] == [{"name": "node-0", "value": 21},
                                        {"name": "node-1", "value": 10}]


@pytest.mark.parametrize("policy,scope,legacy", [
    ("single-numa-node", "container", "SingleNUMANodeContainerLevel"),
    ("single-numa-node", "pod", "SingleNUMANodePodLevel"),
    ("restricted", "container", "RestrictedContainerLevel"),
    ("restricted", "pod", "RestrictedPodLevel"),
    ("best-effort", "container", "BestEffortContainerLevel"),
    ("best-effort", "pod", "BestEffortPodLevel"),
    ("none", "container", "None"),
])
def test_topology_manager_attributes(policy: str, scope: str, legacy: str) -> None:
    obj = nrt.build_nrt("n1", status_of("seed-figure1.yaml"), {"policy": policy, "scope": scope})
    assert obj["attributes"] == [{"name": "topologyManagerPolicy", "value": policy},
                                 {"name": "topologyManagerScope", "value": scope},
                                 {"name": "topologyManagerMaxNUMANodes", "value": "64"}]
    assert obj["topologyPolicies"] == [legacy]
    dropped = nrt.build_nrt("n1", status_of("seed-figure1.yaml"),
                            {"policy": policy, "scope": scope}, legacy_policies=False)
    assert "topologyPolicies" not in dropped
    assert dropped["attributes"] == obj["attributes"]


def test_no_spec_is_none_container() -> None:
    obj = nrt.build_nrt("n1", status_of("seed-figure1.yaml"))
    attrs = {a["name"]: a["value"] for a in obj["attributes"]}
    assert attrs == {"topologyManagerPolicy": "none", "topologyManagerScope": "container",
                     "topologyManagerMaxNUMANodes": "64"}


@pytest.mark.parametrize("options,max_numa,given", [
    ({"maxAllowableNumaNodes": 16}, "16", "max-allowable-numa-nodes=16"),
    ({"prefer-closest-numa-nodes": "true", "max-allowable-numa-nodes": "8"}, "8",
     "max-allowable-numa-nodes=8,prefer-closest-numa-nodes=true"),
    ({"preferClosestNumaNodes": False}, "64", "prefer-closest-numa-nodes=false"),
])
def test_policy_options_as_attributes(options: dict[str, Any], max_numa: str,
                                      given: str) -> None:
    obj = nrt.build_nrt("n1", status_of("seed-figure1.yaml"),
                        {"policy": "single-numa-node", "scope": "pod", "options": options})
    attrs = {a["name"]: a["value"] for a in obj["attributes"]}
    assert attrs["topologyManagerMaxNUMANodes"] == max_numa
    assert attrs["topologyManagerPolicyOptions"] == given


def test_zone_ids_from_64_are_left_out() -> None:
    # the scheduler plugin indexes zones by id in a 64-entry table (node-64 would crash it)
    ids = [0, 1, 63, 64, 65, 200]
    status = {"zones": [{"id": i, "cpus": str(i), "memory": "1Gi"} for i in ids],
              "distances": {str(a): {str(b): 10 if a == b else 20 for b in ids} for a in ids}}
    obj = nrt.build_nrt("big", status)
    assert [z["name"] for z in obj["zones"]] == ["node-0", "node-1", "node-63"]
    for z in obj["zones"]:
        assert [c["name"] for c in z["costs"]] == ["node-0", "node-1", "node-63"]
    assert nrt.omitted_zones(status) == [64, 65, 200]


def test_available_reflects_admitted_pods_and_hugepages() -> None:
    status = status_of("dgx-a100-like.yaml")
    z = status["zones"][0]
    z["available"] = dict(z["available"], cpu=20, memory="100Gi")
    obj = nrt.build_nrt("dgx", status, {"policy": "restricted"})
    res = {r["name"]: r for r in obj["zones"][0]["resources"]}
    assert res["cpu"] == {"name": "cpu", "capacity": "32", "allocatable": "32",
                          "available": "20"}
    assert res["memory"]["available"] == "100Gi"
    assert res["hugepages-1Gi"]["capacity"] == "16Gi"
    assert len(obj["zones"]) == 8
    assert len(obj["zones"][0]["costs"]) == 8


def test_zone_without_resource_maps_and_sparse_ids() -> None:
    status = {"zones": [{"id": 0, "cpus": "0-3", "memory": "8Gi"},
                        {"id": 2, "cpus": "", "memory": "64Gi",
                         "hugepages": {"2Mi": "1Gi"}}],
              "distances": {"0": {"0": 10, "2": 40}, "2": {"0": 40, "2": 10}}}
    obj = nrt.build_nrt("sparse", status, node_uid="uid-1", labels={"a": "b"})
    assert [z["name"] for z in obj["zones"]] == ["node-0", "node-2"]
    z2 = {r["name"]: r for r in obj["zones"][1]["resources"]}
    assert z2["cpu"]["capacity"] == "0" and z2["hugepages-2Mi"]["available"] == "1Gi"
    assert obj["zones"][1]["costs"] == [{"name": "node-0", "value": 40},
                                        {"name": "node-2", "value": 10}]
    assert obj["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "sparse", "uid": "uid-1"}]
    assert obj["metadata"]["labels"] == {"a": "b"}


@pytest.mark.parametrize("status,spec,needle", [
    ({}, None, "no zones"),
    ({"zones": [{"id": "x"}]}, None, "id"),
    ({"zones": [{"id": 0, "capacity": {"memory": "lots"}}]}, None, "memory"),
    ({"zones": [{"id": 0, "cpus": "0"}]}, {"policy": "strict"}, "spec.policy"),
    ({"zones": [{"id": 0, "cpus": "0"}]}, {"policy": "none", "options": {"x": 1}},
     "spec.options"),
    ({"zones": [{"id": 0, "cpus": "0"}]},
     {"policy": "none", "options": {"max-allowable-numa-nodes": "four"}},
     "spec.options: option maxAllowableNumaNodes must be an integer"),
])
def test_bad_input(status: dict[str, Any], spec: dict[str, Any] | None, needle: str) -> None:
    with pytest.raises(nrt.NrtError, match=needle):
        nrt.build_nrt("n", status, spec)


def test_crd_matches_the_objects() -> None:
    crd = yaml.safe_load(CRD.read_text())
    assert crd["metadata"]["name"] == "noderesourcetopologies.topology.node.k8s.io"
    assert crd["spec"]["scope"] == "Cluster"
    [version] = crd["spec"]["versions"]
    assert version["name"] == "v1alpha2" and version["served"] and version["storage"]
    schema = version["schema"]["openAPIV3Schema"]
    obj = nrt.build_nrt("n1", status_of("seed-figure1.yaml"), {"policy": "restricted"})
    top = schema["properties"]
    assert set(obj) - {"apiVersion", "kind", "metadata"} <= set(top)
    assert set(schema["required"]) <= set(obj)
    assert schema["required"] == ["zones"]  # topologyPolicies may be left out
    zone = top["zones"]["items"]
    for z in obj["zones"]:
        assert set(z) <= set(zone["properties"]) and set(zone["required"]) <= set(z)
        res = zone["properties"]["resources"]["items"]
        for r in z["resources"]:
            assert set(r) == set(res["required"])


class FakeKube:
    def __init__(self, existing: dict[str, Any] | None, conflicts: int = 0) -> None:
        self.existing = existing
        self.conflicts = conflicts
        self.calls: list[tuple[str, str, Any]] = []

    async def get(self, path: str) -> dict[str, Any]:
        self.calls.append(("GET", path, None))
        if self.existing is None:
            raise ApiError(404, {"kind": "Status", "reason": "NotFound"}, "GET", path)
        return self.existing

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("POST", path, body))
        return body

    async def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append(("PUT", path, body))
        if self.conflicts:
            self.conflicts -= 1
            raise ApiError(409, {"reason": "Conflict"}, "PUT", path)
        return body


async def test_publish_creates_when_missing() -> None:
    obj = nrt.build_nrt("n1", status_of("seed-figure1.yaml"))
    kube = FakeKube(None)
    await nrt.publish_nrt(kube, obj)  # type: ignore[arg-type]
    assert [(m, p) for m, p, _ in kube.calls] == [
        ("GET", "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies/n1"),
        ("POST", "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies")]


async def test_publish_replaces_with_resource_version_and_retries_conflicts() -> None:
    obj = nrt.build_nrt("n1", status_of("seed-figure1.yaml"), labels={"mine": "1"})
    existing = {"metadata": {"name": "n1", "resourceVersion": "7",
                             "labels": {"theirs": "x"}}}
    kube = FakeKube(existing, conflicts=1)
    await nrt.publish_nrt(kube, obj)  # type: ignore[arg-type]
    puts = [b for m, _, b in kube.calls if m == "PUT"]
    assert len(puts) == 2
    assert puts[-1]["metadata"]["resourceVersion"] == "7"
    assert puts[-1]["metadata"]["labels"] == {"theirs": "x", "mine": "1"}
    assert puts[-1]["zones"] == obj["zones"]
    assert "resourceVersion" not in obj["metadata"]  # the caller's object is untouched
