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

from numalign.api.names import LABEL_MANAGED, MANAGED_NRI
from numalign.devcluster import certs, kubeproxy
from numalign.devcluster import command as dev
from numalign.devcluster.cluster import CLUSTER_CIDR, DevCluster
from numalign.devcluster.images import PAUSE_IMAGE
from numalign.devcluster.realnode import RealNode, RealNodeError
from numalign.devcluster.realnode_config import (
    MODE_KUBELET,
    MODE_NRI,
    TAINT,
    kubelet_configuration,
    node_labels,
)


def _node(tmp_path: Path, mode: str = MODE_KUBELET) -> RealNode:
    cluster = DevCluster(tmp_path / "state", name="t")
    certs.generate(cluster.pki.dir)
    node = RealNode(cluster, None, mode=mode)
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
    assert nri["socket_path"] == str(node.nri_socket)  # where the agent registers
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


def test_nri_mode_leaves_the_kubelets_managers_at_none(tmp_path: Path) -> None:
    node = _node(tmp_path, MODE_NRI)
    node._write_kubelet_files({"kubelet": 40001, "healthz": 40002}, "none", "container", "0")
    cfg = yaml.safe_load(node.kubelet_config.read_text())
    assert cfg["cpuManagerPolicy"] == "none"
    assert cfg["memoryManagerPolicy"] == "None"
    assert cfg["topologyManagerPolicy"] == "none"
    # The reserved CPU stays out of allocatable; the agent reads it from this file.
    assert cfg["reservedSystemCPUs"] == "0"
    assert cfg["registerWithTaints"] == [TAINT]
    # The kubelet-managed mode keeps its static CPU manager and no memory manager setting.
    kubelet = _node(tmp_path / "k")
    kubelet._write_kubelet_files({"kubelet": 1, "healthz": 2}, "best-effort", "pod", "0")
    cfg = yaml.safe_load(kubelet.kubelet_config.read_text())
    assert (cfg["cpuManagerPolicy"], cfg["topologyManagerPolicy"]) == ("static", "best-effort")
    assert "memoryManagerPolicy" not in cfg


def test_only_nri_mode_makes_containerd_require_numalign_s_plugin(tmp_path: Path) -> None:
    """In nri mode no container starts unplaced: while numalign's NRI plugin is not
    registered (the agent restarting, say) containerd's default validator fails every
    creation except a pod's that tolerates it; the kubelet retries."""
    nri = _node(tmp_path / "nri", MODE_NRI)
    nri._write_containerd_config()
    cfg = tomllib.loads((nri.containerd_dir / "config.toml").read_text())
    section = cfg["plugins"]["io.containerd.nri.v1.nri"]
    assert section["default_validator"] == {
        "enable": True, "required_plugins": ["numalign"],
        "tolerate_missing_plugins_annotation": "numalign.io/tolerate-unplaced"}
    assert section["plugin_request_timeout"] == "10s"
    kubelet = _node(tmp_path / "kubelet")
    kubelet._write_containerd_config()
    cfg = tomllib.loads((kubelet.containerd_dir / "config.toml").read_text())
    assert "default_validator" not in cfg["plugins"]["io.containerd.nri.v1.nri"]


def test_only_nri_mode_labels_the_node_managed() -> None:
    assert node_labels(MODE_NRI) == {LABEL_MANAGED: MANAGED_NRI} == {"numalign.io/managed": "nri"}
    assert node_labels(MODE_KUBELET) == {}
    with pytest.raises(ValueError, match="mode 'nris': expected one of kubelet, nri"):
        node_labels("nris")


@pytest.mark.parametrize("mode", [MODE_KUBELET, MODE_NRI])
def test_the_agent_gets_the_nri_socket_only_in_nri_mode(tmp_path: Path, mode: str) -> None:
    node = _node(tmp_path, mode)
    argv = node._agent_argv(lambda _m: None)
    assert argv[argv.index("--node") + 1] == "localhost"
    assert argv[argv.index("--kubelet-config") + 1] == str(node.kubelet_config)
    if mode == MODE_NRI:
        assert argv[argv.index("--nri-socket") + 1] == str(node.nri_socket)
    else:
        assert "--nri-socket" not in argv
    # the flags it is given are the agent's own (no probe of its --help needed)
    from numalign.commands import agent

    agent._parser().parse_args(argv[argv.index("agent") + 1:])


