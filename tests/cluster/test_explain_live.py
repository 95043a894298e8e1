"""`numalign explain POD` on a real API server with an emulated node agent: the replay
reads the pod, its node's NodeTopology and the other pods' allocations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import testdata

pytestmark = pytest.mark.cluster

MACHINES = testdata.MACHINES
SEED = MACHINES / "seed-figure1.yaml"
GPU = "gpu-vendor.com/gpu"
NIC = "nic-vendor.com/nic"
SNN = json.dumps({"policy": "single-numa-node", "scope": "pod", "options": {},
                  "source": "TopologyPolicy/explain-test"})

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def node(kubeconfig: Path, kubectl: Kubectl, tmp_path: Path,
         wait: Callable[..., Any]) -> Iterator[str]:
    """One emulated seed-figure1 node, Ready with its NodeTopology."""
    index = 100 + uuid.uuid4().int % 9000
    name = f"{SEED.stem}-{index}"
    log = tmp_path / "agent.log"
    out = log.open("ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "numalign.cli", "agent", "--kubeconfig", str(kubeconfig),
         "--emulate", f"{SEED}=1", "--start", str(index), "--publish-interval", "0.3"],
        stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))
    try:
        def ready() -> bool:
            nt = _get(kubectl, "nodetopology", name)
            return bool(nt and (nt.get("status") or {}).get("zones"))

        wait(ready, 60, f"NodeTopology {name} published")
        yield name
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        out.close()
        for args in (("node", name), ("nodetopology", name)):
            kubectl("delete", *args, "--ignore-not-found", "--wait=false", check=False)
        kubectl("-n", "kube-node-lease", "delete", "lease", name, "--ignore-not-found",
                check=False)
        if log.exists():
            sys.stderr.write(log.read_text()[-3000:])


def _get(kubectl: Kubectl, *args: str) -> Any:
    proc = kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def _pod(name: str, node: str, cpu: str, resolved: str | None = SNN) -> str:
    res = {"cpu": cpu, "memory": "200Mi", GPU: "1", NIC: "1"}
    meta: dict[str, Any] = {"name": name}
    if resolved is not None:
        meta["annotations"] = {"numalign.io/resolved": resolved}
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node, "containers": [
            {"name": "main", "image": "registry.k8s.io/pause:3.10",
             "resources": {"requests": res, "limits": res}}]}})


def _explain(kubeconfig: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "numalign.cli", "explain", *args,
                           "--kubeconfig", str(kubeconfig)],
                          capture_output=True, text=True, timeout=60, check=False)


def _phase(kubectl: Kubectl, wait: Callable[..., Any], ns: str, name: str,
           phase: str) -> dict[str, Any]:
    def check() -> Any:
        pod = _get(kubectl, "-n", ns, "pod", name)
        return pod if pod and (pod.get("status") or {}).get("phase") == phase else None

    got: dict[str, Any] = wait(check, 60, f"pod {name} {phase}")
    return got


def test_explain_live_replays_admitted_and_rejected_pods(
        node: str, kubeconfig: Path, kubectl: Kubectl, namespace: str,
        wait: Callable[..., Any]) -> None:
    ns = namespace
    for name in ("a", "b"):
        kubectl("-n", ns, "apply", "-f", "-", input=_pod(name, node, "2"))
        _phase(kubectl, wait, ns, name, "Running")

    def both_published() -> bool:
        nt = _get(kubectl, "nodetopology", node)
        return len((nt.get("status") or {}).get("admitted") or []) == 2

    wait(both_published, 30, "both pods in NodeTopology status")

    # a: replayed against the node without itself (b holds node 1): node 0, as recorded.
    proc = _explain(kubeconfig, "a", "-n", ns, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["node"] == node and doc["machine"] == node
    assert doc["policy"] == "single-numa-node" and doc["scope"] == "pod"
    assert doc["source"] == "TopologyPolicy/explain-test"
    assert doc["admit"] is True and doc["hint"] == {"numaNodes": [0], "preferred": True}
    (d,) = doc["decisions"]
    assert d["unit"] == "pod"
    assert {p["resource"] for p in d["providers"]} == {"cpu", "memory", GPU, NIC}
    assert d["winner"] == {"numaNodes": [0], "preferred": True}
    recorded = doc["recorded"]
    assert recorded["numaNodes"] == [0]
    main = doc["allocation"]["containers"]["main"]
    assert main["cpus"] == recorded["containers"]["main"]["cpus"] == [0, 1]
    assert main["devices"] == {GPU: ["gpu0"], NIC: ["nic0"]}
    assert not any("changed since" in n for n in doc["notes"])

    # b: a holds node 0's GPU and NIC, so node 1 is the only preferred mask.
    proc = _explain(kubeconfig, "b", "-n", ns)
    assert proc.returncode == 0, proc.stderr
    assert "Winner: NUMA nodes {1}, preferred" in proc.stdout
    assert "it is the only mask they all prefer" in proc.stdout
    assert f"node {node}" in proc.stdout

    # c: 3 CPUs fit no single NUMA node any more: rejected, and explained as such.
    kubectl("-n", ns, "apply", "-f", "-", input=_pod("c", node, "3"))
    _phase(kubectl, wait, ns, "c", "Failed")
    proc = _explain(kubeconfig, "c", "-n", ns, "-o", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["admit"] is False and doc["reason"] == "TopologyAffinityError"
    assert "single-numa-node admits only preferred hints" in doc["decisions"][0]["admitWhy"]
    assert any("TopologyAffinityError" in n for n in doc["notes"])

    # What if best-effort: the merge admits, but a and b hold both GPUs, so the device
    # manager cannot allocate one (the kubelet's UnexpectedAdmissionError).
    proc = _explain(kubeconfig, "c", "-n", ns, "--policy", "best-effort", "-o", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["source"] == "command line (what if)" and doc["policy"] == "best-effort"
    assert doc["decisions"][0]["admit"] is True
    assert doc["admit"] is False and doc["reason"] == "UnexpectedAdmissionError", doc


def test_explain_live_errors(node: str, kubeconfig: Path, kubectl: Kubectl,
                             namespace: str) -> None:
    proc = _explain(kubeconfig, "nope", "-n", namespace)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "not found" in proc.stderr
    assert "Traceback" not in proc.stderr

    # Bound to a node that has no NodeTopology (no agent there).
    kubectl("-n", namespace, "apply", "-f", "-",
            input=_pod("orphan", f"no-agent-{uuid.uuid4().hex[:6]}", "1", resolved=None))
    proc = _explain(kubeconfig, "orphan", "-n", namespace)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "has no NodeTopology" in proc.stderr
