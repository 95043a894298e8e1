"""``numalign dev up --dra`` as a user runs it (a control plane of its own, an emulated
node of NVLink pairs): the node advertises no GPUs as extended resources, its GPUs are
the emulated driver's ResourceSlices with the DeviceClass installed, and the DRA samples
applied as they are get the sample pod's claim allocated (one NVLink pair) and bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

import testdata

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
MACHINE = testdata.MACHINES / "group4-gpu.yaml"
DRIVER = "emulated.numalign.io"


def _numalign(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "numalign.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"})


def _kubectl(state: Path, *args: str) -> Any:
    proc = subprocess.run(["kubectl", "--kubeconfig", str(state / "kubeconfig"), *args],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout) if "-o" in args else proc.stdout


def test_dev_up_dra_runs_the_emulated_nodes_as_a_dra_driver() -> None:
    state = Path(tempfile.mkdtemp(prefix="numalign-dra-"))
    try:
        proc = _numalign("dev", "up", "--state-dir", str(state), "--no-operator",
                         "--no-extender", "--dra", "--machine", str(MACHINE))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert ("DeviceClasses of the emulated driver installed: "
                "gpu.nvidia.com.emulated.numalign.io") in proc.stderr
        node = _kubectl(state, "get", "node", "group4-gpu-0", "-o", "json")
        assert "nvidia.com/gpu" not in node["status"]["capacity"]
        slices = _kubectl(state, "get", "resourceslices", "-o", "json")["items"]
        assert [(s["spec"]["driver"], s["spec"]["nodeName"]) for s in slices] == [
            (DRIVER, "group4-gpu-0")]
        assert sorted(d["name"] for d in slices[0]["spec"]["devices"]) == [
            "gpu0", "gpu1", "gpu2", "gpu3"]

        _kubectl(state, "apply", "-f", str(REPO / "config/samples/dra/gpu-claims.yaml"))
        deadline = time.monotonic() + 60
        while True:
            pod = _kubectl(state, "get", "pod", "nvlink-pair", "-o", "json")
            claims = _kubectl(state, "get", "resourceclaims", "-o", "json")["items"]
            alloc = [c["status"]["allocation"] for c in claims
                     if (c.get("status") or {}).get("allocation")]
            if pod["spec"].get("nodeName") and alloc:
                break
            assert time.monotonic() < deadline, f"not allocated and bound: {pod}, {claims}"
            time.sleep(0.5)
        assert pod["spec"]["nodeName"] == "group4-gpu-0"
        got = sorted(r["device"] for r in alloc[0]["devices"]["results"])
        assert got in (["gpu0", "gpu1"], ["gpu2", "gpu3"])  # one NVLink pair
    finally:
        down = _numalign("dev", "down", "--state-dir", str(state), timeout=120)
        assert down.returncode == 0, down.stderr[-3000:]
