"""The numalign-managed real node (``numalign dev up --real-node --nri``): the kubelet's
CPU, memory and Topology managers at ``none``, the Node labelled ``numalign.io/managed=nri``
and numalign's agent placing each container through containerd's NRI socket, under the
policy its pod resolves to (issue 13)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import ssl
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from e2e_helpers import MACHINES, node_topology, wait_for
from numalign.api.wire import LABEL_MANAGED, MANAGED_NRI
from numalign.commands import dev

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def nri_node(dev_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real kubelet and containerd in nri mode (``numalign dev up --real-node --nri``) in
    the session's cluster for this module's tests, seeing ``realnode-2numa`` (this
    machine's first two CPUs as two NUMA nodes, CPU 0 reserved); removed after them.
    Skipped only where containers cannot run."""
    from numalign.devcluster.realnode import RealNode, cannot_run_containers

    reason = cannot_run_containers()
    if reason is not None:
        pytest.skip(f"this machine cannot run containers: {reason}")
    node = RealNode(dev_cluster, MACHINES / "realnode-2numa.yaml", mode="nri")
    logs = tmp_path_factory.mktemp("realnode-nri-logs")
    try:
        node.up(log=lambda m: print(f"[realnode-nri] {m}", flush=True), timeout=300)
        yield node
    finally:
        if (node.dir / "logs").is_dir():
            shutil.copytree(node.dir / "logs", logs, dirs_exist_ok=True)
            print(f"[realnode-nri] its logs are kept in {logs}", flush=True)
        node.down(log=lambda m: print(f"[realnode-nri] {m}", flush=True))


def _configz(node: Any) -> dict[str, Any]:
    """The running kubelet's configuration (its /configz; the kubelet listens on loopback,
    which the API server's node proxy refuses, so it is asked directly, with a client
    certificate the cluster's CA signed)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the kubelet's self-signed serving certificate
    ctx.load_cert_chain(str(node.dir / "kubelet-client.crt"), str(node.dir / "kubelet-client.key"))
    port = node.state()["ports"]["kubelet"]
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/configz", context=ctx,
                                timeout=10) as r:
        doc: dict[str, Any] = json.loads(r.read())["kubeletconfig"]
    return doc


def _agent_has_nri(node: Any) -> bool:
    return bool(node._supports("agent", needle="--nri-socket"))


def test_nri_mode_brings_the_node_up_managed_by_numalign(
        nri_node: Any, core: client.CoreV1Api, k8s_client: Any) -> None:
    configz = _configz(nri_node)
    assert configz["cpuManagerPolicy"] == "none"
    assert configz["memoryManagerPolicy"] == "None"
    assert configz["topologyManagerPolicy"] == "none"
    assert configz["reservedSystemCPUs"] == nri_node.state()["reservedCPUs"]
    # Its CPU manager holds no assignment of its own.
    state = json.loads((nri_node.kubelet_dir / "cpu_manager_state").read_text())
    assert state["policyName"] == "none" and not state.get("entries")

    node = core.read_node("localhost")
    assert (node.metadata.labels or {}).get(LABEL_MANAGED) == MANAGED_NRI
    assert nri_node.state()["mode"] == "nri"

    # The agent runs, publishes the node's NodeTopology, and was handed containerd's NRI
    # socket where this numalign's agent can take it.
    assert nri_node.process("agent").is_running()
    argv = nri_node.state()["commands"]["agent"]["argv"]
    assert argv[argv.index("--node") + 1] == "localhost"
    if _agent_has_nri(nri_node):
        assert argv[argv.index("--nri-socket") + 1] == str(nri_node.nri_socket)
    else:
        assert "--nri-socket" not in argv
    assert nri_node.nri_socket.is_socket()  # containerd serves NRI there
    wait_for(lambda: ((node_topology(k8s_client, "localhost") or {}).get("status") or {})
             .get("zones"), 90, "the agent to publish NodeTopology localhost")

    # dev status says which mode the node runs in.
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        dev.main(["status", "--state-dir", str(nri_node.cluster.state_dir)])
    assert "real node localhost: mode nri" in out.getvalue()
