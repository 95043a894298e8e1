"""The real node's configuration files: what containerd and the kubelet are told (the
e2e tests in tests/e2e/test_realnode_e2e.py run them)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import NameOID

from numalign.devcluster import certs
from numalign.devcluster.cluster import DevCluster
from numalign.devcluster.images import PAUSE_IMAGE
from numalign.devcluster.realnode import RealNode, RealNodeError
from numalign.devcluster.realnode_config import TAINT


def _node(tmp_path: Path) -> RealNode:
    cluster = DevCluster(tmp_path / "state", name="t")
    certs.generate(cluster.pki.dir)
    node = RealNode(cluster, None)
    node.dir.mkdir(parents=True)
    return node


def test_containerd_config_keeps_everything_under_the_state_dir(tmp_path: Path) -> None:
    node = _node(tmp_path)
    node._write_containerd_config()
    cfg = tomllib.loads((node.containerd_dir / "config.toml").read_text())
    assert cfg["version"] == 3
    base = str(node.dir) + "/"
    assert cfg["grpc"]["address"] == str(node.containerd_socket)
    for path in (cfg["root"], cfg["state"], cfg["grpc"]["address"], cfg["ttrpc"]["address"]):
        assert path.startswith(base)
    plugins = cfg["plugins"]
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["cni"]["conf_dir"].startswith(base)
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["runtime_type"] == "io.containerd.runc.v2"
    assert runc["options"]["Root"].startswith(base)
    assert runc["options"]["BinaryName"].endswith("/runc")
    nri = plugins["io.containerd.nri.v1.nri"]
    assert nri["disable"] is False and nri["socket_path"].startswith(base)
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == PAUSE_IMAGE
    assert plugins["io.containerd.grpc.v1.cri"]["stream_server_address"] == "127.0.0.1"
    cni = json.loads((node.containerd_dir / "cni/conf/10-numalign.conflist").read_text())
    bridge = cni["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["bridge"] == node.bridge
    assert len(node.bridge) <= 15  # a Linux interface name
    assert bridge["ipam"]["dataDir"].startswith(base)


def test_kubelet_config_static_cpus_topology_policy_loopback(tmp_path: Path) -> None:
    node = _node(tmp_path)
    node._write_kubelet_files({"kubelet": 40001, "healthz": 40002}, "restricted", "pod", "3")
    cfg = yaml.safe_load(node.kubelet_config.read_text())
    assert cfg["kind"] == "KubeletConfiguration"
    assert (cfg["address"], cfg["port"], cfg["healthzBindAddress"]) == ("127.0.0.1", 40001,
                                                                         "127.0.0.1")
    assert cfg["readOnlyPort"] == 0
    assert cfg["cpuManagerPolicy"] == "static" and cfg["reservedSystemCPUs"] == "3"
    assert (cfg["topologyManagerPolicy"], cfg["topologyManagerScope"]) == ("restricted", "pod")
    assert cfg["failCgroupV1"] is False
    assert cfg["containerRuntimeEndpoint"] == f"unix://{node.containerd_socket}"
    assert cfg["cgroupRoot"] == node.cgroup_root
    assert cfg["registerWithTaints"] == [TAINT]
    assert cfg["authentication"]["anonymous"]["enabled"] is False
    assert cfg["authentication"]["x509"]["clientCAFile"] == str(node.cluster.pki.ca.cert)
    # The kubelet's identity: system:node:<name> in system:nodes, signed by the cluster CA.
    kc = yaml.safe_load((node.dir / "kubelet.kubeconfig").read_text())
    assert kc["users"][0]["name"] == "system:node:localhost"
    cert = x509.load_pem_x509_certificate((node.dir / "kubelet-client.crt").read_bytes())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == \
        "system:node:localhost"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == \
        "system:nodes"
    ca = x509.load_pem_x509_certificate(node.cluster.pki.ca.cert.read_bytes())
    assert cert.issuer == ca.subject


def test_two_clusters_get_their_own_bridge_and_cgroup_root(tmp_path: Path) -> None:
    a = RealNode(DevCluster(tmp_path / "a"), None)
    b = RealNode(DevCluster(tmp_path / "b"), None)
    assert a.bridge != b.bridge and a.cgroup_root != b.cgroup_root


def test_down_without_a_node_does_nothing(tmp_path: Path) -> None:
    node = RealNode(DevCluster(tmp_path / "none"), None)
    assert node.down() is False
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize(("policy", "scope", "field"), [
    ("single-numa", "container", "topology policy 'single-numa'"),
    ("restricted", "node", "topology scope 'node'"),
])
def test_a_bad_topology_policy_is_refused_by_name(tmp_path: Path, policy: str, scope: str,
                                                  field: str) -> None:
    node = RealNode(DevCluster(tmp_path / "s"), None, policy=policy, scope=scope)
    with pytest.raises(RealNodeError, match=f"{field}: expected one of"):
        node._policy(lambda _m: None)


def test_a_failed_start_keeps_only_the_logs(tmp_path: Path) -> None:
    node = _node(tmp_path)
    node._write_containerd_config()
    (node.dir / "logs").mkdir()
    (node.dir / "logs" / "kubelet.log").write_text("why it failed\n")
    assert node.down(keep_logs=True) is True
    assert sorted(p.name for p in node.dir.iterdir()) == ["logs"]
    assert (node.dir / "logs" / "kubelet.log").read_text() == "why it failed\n"
