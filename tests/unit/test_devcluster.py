"""The dev cluster's pieces that need no control plane: certificates, kubeconfigs,
machine options, process bookkeeping and the CLI's user errors."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from numalign.devcluster import DevCluster, MachineSpec, MachineSpecError, processes
from numalign.devcluster import command as dev
from numalign.devcluster.addons import ADDONS, ClusterInfo, metrics_url
from numalign.devcluster.certs import generate
from numalign.devcluster.cluster import write_kubeconfig
from numalign.devcluster.processes import Process, free_ports


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_pki(tmp_path: Path) -> None:
    pki = generate(tmp_path / "pki")
    assert pki.complete()
    ca = _cert(pki.ca.cert)
    server = _cert(pki.apiserver.cert)
    server.verify_directly_issued_by(ca)
    sans = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)} >= {"127.0.0.1"}
    eku = server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in eku
    admin = _cert(pki.admin.cert)
    admin.verify_directly_issued_by(ca)
    orgs = admin.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    assert [o.value for o in orgs] == ["system:masters"]
    cn = _cert(pki.controller_manager.cert).subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert cn[0].value == "system:kube-controller-manager"
    _cert(pki.front_proxy_client.cert).verify_directly_issued_by(_cert(pki.front_proxy_ca.cert))
    assert (pki.sa_key.stat().st_mode & 0o777) == 0o600
    assert b"PUBLIC KEY" in pki.sa_pub.read_bytes()


def test_kubeconfig(tmp_path: Path) -> None:
    pki = generate(tmp_path / "pki")
    path = tmp_path / "kubeconfig"
    write_kubeconfig(path, "numalign-x", "https://127.0.0.1:1234", pki.ca.cert,
                     pki.admin.cert, pki.admin.key, "admin")
    doc = yaml.safe_load(path.read_text())
    assert doc["current-context"] == "numalign-x"
    assert doc["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:1234"
    assert doc["users"][0]["user"]["client-key-data"]
    assert (path.stat().st_mode & 0o777) == 0o600


def test_machine_spec(tmp_path: Path) -> None:
    machine = tmp_path / "m.yaml"
    machine.write_text("name: m\n")
    assert MachineSpec.parse(str(machine)) == MachineSpec(machine.resolve(), 1)
    assert MachineSpec.parse(f"{machine}=3").count == 3
    assert str(MachineSpec.parse(f"{machine}=3")) == f"{machine.resolve()}=3"
    with pytest.raises(MachineSpecError, match="no such machine file"):
        MachineSpec.parse(str(tmp_path / "missing.yaml"))
    with pytest.raises(MachineSpecError, match="at least 1"):
        MachineSpec.parse(f"{machine}=0")


def test_addon_hooks(tmp_path: Path) -> None:
    machine = tmp_path / "m.yaml"
    machine.write_text("name: m\n")
    info = ClusterInfo(name="x", state_dir=tmp_path, kubeconfig=tmp_path / "kubeconfig",
                       server="https://127.0.0.1:1", machines=(MachineSpec(machine, 2),),
                       operator=False)
    by_name = {a.name: a for a in ADDONS}
    argv = by_name["agent"].argv(info)
    assert argv is not None and argv[:3] == ["-m", "numalign.cli", "agent"]
    assert argv[argv.index("--machine") + 1] == f"{machine}=2"
    assert "--publish-nrt" in argv  # the CRD comes with the others (devcluster/crds.py)
    assert "--dra" not in argv  # extended resources unless dev up --dra
    dra = by_name["agent"].argv(ClusterInfo(**{**info.__dict__, "dra": True}))
    assert dra is not None and "--dra" in dra
    # its /metrics on a loopback port, the URL dev status prints
    url = metrics_url(argv)
    port = argv[argv.index("--metrics-port") + 1]
    assert url == f"http://127.0.0.1:{port}/metrics" and int(port) > 0
    assert metrics_url(["-m", "numalign.cli", "agent"]) is None
    assert metrics_url(["--metrics-port", "0"]) is None
    assert by_name["operator"].argv(info) is None
    no_machines = ClusterInfo(**{**info.__dict__, "machines": ()})
    assert by_name["agent"].argv(no_machines) is None


def test_process_lifecycle(tmp_path: Path) -> None:
    proc = Process("sleeper", tmp_path / "run", tmp_path / "logs")
    assert not proc.is_running() and proc.pid is None
    proc.start([sys.executable, "-c", "import time; print('hi', flush=True); time.sleep(60)"],
               program="-c")
    assert proc.is_running() and proc.pid is not None
    # A second handle (as a later 'numalign dev' invocation has) sees it by its pid file.
    assert Process("sleeper", tmp_path / "run", tmp_path / "logs").is_running()
    proc.stop(timeout=5)
    assert not proc.is_running() and not proc.pid_file.exists()


def test_a_process_caught_mid_exec_is_seen_running(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Right after Popen returns, the kernel may not have set the new program's command
    line yet (it reads empty): a second handle must not take the process for gone."""
    proc = Process("sleeper", tmp_path / "run", tmp_path / "logs")
    proc.start([sys.executable, "-c", "import time; time.sleep(60)"], program="-c")
    try:
        real = processes._read_cmdline
        reads: list[int] = []

        def mid_exec(pid: int) -> bytes | None:
            reads.append(pid)
            return b"" if len(reads) <= 3 else real(pid)

        monkeypatch.setattr(processes, "_read_cmdline", mid_exec)
        assert Process("sleeper", tmp_path / "run", tmp_path / "logs").is_running()
        assert len(reads) == 4
    finally:
        proc.stop(timeout=5)


