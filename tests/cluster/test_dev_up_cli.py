"""``numalign dev up`` as a user runs it (a control plane of its own, two emulated nodes):
it returns once the nodes' NodeTopologies are published, ``dev status`` prints each
component's /metrics URL, the agent serves the kubelet's manager metrics for the pods it
admits, and no command leaves an unclosed HTTP session behind."""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import testdata

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
SEED = testdata.MACHINES / "seed-figure1.yaml"
LEAKS = ("Unclosed client session", "Unclosed connector", "Traceback")


def _numalign(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "numalign.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"})
    for leak in LEAKS:
        assert leak not in proc.stderr, f"numalign {' '.join(args)}:\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def up() -> Iterator[tuple[Path, str]]:
    """``numalign dev up --no-operator --machine seed-figure1.yaml=2`` in a state dir of its
    own; (state dir, stderr); ``dev down`` after."""
    state = Path(tempfile.mkdtemp(prefix="numalign-up-"))
    try:
        proc = _numalign("dev", "up", "--state-dir", str(state), "--no-operator",
                         "--machine", f"{SEED}=2")
        assert proc.returncode == 0, proc.stderr[-3000:]
        yield state, proc.stderr
    finally:
        down = _numalign("dev", "down", "--state-dir", str(state), timeout=120)
        assert down.returncode == 0, down.stderr[-3000:]


def _kubectl(state: Path, *args: str, stdin: str | None = None) -> str:
    proc = subprocess.run(["kubectl", "--kubeconfig", str(state / "kubeconfig"), *args],
                          input=stdin, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def _scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_dev_up_returns_with_the_nodetopologies_published(up: tuple[Path, str]) -> None:
    state, err = up
    assert "2 emulated node(s) Ready, NodeTopologies published" in err
    # at once, no waiting: kubectl get nt lists both with their status
    doc = json.loads(_kubectl(state, "get", "nt", "-o", "json"))
    published = {i["metadata"]["name"] for i in doc["items"]
                 if (i.get("status") or {}).get("zones")}
    assert published == {"seed-figure1-0", "seed-figure1-1"}


def test_dev_status_prints_metrics_urls_the_agent_serves(up: tuple[Path, str]) -> None:
    state, _ = up
    status = _numalign("dev", "status", "--state-dir", str(state))
    assert status.returncode == 0, status.stderr
    urls: dict[str, str] = {}
    component = ""
    for line in status.stdout.splitlines():
        words = line.split()
        if len(words) >= 2 and words[1] in ("running", "stopped"):
            component = words[0]
        elif words[:1] == ["metrics"]:
            urls[component] = words[1]
    assert set(urls) == {"etcd", "kube-apiserver", "kube-controller-manager",
                         "kube-scheduler", "agent", "extender"}, status.stdout
    assert urls["kube-apiserver"].startswith("https://127.0.0.1:")
    agent = urls["agent"]
    assert agent.startswith("http://127.0.0.1:") and agent.endswith("/metrics")
    # etcd answers only a client certificate of its own CA (the API server's)
    pki = state / "pki"
    etcd = ssl.create_default_context(cafile=pki / "etcd-ca.crt")
    etcd.load_cert_chain(pki / "apiserver-etcd-client.crt", pki / "apiserver-etcd-client.key")
    with urllib.request.urlopen(urls["etcd"], timeout=10, context=etcd) as r:
        assert b"etcd_server_has_leader" in r.read()

    got = _scrape(agent)

    def value(name: str, **labels: str) -> float:
        return got[(name, frozenset(labels.items()))]

    for node in ("seed-figure1-0", "seed-figure1-1"):
        assert value("numalign_agent_node_info", node=node, mode="emulated") == 1
    req = "numalign_topology_manager_admission_requests_total"
    before = value(req, node="seed-figure1-0", policy="none")

    # a Guaranteed 2-CPU pod bound to seed-figure1-0: one admission, two pinned CPUs
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "pinned", "namespace": "default"},
           "spec": {"nodeName": "seed-figure1-0", "containers": [{
               "name": "c", "image": "pause",
               "resources": {"limits": {"cpu": "2", "memory": "64Mi"}}}]}}
    _kubectl(state, "apply", "-f", "-", stdin=json.dumps(pod))
    deadline = time.monotonic() + 60
    while _kubectl(state, "get", "pod", "pinned", "-o",
                   "jsonpath={.status.phase}") != "Running":
        assert time.monotonic() < deadline, "the pod not Running"
        time.sleep(0.5)
    got = _scrape(agent)
    assert value(req, node="seed-figure1-0", policy="none") == before + 1
    assert value(req, node="seed-figure1-1", policy="none") == 0
    assert value("numalign_cpu_manager_pinning_requests_total",
                 node="seed-figure1-0", policy="none") == 1
    assert value("numalign_cpu_manager_exclusive_cpu_allocation_count",
                 node="seed-figure1-0", policy="none") == 2
    assert value("numalign_cpu_manager_shared_pool_size_millicores",
                 node="seed-figure1-0") == 6000
