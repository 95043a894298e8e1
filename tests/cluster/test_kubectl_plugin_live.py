"""``kubectl numalign`` against the real API server, with an emulated node: through the
installed ``kubectl-numalign`` script and through ``kubectl numalign`` (kubectl finds the
plugin on PATH)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

import testdata
from agent_helpers import StartAgent

pytestmark = pytest.mark.cluster

SEED = testdata.MACHINES / "seed-figure1.yaml"
SNN = json.dumps({"policy": "single-numa-node", "scope": "pod", "options": {},
                  "source": "TopologyPolicy/plugin-test"})
BIN = Path(sys.executable).parent  # where the package's scripts are installed

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def pod(name: str, cpu: str, node: str | None = None,
        selector: dict[str, str] | None = None) -> str:
    res = {"cpu": cpu, "memory": "200Mi"}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                            "resources": {"requests": res, "limits": res}}]}
    if node:
        spec["nodeName"] = node
    if selector:
        spec["nodeSelector"] = selector
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "annotations": {"numalign.io/resolved": SNN}},
                       "spec": spec})


def plugin(kubeconfig: Path, *args: str, via_kubectl: bool = False,
           check: bool = True) -> subprocess.CompletedProcess[str]:
    """The plugin as a user runs it: the installed script, or ``kubectl numalign`` with
    the script's directory on PATH (KUBECONFIG from the environment, as kubectl's)."""
    env = dict(os.environ, KUBECONFIG=str(kubeconfig),
               PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    argv = ["kubectl", "numalign", *args] if via_kubectl else [
        str(BIN / "kubectl-numalign"), *args]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60,
                          check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def test_plugin_nodes_why_explain(start_agent: StartAgent, kubectl: Kubectl,
                                  kubeconfig: Path, namespace: str,
                                  wait: Callable[..., Any]) -> None:
    assert (BIN / "kubectl-numalign").is_file() and shutil.which("kubectl")
    agent = start_agent(SEED)
    node = agent.node

    def nt() -> Any:
        p = kubectl("get", "nodetopology", node, "-o", "json", check=False)
        return json.loads(p.stdout) if p.returncode == 0 else None

    wait(lambda: (nt() or {}).get("status", {}).get("zones"), 60, f"NodeTopology {node}")
    kubectl("-n", namespace, "apply", "-f", "-", input=pod("fits", "2", node))
    kubectl("-n", namespace, "apply", "-f", "-", input=pod("big", "8", node))
    kubectl("-n", namespace, "apply", "-f", "-",
            input=pod("nowhere", "1", selector={"numalign.io/test-no-such-node": "x"}))

    def phases() -> dict[str, str]:
        items = json.loads(kubectl("-n", namespace, "get", "pods", "-o", "json").stdout)
        return {p["metadata"]["name"]: p["status"].get("phase", "") for p in items["items"]}

    wait(lambda: phases().get("fits") == "Running" and phases().get("big") == "Failed", 60,
         "the agent to admit fits and reject big")
    wait(lambda: len((nt() or {}).get("status", {}).get("admitted") or []) == 1, 30,
         "the admission published")

    # nodes: the script, -o json, as NodeTopology status says
    rows = json.loads(plugin(kubeconfig, "nodes", node, "-o", "json").stdout)["nodes"]
    [row] = rows
    status = nt()["status"]
    assert row["name"] == node and row["policy"] == "none" and row["pods"] == 1
    assert [z["cpu"]["free"] for z in row["zones"]] == [
        z["available"]["cpu"] for z in status["zones"]]
    assert sorted(z["cpu"]["free"] for z in row["zones"]) == [2, 4]
    # through kubectl, the table; wide adds the node's readiness
    table = plugin(kubeconfig, "nodes", node, "-o", "wide", via_kubectl=True).stdout
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["NODE", "POLICY", "NUMA"]
    assert lines[1].split()[0] == node and lines[1].split()[-1] == "True"

    # why: the rejected pod, its rejection, its events, the node that cannot fit it
    why = json.loads(plugin(kubeconfig, "why", "big", "-n", namespace, "-o", "json",
                            via_kubectl=True).stdout)
    assert why["phase"] == "Failed" and why["node"] == node
    assert why["resolved"]["policy"] == "single-numa-node"
    assert why["rejection"]["reason"] == "TopologyAffinityError"
    assert node in why["unfit"]

    def agent_event() -> bool:
        got = json.loads(plugin(kubeconfig, "why", "big", "-n", namespace, "-o",
                                "json").stdout)
        return any(e["reason"] == "TopologyAffinityError" for e in got["events"])

    wait(agent_event, 30, "the agent's Warning event on big")
    text = plugin(kubeconfig, "why", "big", "--namespace", namespace).stdout
    assert f"Pod {namespace}/big: Failed on node {node}" in text
    assert "Rejected:   TopologyAffinityError" in text and node in text

    # why: the scheduler's message for a pod no node selects
    def scheduler_said() -> list[str]:
        got = yaml.safe_load(plugin(kubeconfig, "why", "nowhere", "-n", namespace, "-o",
                                    "yaml", via_kubectl=True).stdout)
        return list(got["scheduler"])

    said = wait(scheduler_said, 60, "the scheduler's FailedScheduling event")
    assert any("node(s) didn't match" in m or "nodes are available" in m for m in said)

    # why without a pod: the namespace's Pending and Failed pods (-A: every namespace)
    listed = plugin(kubeconfig, "why", "-n", namespace).stdout.splitlines()
    assert listed[0].split() == ["NAMESPACE", "POD", "PHASE", "REASON", "NODE"]
    assert {ln.split()[1] for ln in listed[1:]} == {"big", "nowhere"}
    everywhere = json.loads(plugin(kubeconfig, "why", "-A", "-o", "json").stdout)["pods"]
    assert {("big", "TopologyAffinityError"), ("nowhere", "Unschedulable")} <= {
        (p["pod"], p["reason"]) for p in everywhere if p["namespace"] == namespace}

    # explain: numalign explain's replay, with --context naming the kubeconfig's context
    ctx = kubectl("config", "current-context").stdout.strip()
    ex = json.loads(plugin(kubeconfig, "explain", "fits", "-n", namespace, "--context", ctx,
                           "-o", "json", via_kubectl=True).stdout)
    assert ex["admit"] is True and ex["node"] == node
    ex_text = plugin(kubeconfig, "explain", "big", "-n", namespace).stdout
    assert "reject" in ex_text.lower()


def test_plugin_errors_are_one_line(kubeconfig: Path, namespace: str) -> None:
    missing = plugin(kubeconfig, "why", "ghost", "-n", namespace, check=False)
    assert missing.returncode == 1
    assert missing.stderr.strip() == (f"kubectl numalign: pod {namespace}/ghost not found: "
                                      "check the name and the namespace (-n NAMESPACE)")
    bad_ctx = plugin(kubeconfig, "nodes", "--context", "no-such-context", via_kubectl=True,
                     check=False)
    assert bad_ctx.returncode == 1 and "Traceback" not in bad_ctx.stderr
    assert "cannot load the Kubernetes credentials" in bad_ctx.stderr
    no_nt = plugin(kubeconfig, "nodes", "no-such-node", check=False)
    assert no_nt.returncode == 1 and "no NodeTopology for node no-such-node" in no_nt.stderr
