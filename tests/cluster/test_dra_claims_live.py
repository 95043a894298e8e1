"""Pods with ResourceClaims on an emulated DRA node, against the real API server,
kube-scheduler (its DRA allocator) and kube-controller-manager (claims from templates):
the scheduler allocates the claims, the emulated node then admits the pod with the
allocated devices as fixed hints under the pod's own policy, as the kubelet would for
device-plugin devices on the same NUMA nodes, and rejects it with TopologyAffinityError
where that policy refuses; the redeploy replaces a rejected pod (a template's claim comes
fresh, a shared claim is left alone); bad input gets a clear message and breaks no other
pod."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_kubectl_plugin_live import plugin

import testdata
from agent_helpers import StartAgent
from numalign.api import draemulated as de
from numalign.api.names import ANN_ALLOCATION, ANN_RESOLVED, REJECT_REASON
from numalign.api.resolved import Resolved
from numalign.topology.quantity import format_cpulist
from operator_helpers import delete_policy, operator, policy

pytestmark = pytest.mark.cluster

Kubectl = Callable[..., subprocess.CompletedProcess[str]]
MACHINE = testdata.MACHINES / "group4-gpu.yaml"  # 2 NUMA nodes of 16 CPUs, 2 GPUs each
GPU_CLASS = de.device_class_name("nvidia.com/gpu")
NODE0 = set(range(16))
NODE1 = set(range(16, 32))


def _get(kubectl: Kubectl, *args: str) -> Any:
    p = kubectl("get", *args, "-o", "json", check=False)
    return json.loads(p.stdout) if p.returncode == 0 else None


def _apply(kubectl: Kubectl, obj: dict[str, Any]) -> None:
    kubectl("apply", "-f", "-", input=json.dumps(obj))


def gpu_request(name: str, numa: int | None = None, cls: str = GPU_CLASS) -> dict[str, Any]:
    """One GPU, on NUMA node ``numa`` when given (CEL on the standard attribute)."""
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": 1}
    if numa is not None:
        exactly["selectors"] = [{"cel": {"expression": (
            f'device.attributes["resource.kubernetes.io"].numaNode == {numa}')}}]
    return {"name": name, "exactly": exactly}


# One GPU on each NUMA node: no NUMA node holds both, with the CPUs or not.
SPLIT = {"devices": {"requests": [gpu_request("near", 0), gpu_request("far", 1)]}}


def template(kubectl: Kubectl, ns: str, name: str, spec: dict[str, Any]) -> None:
    _apply(kubectl, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                     "metadata": {"name": name, "namespace": ns}, "spec": {"spec": spec}})


def claim(kubectl: Kubectl, ns: str, name: str, spec: dict[str, Any]) -> None:
    _apply(kubectl, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                     "metadata": {"name": name, "namespace": ns}, "spec": spec})


def pod(name: str, node: str, *, template: str | None = None, shared: str | None = None,
        resolved: str | None = None, labels: dict[str, str] | None = None,
        cpus: int = 4) -> dict[str, Any]:
    """A Guaranteed pod (exclusive CPUs) on ``node`` with one claim, from a template or
    shared by name."""
    ref = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": shared}
    res = {"cpu": str(cpus), "memory": "1Gi"}
    meta: dict[str, Any] = {"name": name, "labels": labels or {}}
    if resolved:
        meta["annotations"] = {ANN_RESOLVED: resolved}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}},
        "resourceClaims": [{"name": "gpus", **ref}],
        "containers": [{"name": "c", "image": "pause", "resources": {
            "requests": res, "limits": res, "claims": [{"name": "gpus"}]}}]}}


def create(kubectl: Kubectl, ns: str, obj: dict[str, Any]) -> None:
    kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(obj))


def decided(kubectl: Kubectl, ns: str, name: str, wait: Callable[..., Any]) -> dict[str, Any]:
    def done() -> Any:
        p = _get(kubectl, "pod", "-n", ns, name) or {}
        return p if (p.get("status") or {}).get("phase") in ("Running", "Failed") else None
    got: dict[str, Any] = wait(done, 90, f"pod {name} admitted or rejected")
    return got


def allocation(p: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(p["metadata"]["annotations"][ANN_ALLOCATION])
    return out


def generated_claim(p: dict[str, Any]) -> str:
    (st,) = p["status"]["resourceClaimStatuses"]
    name: str = st["resourceClaimName"]
    return name


def events(kubectl: Kubectl, ns: str, name: str) -> list[dict[str, Any]]:
    got = _get(kubectl, "events", "-n", ns, "--field-selector",
               f"involvedObject.name={name}") or {}
    items: list[dict[str, Any]] = got.get("items") or []
    return items


@pytest.fixture
def classes(kubectl: Kubectl) -> Iterator[None]:
    objs = de.device_classes(["nvidia.com/gpu"])
    for o in objs:
        _apply(kubectl, o)
    yield
    for o in objs:
        kubectl("delete", "deviceclass", o["metadata"]["name"], "--ignore-not-found",
                "--wait=false", check=False)


SNN = Resolved("single-numa-node", "container", source="pod").annotation()
BEST = Resolved("best-effort", "container", source="pod").annotation()


def explain(kubeconfig: Path, ns: str, name: str, *args: str) -> str:
    p = subprocess.run([sys.executable, "-m", "numalign.cli", "explain", name, "-n", ns,
                        "--kubeconfig", str(kubeconfig), *args],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_claims_align_cpus_or_reject_under_the_pods_policy(
        start_agent: StartAgent, kubectl: Kubectl, namespace: str, kubeconfig: Path,
        wait: Callable[..., Any], classes: None) -> None:
    ns, node = namespace, start_agent(MACHINE, "--dra").node
    wait(lambda: (_get(kubectl, "nodetopology", node) or {}).get("status", {}).get(
        "draDevices"), 60, "the node's DRA devices")
    template(kubectl, ns, "one-far", {"devices": {"requests": [gpu_request("gpu", 1)]}})
    template(kubectl, ns, "split", SPLIT)

    # (a) single-numa-node, one GPU on NUMA node 1: its CPUs go there too
    create(kubectl, ns, pod("aligned", node, template="one-far", resolved=SNN))
    p = decided(kubectl, ns, "aligned", wait)
    assert p["status"]["phase"] == "Running", p["status"]
    alloc = allocation(p)
    c = alloc["containers"]["c"]
    assert set(c["cpus"]) <= NODE1 and len(c["cpus"]) == 4
    assert alloc["numaNodes"] == [1]
    gen = _get(kubectl, "resourceclaim", "-n", ns, generated_claim(p))
    (result,) = gen["status"]["allocation"]["devices"]["results"]
    assert c["draDevices"] == {"dra:gpus/gpu": [f"{de.DRIVER}/{node}/{result['device']}"]}
    # the node's status shows it, per container
    (entry,) = wait(lambda: [e for e in ((_get(kubectl, "nodetopology", node) or {}).get(
        "status") or {}).get("admitted") or [] if e["pod"] == "aligned"], 30,
        "the pod in the node's status.admitted")
    assert entry["containers"][0]["draDevices"] == c["draDevices"]
    # explain shows the claim, its device and NUMA node, and where the CPUs went
    text = explain(kubeconfig, ns, "aligned")
    assert "Result:   ADMITTED" in text
    claim_row = (f"gpus   {generated_claim(p)} (from template one-far)  gpu      "
                 f"{de.DRIVER}/{node}/{result['device']}  1")
    assert "Claims:\n    CLAIM  RESOURCECLAIM" in text and claim_row in text, text
    cpus = format_cpulist(c["cpus"])
    assert (f"  Container c: its claim devices are on NUMA 1; the merged hint gave it "
            f"NUMA 1, CPUs {cpus}") in text
    assert "dra:gpus/gpu" in text  # its hints, in the decision's table
    # the same through kubectl
    via = plugin(kubeconfig, "explain", "aligned", "-n", ns, via_kubectl=True).stdout
    assert claim_row in via and f"merged hint gave it NUMA 1, CPUs {cpus}" in via
    doc = json.loads(explain(kubeconfig, ns, "aligned", "-o", "json"))
    assert doc["claims"]["aligned"] == {"c": {"deviceNumaNodes": [1], "numaNodes": [1],
                                              "cpus": c["cpus"]}}

    # (b) single-numa-node, one GPU on each NUMA node: TopologyAffinityError
    create(kubectl, ns, pod("split-snn", node, template="split", resolved=SNN))
    p = decided(kubectl, ns, "split-snn", wait)
    assert (p["status"]["phase"], p["status"]["reason"]) == ("Failed", REJECT_REASON)
    assert "Topology locality" in p["status"]["message"]
    assert wait(lambda: [e for e in events(kubectl, ns, "split-snn")
                         if e["reason"] == REJECT_REASON], 30, "the rejection event")
    # the claim is released once the pod failed: the agent's event names the devices it
    # was refused with, and explain says why its replay lacks them
    (ev,) = wait(lambda: [e for e in events(kubectl, ns, "split-snn")
                          if e["reason"] == "DRADevicesAtRejection"], 30, "the devices event")
    assert "claim gpus request near: " in ev["message"] and " on NUMA 0" in ev["message"]
    assert "claim gpus request far: " in ev["message"] and " on NUMA 1" in ev["message"]
    text = explain(kubeconfig, ns, "split-snn")
    assert "Note: the pod is Failed with reason TopologyAffinityError" in text
    assert ("Problem: the pod is Failed: its claims are released (one from a template is "
            "deleted), so the replay has none of their devices; the pod's "
            "DRADevicesAtRejection event names those it was decided with") in text, text

    # (c) the same under best-effort: admitted, its CPUs on one of the two NUMA nodes
    create(kubectl, ns, pod("split-be", node, template="split", resolved=BEST))
    p = decided(kubectl, ns, "split-be", wait)
    assert p["status"]["phase"] == "Running", p["status"]
    got = set(allocation(p)["containers"]["c"]["cpus"])
    assert got <= NODE0 or got <= NODE1
    assert sorted(allocation(p)["containers"]["c"]["draDevices"]) == [
        "dra:gpus/far", "dra:gpus/near"]


def test_bad_input_gets_a_clear_message_and_breaks_no_other_pod(
        start_agent: StartAgent, kubectl: Kubectl, namespace: str,
        wait: Callable[..., Any], classes: None) -> None:
    ns, node = namespace, start_agent(MACHINE, "--dra").node
    wait(lambda: (_get(kubectl, "nodetopology", node) or {}).get("status", {}).get(
        "draDevices"), 60, "the node's DRA devices")
    # a claim naming a class that does not exist: never allocated, the scheduler says why
    template(kubectl, ns, "no-class", {"devices": {"requests": [
        gpu_request("gpu", cls="no-such-class.example.com")]}})
    create(kubectl, ns, pod("no-class", node, template="no-class", resolved=SNN))

    def unschedulable() -> Any:
        p = _get(kubectl, "pod", "-n", ns, "no-class") or {}
        for c in (p.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable":
                return c.get("message")
        return None
    message = wait(unschedulable, 60, "the claim with a missing class reported")
    assert "no-such-class.example.com" in message
    # a slice of another driver on this node: one device with a malformed numaNode, one
    # on a NUMA node the machine lacks; a pod given them gets no hint from them, a
    # Warning event naming the slice, device and attribute, and is admitted
    bad = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
           "metadata": {"name": f"{node}-bad"},
           "spec": {"driver": "bad.example.com", "nodeName": node,
                    "pool": {"name": "bad", "generation": 1, "resourceSliceCount": 1},
                    "devices": [
                        {"name": "malformed", "attributes": {
                            "resource.kubernetes.io/numaNode": {"string": "zero"}}},
                        {"name": "elsewhere", "attributes": {
                            "resource.kubernetes.io/numaNode": {"int": 7}}}]}}
    cls = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
           "metadata": {"name": "bad.example.com"},
           "spec": {"selectors": [{"cel": {"expression":
                                           'device.driver == "bad.example.com"'}}]}}
    _apply(kubectl, bad)
    _apply(kubectl, cls)
    try:
        claim(kubectl, ns, "both-bad", {"devices": {"requests": [
            {"name": "any", "exactly": {"deviceClassName": "bad.example.com",
                                        "count": 2}}]}})
        create(kubectl, ns, pod("bad-devices", node, shared="both-bad", resolved=SNN))
        p = decided(kubectl, ns, "bad-devices", wait)
        assert p["status"]["phase"] == "Running", p["status"]
        got = wait(lambda: [e for e in events(kubectl, ns, "bad-devices")
                            if e["reason"] == "DRADeviceTopology"], 30, "the Warning event")
        text = got[0]["message"]
        assert f"ResourceSlice {node}-bad: device malformed: attribute " \
               "resource.kubernetes.io/numaNode: want an integer" in text
        assert "device elsewhere: attribute resource.kubernetes.io/numaNode: NUMA node 7 " \
               "is not on this machine" in text
        # another pod on the node is admitted as ever
        template(kubectl, ns, "one-near", {"devices": {"requests": [gpu_request("gpu", 0)]}})
        create(kubectl, ns, pod("fine", node, template="one-near", resolved=SNN))
        p = decided(kubectl, ns, "fine", wait)
        assert p["status"]["phase"] == "Running"
        assert set(allocation(p)["containers"]["c"]["cpus"]) <= NODE0
    finally:
        kubectl("delete", "resourceslice", f"{node}-bad", "--ignore-not-found", check=False)
        kubectl("delete", "deviceclass", "bad.example.com", "--ignore-not-found", check=False)


FAST = {"enabled": True, "maxAttempts": 1, "backoffSeconds": 1, "avoidRejectingNodes": False}


def test_redeploy_of_pods_with_claims(
        start_agent: StartAgent, kubectl: Kubectl, namespace: str, k8s_client: Any,
        kubeconfig: Path, tmp_path: Path, wait: Callable[..., Any], classes: None) -> None:
    ns, node = namespace, start_agent(MACHINE, "--dra").node
    name = f"dra-{ns}"[:60]
    # restricted: the numa-constraint webhook leaves its claims as they are (under
    # single-numa-node it would keep the split devices from being allocated at all)
    policy(k8s_client, name, {"policy": "restricted", "namespaces": [ns],
                              "redeploy": FAST})
    try:
        with operator(kubeconfig, k8s_client, tmp_path / "op.log"):
            template(kubectl, ns, "split", SPLIT)
            # (b) rejected, then replaced: the replacement's claim is a fresh one from the
            # template; the rejected pod's generated claim goes with it
            create(kubectl, ns, pod("split", node, template="split"))
            p = decided(kubectl, ns, "split", wait)
            assert (p["status"]["phase"], p["status"]["reason"]) == ("Failed", REJECT_REASON)
            old = generated_claim(p)
            r1 = wait(lambda: _get(kubectl, "pod", "-n", ns, "split-r1"), 60,
                      "the replacement split-r1")
            r1 = decided(kubectl, ns, "split-r1", wait)
            assert generated_claim(r1) != old
            assert r1["spec"]["resourceClaims"] == [
                {"name": "gpus", "resourceClaimTemplateName": "split"}]
            wait(lambda: _get(kubectl, "resourceclaim", "-n", ns, old) is None, 60,
                 "the rejected pod's generated claim deleted")

            # (d) a claim shared by name survives the redeploy of a pod that used it
            claim(kubectl, ns, "team-gpus", SPLIT)
            before = _get(kubectl, "resourceclaim", "-n", ns, "team-gpus")
            create(kubectl, ns, pod("user", node, shared="team-gpus"))
            p = decided(kubectl, ns, "user", wait)
            assert (p["status"]["phase"], p["status"]["reason"]) == ("Failed", REJECT_REASON)
            r1 = wait(lambda: _get(kubectl, "pod", "-n", ns, "user-r1"), 60,
                      "the replacement user-r1")
            assert r1["spec"]["resourceClaims"] == [
                {"name": "gpus", "resourceClaimName": "team-gpus"}]
            decided(kubectl, ns, "user-r1", wait)
            after = _get(kubectl, "resourceclaim", "-n", ns, "team-gpus")
            assert after is not None and after["metadata"]["uid"] == before["metadata"]["uid"]
            assert after["spec"] == before["spec"]
            assert not after["metadata"].get("deletionTimestamp")
    finally:
        delete_policy(k8s_client, name)


def claims_seen(lines: str) -> list[dict[str, Any]]:
    """The claims in ``kubectl get -w -o json`` output (JSON documents one after
    another)."""
    dec, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(lines) and lines[i].isspace():
            i += 1
        if i >= len(lines):
            return out
        doc, i = dec.raw_decode(lines, i)
        out.append(doc)


def test_single_numa_node_pod_rejected_then_redeployed_without_the_extender(
        start_agent: StartAgent, kubectl: Kubectl, namespace: str, k8s_client: Any,
        kubeconfig: Path, tmp_path: Path, wait: Callable[..., Any], classes: None) -> None:
    """No extender: the scheduler's allocator gives the pod its GPUs, the node (playing
    the kubelet) refuses the pod under single-numa-node (20 CPUs: more than any NUMA node
    holds), the redeploy replaces it with a fresh claim, and the operator's
    numa-constraint webhook has put each claim's devices on one NUMA node (the claims of
    a pod that failed are deleted: they are read from a watch)."""
    ns, node = namespace, start_agent(MACHINE, "--dra").node
    name = f"dra-snn-{ns}"[:60]
    policy(k8s_client, name, {"policy": "single-numa-node", "scope": "pod",
                              "namespaces": [ns], "redeploy": FAST})
    seen = tmp_path / "claims.json"
    try:
        with operator(kubeconfig, k8s_client, tmp_path / "op.log"), seen.open("w") as out:
            watch = subprocess.Popen(
                ["kubectl", "--kubeconfig", str(kubeconfig), "get", "resourceclaims", "-n", ns,
                 "--watch", "-o", "json"], stdout=out, stderr=subprocess.DEVNULL)
            try:
                template(kubectl, ns, "pair", {"devices": {"requests": [
                    gpu_request("a"), gpu_request("b")]}})
                create(kubectl, ns, pod("wide", node, template="pair", cpus=20))
                p = decided(kubectl, ns, "wide", wait)
                assert (p["status"]["phase"], p["status"]["reason"]) == (
                    "Failed", REJECT_REASON)
                assert "Topology locality" in p["status"]["message"]
                wait(lambda: _get(kubectl, "pod", "-n", ns, "wide-r1"), 60,
                     "the replacement wide-r1")
                r1 = decided(kubectl, ns, "wide-r1", wait)
                assert r1["spec"]["resourceClaims"] == [
                    {"name": "gpus", "resourceClaimTemplateName": "pair"}]
                fresh = generated_claim(r1)
                assert fresh != generated_claim(p)
            finally:
                watch.terminate()
                watch.wait(10)
        numa = {d["name"]: d["attributes"]["resource.kubernetes.io/numaNode"]["int"]
                for sl in (_get(kubectl, "resourceslices") or {}).get("items", [])
                if sl["spec"].get("nodeName") == node
                for d in sl["spec"].get("devices") or []}
        allocated = {}
        for c in claims_seen(seen.read_text()):
            assert c["spec"]["devices"]["constraints"] == [
                {"requests": ["a", "b"], "matchAttribute": "resource.kubernetes.io/numaNode"}]
            got = ((c.get("status") or {}).get("allocation") or {}).get("devices")
            if got:
                allocated[c["metadata"]["name"]] = got["results"]
        assert {generated_claim(p), fresh} <= set(allocated)
        for results in allocated.values():  # the allocator kept to the constraint
            assert len(results) == 2
            assert len({numa[r["device"]] for r in results}) == 1, results
    finally:
        delete_policy(k8s_client, name)