def test_a_bad_mode_and_a_topology_policy_in_nri_mode_are_refused(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path / "m")
    with pytest.raises(RealNodeError, match="real node mode 'static': expected one of"):
        RealNode(cluster, None, mode="static")
    with pytest.raises(RealNodeError, match="in nri mode it is none"):
        RealNode(cluster, None, policy="single-numa-node", mode=MODE_NRI)


def test_dev_up_nri_needs_the_real_node_and_no_topology_policy(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = ["--state-dir", str(tmp_path / "s")]
    assert dev.main(["up", *state, "--nri"]) == 2
    assert "--nri is a mode of the real node: add --real-node" in capsys.readouterr().err
    assert dev.main(["up", *state, "--real-node", "--nri", "--topology-policy",
                     "restricted"]) == 2
    assert "--topology-policy sets the kubelet's Topology Manager" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()  # refused before anything started


@pytest.mark.parametrize(("mode", "says"), [
    (MODE_NRI, "real node localhost: mode nri (numalign-managed"),
    (MODE_KUBELET, "real node localhost: mode kubelet (the kubelet places containers: "
                   "static CPU manager, Topology Manager policy restricted, scope pod)"),
])
def test_dev_status_shows_the_real_nodes_mode(tmp_path: Path, mode: str, says: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    node = _node(tmp_path, mode)
    node._save_state({"name": "localhost", "mode": mode, "policy": "restricted",
                      "scope": "pod"})
    assert dev.main(["status", "--state-dir", str(node.cluster.state_dir)]) == 1  # no cluster
    assert says in capsys.readouterr().out


def test_only_a_cluster_whose_pods_reach_services_makes_the_bridge_their_gateway(
        tmp_path: Path) -> None:
    node = _node(tmp_path)
    for gateway in (False, True):
        node._write_containerd_config(gateway=gateway)
        [bridge] = json.loads(
            (node.containerd_dir / "cni/conf/10-numalign.conflist").read_text())["plugins"]
        assert bridge["isGateway"] is gateway and bridge["isDefaultGateway"] is gateway
        assert bridge["ipMasq"] is False  # kube-proxy masquerades Service traffic itself
    cfg = kubelet_configuration(ports={"kubelet": 1, "healthz": 2}, policy="none",
                                scope="container", reserved="0", cgroup_root="/x",
                                ca_cert=tmp_path / "ca", endpoint="unix:///x",
                                pod_logs=tmp_path)
    assert cfg["makeIPTablesUtilChains"] is False  # no chains of the kubelet on the host


def test_kube_proxy_is_the_node_proxier_on_loopback_and_leaves_sysctls_alone(
        tmp_path: Path) -> None:
    node = _node(tmp_path)
    ports = {"kube-proxy-healthz": 40011, "kube-proxy-metrics": 40012}
    config = kubeproxy.write_files(node.cluster, node.name, node.dir, ports)
    cfg = yaml.safe_load(config.read_text())
    assert cfg["kind"] == "KubeProxyConfiguration" and cfg["mode"] == "iptables"
    assert cfg["hostnameOverride"] == "localhost" and cfg["clusterCIDR"] == CLUSTER_CIDR
    assert (cfg["healthzBindAddress"], cfg["metricsBindAddress"]) == (
        "127.0.0.1:40011", "127.0.0.1:40012")
    assert cfg["iptables"] == {"masqueradeAll": True, "localhostNodePorts": False}
    assert cfg["conntrack"]["maxPerCore"] == 0 and cfg["conntrack"]["min"] == 0
    # Its identity: system:kube-proxy (the API server's bootstrap system:node-proxier).
    kc = yaml.safe_load(Path(cfg["clientConnection"]["kubeconfig"]).read_text())
    cert = x509.load_pem_x509_certificate((node.dir / "kube-proxy.crt").read_bytes())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == \
        "system:kube-proxy"
    assert kc["users"][0]["name"] == "system:kube-proxy"
    assert kubeproxy.argv(config)[1:] == [f"--config={config}", "--v=1"]


def test_dev_up_install_needs_the_real_node(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    state = ["--state-dir", str(tmp_path / "s")]
    assert dev.main(["up", *state, "--install", "helm"]) == 2
    assert "--install runs numalign's pods on the real node: add --real-node" in \
        capsys.readouterr().err
    with pytest.raises(SystemExit):
        dev.main(["up", *state, "--real-node", "--install", "apply"])
    assert not (tmp_path / "s").exists()
