"""The emulated-node agent on a real API server: admission like the kubelet, allocation
annotations and NodeTopology status, rejection with TopologyAffinityError, restart
safety, node default policies and malformed policy annotations."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import testdata
from agent_helpers import Agent, StartAgent
from numalign.agent import podfingerprint as pfp
from numalign.api.names import EVENT_INVALID_GPU
from numalign.topology.quantity import parse_cpulist

pytestmark = pytest.mark.cluster

MACHINES = testdata.MACHINES
SEED = MACHINES / "seed-figure1.yaml"
GPU = "gpu-vendor.com/gpu"
NIC = "nic-vendor.com/nic"
SNN = json.dumps({"policy": "single-numa-node", "scope": "pod", "options": {},
                  "source": "TopologyPolicy/test"})
REASON = "TopologyAffinityError"
MESSAGE = "Pod was rejected: Resources cannot be allocated with Topology locality"

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def agent(start_agent: StartAgent) -> Agent:
    return start_agent()


def get(kubectl: Kubectl, *args: str) -> Any:
    proc = kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def pod_manifest(name: str, node: str, resolved: str | None, cpu: str = "2",
                 devices: bool = True) -> str:
    res: dict[str, str] = {"cpu": cpu, "memory": "200Mi"}
    if devices:
        res.update({GPU: "1", NIC: "1"})
    meta: dict[str, Any] = {"name": name}
    if resolved is not None:
        meta["annotations"] = {"numalign.io/resolved": resolved}
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 30,
                 "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                 "resources": {"requests": res, "limits": res}}]},
    })


def allocation(pod: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(pod["metadata"]["annotations"]["numalign.io/allocation"])
    return doc


def wait_phase(kubectl: Kubectl, wait: Callable[..., Any], ns: str, name: str,
               phase: str) -> dict[str, Any]:
    def check() -> Any:
        pod = get(kubectl, "-n", ns, "pod", name)
        return pod if pod and pod.get("status", {}).get("phase") == phase else None

    result: dict[str, Any] = wait(check, 60, f"pod {name} {phase}")
    return result


def wait_ready(kubectl: Kubectl, wait: Callable[..., Any], node: str) -> None:
    def ready() -> bool:
        n = get(kubectl, "node", node)
        nt = get(kubectl, "nodetopology", node)
        return bool(n and nt and nt.get("status") and any(
            c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"]))

    wait(ready, 60, f"node {node} Ready with its NodeTopology")


def admitted_by_pod(nt: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["pod"]: e for e in nt["status"].get("admitted") or []}


def check_no_double_allocation(nt: dict[str, Any]) -> None:
    cpus: list[int] = []
    devices: list[str] = []
    for e in nt["status"].get("admitted") or []:
        cpus += parse_cpulist(e.get("cpus") or "")
        for ids in (e.get("devices") or {}).values():
            devices += ids
    assert len(cpus) == len(set(cpus)), cpus
    assert len(devices) == len(set(devices)), devices


def test_admits_like_the_kubelet_and_survives_restart(
        agent: Agent, kubectl: Kubectl, namespace: str, wait: Callable[..., Any]) -> None:
    node = agent.node
    wait_ready(kubectl, wait, node)
    node_obj = get(kubectl, "node", node)
    assert node_obj["metadata"]["labels"]["kubernetes.io/hostname"] == node
    assert node_obj["metadata"]["labels"]["numalign.io/machine"] == "seed-figure1"
    assert node_obj["status"]["capacity"][GPU] == "2"
    assert node_obj["status"]["allocatable"]["cpu"] == "8"
    assert get(kubectl, "-n", "kube-node-lease", "lease", node)["spec"]["holderIdentity"] == node

    ns = namespace
    for name in ("a", "b"):
        kubectl("-n", ns, "apply", "-f", "-", input=pod_manifest(name, node, SNN))
        wait_phase(kubectl, wait, ns, name, "Running")
    a = get(kubectl, "-n", ns, "pod", "a")
    b = get(kubectl, "-n", ns, "pod", "b")
    want_a: dict[str, Any] = {"numaNodes": [0], "cpus": [0, 1], GPU: ["gpu0"], NIC: ["nic0"]}
    want_b: dict[str, Any] = {"numaNodes": [1], "cpus": [4, 5], GPU: ["gpu1"], NIC: ["nic1"]}
    for pod, want in ((a, want_a), (b, want_b)):
        alloc = allocation(pod)
        main = alloc["containers"]["main"]
        assert alloc["numaNodes"] == want["numaNodes"]
        assert main["cpus"] == want["cpus"]
        assert main["devices"] == {GPU: want[GPU], NIC: want[NIC]}
        assert main["memory"] == {str(want["numaNodes"][0]): 200 << 20}
        st = pod["status"]
        conds = {c["type"]: c["status"] for c in st["conditions"]}
        assert conds == {"PodScheduled": "True", "Initialized": "True", "Ready": "True",
                         "ContainersReady": "True", "PodReadyToStartContainers": "True"}
        (cs,) = st["containerStatuses"]
        assert cs["ready"] and cs["started"] and "running" in cs["state"]
        assert cs["image"] and cs["imageID"] and cs["containerID"]
        assert st["podIP"] and st["hostIP"] and st["startTime"]
        assert st["qosClass"] == "Guaranteed"
    assert a["status"]["podIP"] != b["status"]["podIP"]

    def published() -> Any:
        nt = get(kubectl, "nodetopology", node)
        return nt if len(nt["status"].get("admitted") or []) == 2 else None

    nt = wait(published, 30, "both pods in NodeTopology status")
    entries = admitted_by_pod(nt)
    assert entries["a"]["cpus"] == "0-1" and entries["b"]["cpus"] == "4-5"
    assert entries["a"]["devices"] == {GPU: ["gpu0"], NIC: ["nic0"]}
    assert entries["b"]["devices"] == {GPU: ["gpu1"], NIC: ["nic1"]}
    assert entries["a"]["policy"] == "single-numa-node"
    assert entries["a"]["source"] == "TopologyPolicy/test"
    assert nt["status"]["summary"]["cpus"] == "4/8"
    assert nt["status"]["summary"]["devices"] == "0/4"

    # A third pod cannot be aligned: 3 CPUs fit no single NUMA node any more.
    kubectl("-n", ns, "apply", "-f", "-",
            input=pod_manifest("c", node, SNN, cpu="3", devices=False))
    c = wait_phase(kubectl, wait, ns, "c", "Failed")
    assert c["status"]["reason"] == REASON
    assert c["status"]["message"] == MESSAGE
    assert "numalign.io/allocation" not in c["metadata"].get("annotations", {})

    def warning() -> Any:
        evs = get(kubectl, "-n", ns, "events", "--field-selector",
                  "involvedObject.name=c,type=Warning")
        return [e for e in evs["items"] if e["reason"] == REASON]

    (ev,) = wait(warning, 30, "the TopologyAffinityError event")
    assert ev["source"]["component"] == "kubelet"
    nt = wait(lambda: (n := get(kubectl, "nodetopology", node))["status"]["rejected"] == 1
              and n, 30, "rejected count 1")

    # Kill the agent (no clean shutdown) and start it again: nothing changes.
    before = {p: allocation(get(kubectl, "-n", ns, "pod", p)) for p in ("a", "b")}
    agent.kill()
    agent.start()
    wait(lambda: "restored 2 pods" in agent.log.read_text(), 60, "the agent's restore")
    for p in ("a", "b"):
        pod = get(kubectl, "-n", ns, "pod", p)
        assert pod["status"]["phase"] == "Running"
        assert allocation(pod) == before[p]
    assert get(kubectl, "-n", ns, "pod", "c")["status"]["phase"] == "Failed"
    nt = get(kubectl, "nodetopology", node)
    check_no_double_allocation(nt)
    assert set(admitted_by_pod(nt)) == {"a", "b"}
    assert nt["status"]["rejected"] == 1

    # Deleting a pod releases its resources; a new pod gets exactly those.
    kubectl("-n", ns, "delete", "pod", "a", "--wait=true", timeout=60)
    kubectl("-n", ns, "apply", "-f", "-", input=pod_manifest("d", node, SNN))
    d = wait_phase(kubectl, wait, ns, "d", "Running")
    alloc = allocation(d)
    assert alloc["numaNodes"] == [0]
    assert alloc["containers"]["main"]["cpus"] == [0, 1]
    assert alloc["containers"]["main"]["devices"] == {GPU: ["gpu0"], NIC: ["nic0"]}

    def settled() -> Any:
        n = get(kubectl, "nodetopology", node)
        return n if set(admitted_by_pod(n)) == {"b", "d"} else None

    nt = wait(settled, 30, "NodeTopology with b and d")
    check_no_double_allocation(nt)


def test_node_default_and_malformed_annotation(
        agent: Agent, kubectl: Kubectl, namespace: str, wait: Callable[..., Any]) -> None:
    node = agent.node
    wait_ready(kubectl, wait, node)
    kubectl("patch", "nodetopology", node, "--type=merge", "-p", json.dumps(
        {"spec": {"policy": "single-numa-node", "scope": "pod", "policyGeneration": 7}}))
    wait(lambda: get(kubectl, "nodetopology", node)["status"].get("observedPolicyGeneration")
         == 7, 30, "observedPolicyGeneration 7")
    ns = namespace
    kubectl("-n", ns, "apply", "-f", "-", input=pod_manifest("bad", node, '{"policy": "fast"'))
    kubectl("-n", ns, "apply", "-f", "-", input=pod_manifest("plain", node, None))
    bad = wait_phase(kubectl, wait, ns, "bad", "Running")
    wait_phase(kubectl, wait, ns, "plain", "Running")
    assert allocation(bad)["numaNodes"] in ([0], [1])

    def warning() -> Any:
        evs = get(kubectl, "-n", ns, "events", "--field-selector",
                  "involvedObject.name=bad,type=Warning")
        return evs["items"]

    (ev,) = wait(warning, 30, "the Warning event on the malformed annotation")
    assert "numalign.io/resolved" in ev["message"] and "not valid JSON" in ev["message"]
    assert "single-numa-node" in ev["message"]

    def published() -> Any:
        n = get(kubectl, "nodetopology", node)
        return n if len(n["status"].get("admitted") or []) == 2 else None

    entries = admitted_by_pod(wait(published, 30, "both pods published"))
    for name in ("bad", "plain"):
        assert entries[name]["policy"] == "single-numa-node"
        assert entries[name]["scope"] == "pod"
        assert entries[name]["source"] == "node-default"
    # A single-numa-node default now rejects what cannot be aligned.
    kubectl("-n", ns, "apply", "-f", "-", input=pod_manifest("third", node, None))
    third = wait_phase(kubectl, wait, ns, "third", "Failed")
    assert third["status"]["reason"] == REASON


NRT_CRD = Path(__file__).resolve().parents[2] / "config" / "nrt" / "crd.yaml"


def nrt_resources(obj: dict[str, Any]) -> dict[str, dict[str, dict[str, str]]]:
    """zone name -> resource name -> {capacity, allocatable, available}"""
    return {z["name"]: {r["name"]: r for r in z["resources"]} for z in obj["zones"]}


def test_publish_nrt(start_agent: StartAgent, kubectl: Kubectl, namespace: str,
                     wait: Callable[..., Any]) -> None:
    kubectl("apply", "-f", str(NRT_CRD))
    kubectl("wait", "--for", "condition=Established", "--timeout", "60s",
            "crd/noderesourcetopologies.topology.node.k8s.io")
    wait(lambda: kubectl("get", "noderesourcetopologies", check=False).returncode == 0, 30,
         "the NodeResourceTopology API to be served")
    agent = start_agent(SEED, "--publish-nrt")
    node = agent.node
    try:
        wait_ready(kubectl, wait, node)
        before = wait(lambda: get(kubectl, "noderesourcetopology", node), 30,
                      f"NodeResourceTopology {node}")
        zones = nrt_resources(before)
        assert set(zones) == {"node-0", "node-1"}
        for z in zones.values():
            assert {"cpu", "memory", GPU, NIC} <= set(z)
            assert z["cpu"]["available"] == z["cpu"]["capacity"] == "4"
            assert z[GPU]["available"] == "1"
        assert {a["name"]: a["value"] for a in before["attributes"]} == {
            "topologyManagerPolicy": "none", "topologyManagerScope": "container",
            "topologyManagerMaxNUMANodes": "64",
            "nodeTopologyPodsFingerprint": pfp.sign([]),
            "nodeTopologyPodsFingerprintMethod": "with-exclusive-resources"}
        assert before["topologyPolicies"] == ["None"]
        node_uid = get(kubectl, "node", node)["metadata"]["uid"]
        assert before["metadata"]["ownerReferences"][0]["uid"] == node_uid

        # A pod takes 2 CPUs, a GPU and a NIC of one zone: available goes down there.
        kubectl("-n", namespace, "apply", "-f", "-", input=pod_manifest("a", node, SNN))
        pod = wait_phase(kubectl, wait, namespace, "a", "Running")
        zone = f"node-{allocation(pod)['numaNodes'][0]}"

        def updated() -> Any:
            obj = get(kubectl, "noderesourcetopology", node)
            return obj if nrt_resources(obj)[zone]["cpu"]["available"] == "2" else None

        updated_obj = wait(updated, 30, "NRT available CPUs to go down")
        after = nrt_resources(updated_obj)
        # the pod set the scheduler's reserve-aware cache checks: a holds exclusive CPUs
        attrs = {a["name"]: a["value"] for a in updated_obj["attributes"]}
        assert attrs["nodeTopologyPodsFingerprint"] == pfp.sign([(namespace, "a")])
        assert after[zone][GPU]["available"] == "0"
        assert after[zone][NIC]["available"] == "0"
        other = "node-1" if zone == "node-0" else "node-0"
        assert after[other]["cpu"]["available"] == "4"
        mem = after[zone]["memory"]
        assert mem["available"] != mem["capacity"]

        # The node default policy pushed into NodeTopology.spec shows as the attributes.
        kubectl("patch", "nodetopology", node, "--type=merge", "-p", json.dumps(
            {"spec": {"policy": "single-numa-node", "scope": "pod", "policyGeneration": 1}}))

        def attributes() -> Any:
            obj = get(kubectl, "noderesourcetopology", node)
            got = {a["name"]: a["value"] for a in obj["attributes"]}
            return got if got["topologyManagerPolicy"] == "single-numa-node" else None

        got = wait(attributes, 30, "NRT attributes to follow the node default")
        assert {k: got[k] for k in ("topologyManagerPolicy", "topologyManagerScope")} == {
            "topologyManagerPolicy": "single-numa-node", "topologyManagerScope": "pod"}
    finally:
        kubectl("delete", "noderesourcetopology", node, "--ignore-not-found", check=False)


DGX = MACHINES / "dgx-a100-like.yaml"
HCA = "nvidia.com/hca"


def gpu_pod(name: str, node: str, gpus: str) -> str:
    res = {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2", HCA: "1"}
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "annotations": {"numalign.io/resolved": SNN,
                                                   "numalign.io/gpus": gpus}},
        "spec": {"nodeName": node, "containers": [
            {"name": "main", "image": "registry.k8s.io/pause:3.10",
             "resources": {"requests": res, "limits": res}}]},
    })


def test_gpu_groups_end_to_end(start_agent: StartAgent, kubectl: Kubectl, namespace: str,
                               wait: Callable[..., Any]) -> None:
    from numalign.topology.machine import load_machine

    machine = load_machine(DGX)
    devices = {d.id: d for d in machine.devices}
    agent = start_agent(DGX)
    node = agent.node
    wait_ready(kubectl, wait, node)
    ns = namespace
    want = [{"count": 2, "sameGroup": "pcie", "withResource": HCA}]
    kubectl("-n", ns, "apply", "-f", "-", input=gpu_pod("train", node, json.dumps(want)))
    pod = wait_phase(kubectl, wait, ns, "train", "Running")
    alloc = allocation(pod)
    (pair,) = alloc["gpus"].values()
    assert len(pair) == 2
    (pcie,) = {devices[g].group("pcie") for g in pair}
    (numa,) = {devices[g].numa_node for g in pair}
    main = alloc["containers"]["main"]
    assert sorted(main["devices"]["nvidia.com/gpu"]) == sorted(pair)
    (nic,) = main["devices"][HCA]
    assert devices[nic].group("pcie") == pcie
    assert alloc["numaNodes"] == [numa]
    assert len(main["cpus"]) == 4
    assert {machine.cpus[c].numa for c in main["cpus"]} == {numa}

    def published() -> Any:
        n = get(kubectl, "nodetopology", node)
        return n if "train" in admitted_by_pod(n) else None

    entry = admitted_by_pod(wait(published, 30, "the GPU pod in NodeTopology status"))["train"]
    assert entry["gpus"] == alloc["gpus"]
    assert entry["numaNodes"] == [numa]

    # A malformed numalign.io/gpus is the user's error: refused, nothing allocated.
    bad = json.dumps([{"count": 0, "sameGroup": "pcie"}])
    kubectl("-n", ns, "apply", "-f", "-", input=gpu_pod("broken", node, bad))
    broken = wait_phase(kubectl, wait, ns, "broken", "Failed")
    assert broken["status"]["reason"] == EVENT_INVALID_GPU
    assert "numalign.io/gpus[0].count" in broken["status"]["message"]
    assert "numalign.io/allocation" not in broken["metadata"].get("annotations", {})

    def warning() -> Any:
        evs = get(kubectl, "-n", ns, "events", "--field-selector",
                  "involvedObject.name=broken,type=Warning")
        return [e for e in evs["items"] if e["reason"] == EVENT_INVALID_GPU]

    (ev,) = wait(warning, 30, "the InvalidGpuRequest event")
    assert "numalign.io/gpus[0].count" in ev["message"]
    nt = get(kubectl, "nodetopology", node)
    assert set(admitted_by_pod(nt)) == {"train"}
    assert nt["status"]["rejected"] == 0


def test_out_of_cpu_like_the_kubelet(agent: Agent, kubectl: Kubectl, namespace: str,
                                     wait: Callable[..., Any]) -> None:
    """Pods bound with spec.nodeName bypass the scheduler's fit check; the node's own check
    (after the Topology Manager) fails the one that does not fit, as the kubelet does."""
    node, ns = agent.node, namespace
    wait_ready(kubectl, wait, node)
    for name in ("a", "b"):
        kubectl("-n", ns, "apply", "-f", "-",
                input=pod_manifest(name, node, SNN, cpu="3500m", devices=False))
        wait_phase(kubectl, wait, ns, name, "Running")
    kubectl("-n", ns, "apply", "-f", "-",
            input=pod_manifest("c", node, SNN, cpu="2", devices=False))
    c = wait_phase(kubectl, wait, ns, "c", "Failed")
    message = ("Node didn't have enough resource: cpu, requested: 2000, used: 7000, "
               "capacity: 8000")
    assert c["status"]["reason"] == "OutOfcpu"
    assert c["status"]["message"] == "Pod was rejected: " + message
    assert "numalign.io/allocation" not in c["metadata"].get("annotations", {})

    def warning() -> Any:
        evs = get(kubectl, "-n", ns, "events", "--field-selector",
                  "involvedObject.name=c,type=Warning")
        return [e for e in evs["items"] if e["reason"] == "OutOfcpu"]

    (ev,) = wait(warning, 30, "the OutOfcpu event")
    assert ev["message"] == message and ev["source"]["component"] == "kubelet"
