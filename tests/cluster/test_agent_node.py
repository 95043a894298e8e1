"""``numalign agent --node``: discovery from a sysfs dump, NodeTopology published, node
default policy acknowledged."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import testdata

pytestmark = pytest.mark.cluster

SYSFS = testdata.SYSFS
DUMP = "16amd64-8n2c"

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def test_real_node_publishes_discovered_topology(
        kubeconfig: Path, kubectl: Kubectl, wait: Callable[..., Any], tmp_path: Path) -> None:
    with tarfile.open(SYSFS / f"{DUMP}.tar.bz2") as tar:
        tar.extractall(tmp_path / "root", filter="data")
    roots = [p.parent.parent for p in (tmp_path / "root").rglob("sys/devices")]
    assert roots, "the dump holds no sys/devices"
    expected = json.loads((SYSFS / f"{DUMP}.expected.json").read_text())
    name = f"real-{uuid.uuid4().hex[:6]}"
    log, log2 = tmp_path / "agent.log", tmp_path / "agent2.log"
    second: subprocess.Popen[bytes] | None = None
    proc = subprocess.Popen(
        [sys.executable, "-m", "numalign.cli", "agent", "--kubeconfig", str(kubeconfig),
         "--node", name, "--root", str(roots[0])],
        stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        def nt() -> Any:
            p = kubectl("get", "nodetopology", name, "-o", "json", check=False)
            doc = json.loads(p.stdout) if p.returncode == 0 else None
            return doc if doc and doc.get("status", {}).get("zones") else None

        doc = wait(nt, 60, "the node's NodeTopology")
        zones = doc["status"]["zones"]
        assert sorted(str(z["id"]) for z in zones) == sorted(expected["numaNodes"])
        assert doc["status"]["admitted"] == []
        kubectl("patch", "nodetopology", name, "--type=merge", "-p",
                json.dumps({"spec": {"policy": "restricted", "policyGeneration": 3}}))
        wait(lambda: (nt() or {}).get("status", {}).get("observedPolicyGeneration") == 3, 30,
             "observedPolicyGeneration 3")
        # A second agent for the same node stands by: the node's Lease is held.
        lease = json.loads(kubectl("get", "lease", "-n", "default", f"numalign-agent-{name}",
                                   "-o", "json").stdout)
        assert lease["spec"]["holderIdentity"]
        second = subprocess.Popen(
            [sys.executable, "-m", "numalign.cli", "agent", "--kubeconfig", str(kubeconfig),
             "--node", name, "--root", str(roots[0])],
            stdout=log2.open("wb"), stderr=subprocess.STDOUT)
        wait(lambda: "standing by" in log2.read_text(), 60, "the second agent to stand by")
        assert second.poll() is None
    finally:
        for p in (proc, second):
            if p is not None:
                p.terminate()
                p.wait(15)
        kubectl("delete", "nodetopology", name, "--ignore-not-found", check=False)
        kubectl("delete", "lease", "-n", "default", f"numalign-agent-{name}",
                "--ignore-not-found", check=False)
        sys.stderr.write(log.read_text()[-3000:])
