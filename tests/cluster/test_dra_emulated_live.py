"""Emulated nodes as a DRA driver, against the real API server and kube-scheduler: with
``numalign agent --emulate ... --dra`` the machine files' devices are published as
ResourceSlices of the emulated driver (owned by the Node, not advertised as extended
resources) and seen by the emulating agent (NodeTopology status.draDevices, each device on
its machine-file NUMA node); with the DeviceClass per device kind, the seed's GPU asks
written as ResourceClaims are allocated by kube-scheduler to devices that satisfy them
(CEL on the memory capacity, ``matchAttribute`` on the NVLink group) and the pods bound;
an ask no node can satisfy stays Pending with the scheduler's reason."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import testdata
from agent_helpers import StartAgent
from numalign.api import draemulated as de
from numalign.topology.machine import Machine, load_machine

pytestmark = pytest.mark.cluster

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
GPU_CLASS = de.device_class_name("nvidia.com/gpu")
NVLINK = f"{de.DRIVER}/nvlink"
GI = 1 << 30


def _get(kubectl: Kubectl, *args: str) -> Any:
    p = kubectl("get", *args, "-o", "json", check=False)
    return json.loads(p.stdout) if p.returncode == 0 else None


def _at_least(gib: int) -> list[dict[str, Any]]:
    return [{"cel": {"expression": f'device.capacity["{de.DRIVER}"].memory'
                                  f'.compareTo(quantity("{gib}Gi")) >= 0'}}]


def _request(name: str, count: int, gib: int | None = None) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": GPU_CLASS, "count": count}
    if gib is not None:
        exactly["selectors"] = _at_least(gib)
    return {"name": name, "exactly": exactly}


# The seed's GPU asks as ResourceClaim specs: the samples' (and the README's) templates.
SAMPLES_FILE = Path(__file__).resolve().parents[2] / "config/samples/dra/gpu-claims.yaml"
SAMPLES = {o["metadata"]["name"]: o["spec"]["spec"] for o in yaml.safe_load_all(
    SAMPLES_FILE.read_text())
    if o["kind"] == "ResourceClaimTemplate"}
FOUR_OF_12 = SAMPLES["four-gpus-12gi"]
TWO_OF_4_TWO_OF_12 = SAMPLES["two-4gi-two-12gi"]
TWO_BY_NVLINK = SAMPLES["two-gpus-nvlink"]
FOUR_BY_NVLINK = {"devices": {"requests": [_request("gpus", 4)],
                              "constraints": [{"matchAttribute": NVLINK}]}}


@pytest.fixture
def published(kubectl: Kubectl) -> Iterator[list[str]]:
    """The names of what the test published (slices and classes), deleted after it."""
    names: list[str] = []
    try:
        yield names
    finally:
        for n in names:
            kubectl("delete", n, "--ignore-not-found", "--wait=false", check=False)


def _publish(kubectl: Kubectl, published: list[str], objs: list[dict[str, Any]]) -> None:
    for o in objs:
        kubectl("apply", "-f", "-", input=json.dumps(o))
        published.append(f"{o['kind'].lower()}/{o['metadata']['name']}")


def _claim_and_pod(kubectl: Kubectl, namespace: str, name: str, spec: dict[str, Any],
                   nodes: list[str]) -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": name, "namespace": namespace}, "spec": spec}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [n]}]} for n in nodes]}}}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": namespace},
           "spec": {"affinity": affinity,
                    "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
                    "containers": [{"name": "c", "image": "pause",
                                    "resources": {"claims": [{"name": "gpus"}]}}]}}
    kubectl("apply", "-f", "-", input=json.dumps(claim))
    kubectl("apply", "-f", "-", input=json.dumps(pod))


def _allocated(kubectl: Kubectl, namespace: str, name: str,
               wait: Callable[..., Any]) -> tuple[str, list[dict[str, Any]]]:
    def bound() -> Any:
        pod = _get(kubectl, "pod", "-n", namespace, name)
        claim = _get(kubectl, "resourceclaim", "-n", namespace, name)
        node = (pod or {}).get("spec", {}).get("nodeName")
        alloc = ((claim or {}).get("status") or {}).get("allocation")
        return (node, alloc["devices"]["results"]) if node and alloc else None
    got: tuple[str, list[dict[str, Any]]] = wait(bound, 60, f"claim {name} allocated, bound")
    return got


def _devices(machine: Machine) -> dict[str, Any]:
    names = de.device_names(machine.devices)
    return dict(zip(names, machine.devices, strict=True))


def test_emulated_nodes_as_dra_driver(start_agent: StartAgent, kubectl: Kubectl,
                                      namespace: str, wait: Callable[..., Any],
                                      published: list[str]) -> None:
    pair = start_agent(testdata.MACHINES / "group4-gpu.yaml", "--dra")  # NVLink pairs
    dgx = start_agent(testdata.MACHINES / "dgx-a100-like.yaml", "--dra")  # 80Gi, no nvlink
    machines = {pair.node: load_machine(pair.machine), dgx.node: load_machine(dgx.machine)}
    _publish(kubectl, published, de.device_classes(
        d.resource for m in machines.values() for d in m.devices))

    # (1) The agent publishes and reads its nodes' slices: each device on its machine-file
    # NUMA node; the Node owns them and advertises no extended resource for them.
    for node, m in machines.items():
        def dra(node: str = node, m: Machine = m) -> Any:
            got = ((_get(kubectl, "nodetopology", node) or {}).get("status") or {}).get(
                "draDevices")
            return got if got is not None and len(got) == len(m.devices) else None
        got = wait(dra, 60, f"{node}'s emulated DRA devices in NodeTopology status")
        want = {n: [d.numa_node] for n, d in _devices(m).items()}
        assert {d["device"]: d["numaNodes"] for d in got} == want
        assert {(d["driver"], d["pool"], d["source"]) for d in got} == {
            (de.DRIVER, node, "numaNode")}
        obj = _get(kubectl, "node", node)
        assert "cpu" in obj["status"]["capacity"]
        assert not {d.resource for d in m.devices} & set(obj["status"]["capacity"])
        slices = _get(kubectl, "resourceslices", "--field-selector", f"spec.nodeName={node}")
        assert {s["spec"]["driver"] for s in slices["items"]} == {de.DRIVER}
        assert all(s["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
                   for s in slices["items"])

    nodes = list(machines)

    def check(name: str, spec: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        _claim_and_pod(kubectl, namespace, name, spec, nodes)
        node, results = _allocated(kubectl, namespace, name, wait)
        devs = _devices(machines[node])
        assert all((r["driver"], r["pool"]) == (de.DRIVER, node) for r in results)
        assert len({r["device"] for r in results}) == len(results)  # distinct devices
        for r in results:
            assert devs[r["device"]].resource == "nvidia.com/gpu"
        return node, [dict(r, memory=devs[r["device"]].memory,
                           nvlink=devs[r["device"]].group("nvlink")) for r in results]

    # (2) "4 GPUs with at least 12 GiB each": only the DGX-like node has four.
    node, got = check("four-of-12", FOUR_OF_12)
    assert node == dgx.node and len(got) == 4
    assert all(r["memory"] >= 12 * GI for r in got)

    # "2 GPUs connected by NVLink": one NVLink group of the node that has the attribute.
    node, got = check("two-by-nvlink", TWO_BY_NVLINK)
    assert node == pair.node and len(got) == 2
    assert got[0]["nvlink"] is not None and got[0]["nvlink"] == got[1]["nvlink"]

    # "2 GPUs of at least 4 GiB and 2 of at least 12 GiB": each request its own memory
    # (the pair node has only two GPUs left, so the DGX-like node).
    node, got = check("two-and-two", TWO_OF_4_TWO_OF_12)
    assert len(got) == 4
    assert sorted(r["request"] for r in got) == ["large", "large", "small", "small"]
    assert all(r["memory"] >= (12 if r["request"] == "large" else 4) * GI for r in got)

    # An ask no node can satisfy (4 GPUs in one NVLink group of 2) stays Pending, said so.
    _claim_and_pod(kubectl, namespace, "four-by-nvlink", FOUR_BY_NVLINK, nodes)

    def unschedulable() -> Any:
        pod = _get(kubectl, "pod", "-n", namespace, "four-by-nvlink") or {}
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
                return c.get("message")
        return None
    message = wait(unschedulable, 60, "the unsatisfiable ask reported Unschedulable")
    assert "cannot allocate all claims" in message
    pod = _get(kubectl, "pod", "-n", namespace, "four-by-nvlink")
    assert not pod["spec"].get("nodeName")
    claim = _get(kubectl, "resourceclaim", "-n", namespace, "four-by-nvlink")
    assert not (claim.get("status") or {}).get("allocation")
    # The samples file as a whole is valid for the API server (templates and the pod).
    kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(SAMPLES_FILE))
    for name in ("four-of-12", "two-by-nvlink", "two-and-two", "four-by-nvlink"):
        kubectl("delete", "pod", "-n", namespace, name, "--grace-period=0", "--force",
                "--wait=false", check=False)