def test_free_ports() -> None:
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(p > 0 for p in ports)
    # below the ephemeral range: no client's outgoing connection takes one meanwhile
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(p < low for p in ports)
    for p in ports:  # and free to bind
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_down_leaves_foreign_files(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    (tmp_path / "logs").mkdir()
    cluster = DevCluster(tmp_path)
    assert not cluster.is_running()
    cluster.down()
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    assert not (tmp_path / "logs").exists()


def test_cli_user_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dev.main(["kubeconfig", "--state-dir", str(tmp_path)]) == 1
    assert "numalign dev up" in capsys.readouterr().err
    assert dev.main(["up", "--state-dir", str(tmp_path), "--machine", "/no/such=2"]) == 1
    err = capsys.readouterr().err
    assert "no such machine file" in err and "Traceback" not in err
    assert dev.main(["down", "--state-dir", str(tmp_path / "nothing")]) == 0
    assert dev.main(["status", "--state-dir", str(tmp_path)]) == 1
    with pytest.raises(SystemExit):
        dev.main(["up", "--help"])
    assert "nodes need the numalign agent" in " ".join(capsys.readouterr().out.split()).lower()


def test_client_qps_flags() -> None:
    from numalign.devcluster.cluster import DevClusterError, client_qps_flags

    assert client_qps_flags("200/400") == ("--kube-api-qps=200", "--kube-api-burst=400")
    assert client_qps_flags("default") == ()
    assert client_qps_flags("50") == ("--kube-api-qps=50", "--kube-api-burst=50")
    with pytest.raises(DevClusterError, match="NUMALIGN_DEV_CLIENT_QPS"):
        client_qps_flags("fast")


def test_metrics_urls_of_the_components(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path)
    cluster.state_file.write_text(json.dumps({
        "ports": {"etcd": 2379, "apiserver": 6443, "controllerManager": 10257,
                  "scheduler": 10259},
        "addons": {"operator": ["-m", "numalign.cli", "operator", "--metrics-addr",
                                "127.0.0.1", "--metrics-port", "9090"],
                   "agent": ["-m", "numalign.cli", "agent", "--machine", "m.yaml=1"]}}))
    assert cluster.metrics_url("etcd") == "https://127.0.0.1:2379/metrics"  # client cert
    assert cluster.metrics_url("kube-apiserver") == "https://127.0.0.1:6443/metrics"
    assert cluster.metrics_url("kube-scheduler") == "https://127.0.0.1:10259/metrics"
    assert cluster.metrics_url("operator") == "http://127.0.0.1:9090/metrics"
    assert cluster.metrics_url("agent") is None  # started without --metrics-port
    assert cluster.metrics_url("extender") is None  # no extender configured
