"""The dev cluster's TLS beyond the API server (issue 26, finding 11): etcd serves HTTPS
and answers only its own CA's client certificates; the scheduler extender serves HTTPS to
kube-scheduler's certificate only and acts as ``numalign-extender`` with its RBAC, not
as the admin. Every file of ``pki/`` is private. Against a running control plane:
tests/cluster/test_control_plane.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from test_certs_extender import client_context, handshake, server_context

from numalign.devcluster import DevCluster
from numalign.devcluster.certs import Pki, generate
from numalign.devcluster.components import apiserver_args, etcd_args
from numalign.devcluster.extender_host import (
    RBAC_FILE,
    Endpoints,
    extender_argv,
    rbac_objects,
    scheduler_tls,
)
from numalign.devcluster.scheduler import write_scheduler_config

SERVER = ExtendedKeyUsageOID.SERVER_AUTH
CLIENT = ExtendedKeyUsageOID.CLIENT_AUTH


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _eku(path: Path) -> set[x509.ObjectIdentifier]:
    return set(_cert(path).extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def _ips(path: Path) -> set[str]:
    sans = _cert(path).extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}


def _issued_by(path: Path, ca: Path) -> bool:
    try:
        _cert(path).verify_directly_issued_by(_cert(ca))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _subject(path: Path) -> tuple[list[str], list[str]]:
    name = _cert(path).subject
    return ([str(a.value) for a in name.get_attributes_for_oid(NameOID.COMMON_NAME)],
            [str(a.value) for a in name.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)])


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return generate(tmp_path_factory.mktemp("dev") / "pki")


def test_etcd_has_its_own_ca(pki: Pki) -> None:
    """etcd's serving and peer certificates (server and client auth: etcd's gateway and
    peers dial with them) and the API server's etcd client certificate, all of the etcd
    CA; no certificate of the cluster CA (whose key signs approved CSRs) passes etcd's."""
    for pair in (pki.etcd_server, pki.etcd_peer):
        assert _issued_by(pair.cert, pki.etcd_ca)
        assert _eku(pair.cert) == {SERVER, CLIENT}
        assert "127.0.0.1" in _ips(pair.cert)
    assert _issued_by(pki.apiserver_etcd_client.cert, pki.etcd_ca)
    assert _eku(pki.apiserver_etcd_client.cert) == {CLIENT}
    for pair in (pki.admin, pki.apiserver, pki.apiserver_kubelet_client, pki.scheduler):
        assert not _issued_by(pair.cert, pki.etcd_ca)
    assert not _issued_by(pki.apiserver_etcd_client.cert, pki.ca.cert)
    assert not (pki.dir / "etcd-ca.key").exists()


def test_extender_certificates(pki: Pki) -> None:
    """The extender's serving certificate (127.0.0.1) and kube-scheduler's client
    certificate towards it, both of the extender CA; the extender's API identity
    ``numalign-extender`` (no group), of the cluster CA."""
    assert _issued_by(pki.extender_serving.cert, pki.extender_ca)
    assert _eku(pki.extender_serving.cert) == {SERVER}
    assert "127.0.0.1" in _ips(pki.extender_serving.cert)
    assert _issued_by(pki.scheduler_extender_client.cert, pki.extender_ca)
    assert _eku(pki.scheduler_extender_client.cert) == {CLIENT}
    assert not _issued_by(pki.scheduler_extender_client.cert, pki.ca.cert)
    assert _issued_by(pki.extender_client.cert, pki.ca.cert)
    assert _subject(pki.extender_client.cert) == (["numalign-extender"], [])
    assert _eku(pki.extender_client.cert) == {CLIENT}
    assert not (pki.dir / "extender-ca.key").exists()


def test_every_pki_file_private(pki: Pki) -> None:
    assert pki.complete()
    assert (pki.dir.stat().st_mode & 0o777) == 0o700
    written = sorted(p for p in pki.dir.iterdir())
    assert written == sorted(pki.files())
    assert {p.name: p.stat().st_mode & 0o777 for p in written} == {
        p.name: 0o600 for p in written}


def test_extender_answers_the_schedulers_certificate_only(pki: Pki) -> None:
    server = server_context(pki.extender_serving.cert, pki.extender_serving.key,
                            pki.extender_ca)
    sched = pki.scheduler_extender_client
    assert handshake(server, client_context(pki.extender_ca, sched.cert, sched.key))
    assert not handshake(server, client_context(pki.extender_ca))
    # the admin (system:masters, the cluster CA) is no client of the extender either
    assert not handshake(server, client_context(pki.extender_ca, pki.admin.cert,
                                                pki.admin.key))


def test_etcd_answers_the_api_servers_certificate_only(pki: Pki) -> None:
    server = server_context(pki.etcd_server.cert, pki.etcd_server.key, pki.etcd_ca)
    client = pki.apiserver_etcd_client
    assert handshake(server, client_context(pki.etcd_ca, client.cert, client.key))
    assert not handshake(server, client_context(pki.etcd_ca))
    assert not handshake(server, client_context(pki.etcd_ca, pki.admin.cert, pki.admin.key))


def _flags(argv: list[str]) -> dict[str, str]:
    return dict(a.partition("=")[::2] for a in argv if a.startswith("--"))


def test_etcd_and_api_server_flags(pki: Pki, tmp_path: Path) -> None:
    etcd = _flags(etcd_args(tmp_path, pki, tmp_path / "etcd", 2379, 2380))
    assert etcd["--listen-client-urls"] == etcd["--advertise-client-urls"] == (
        "https://127.0.0.1:2379")
    assert etcd["--listen-peer-urls"] == "https://127.0.0.1:2380"
    assert etcd["--initial-cluster"] == "dev=https://127.0.0.1:2380"
    assert etcd["--client-cert-auth"] == etcd["--peer-client-cert-auth"] == "true"
    assert etcd["--trusted-ca-file"] == etcd["--peer-trusted-ca-file"] == str(pki.etcd_ca)
    assert etcd["--cert-file"] == str(pki.etcd_server.cert)
    assert etcd["--peer-cert-file"] == str(pki.etcd_peer.cert)
    assert not any("http://" in v for v in etcd.values())
    assert "--listen-metrics-urls" not in etcd  # no plain-HTTP listener at all

    api = _flags(apiserver_args(tmp_path, pki, 6443, "https://127.0.0.1:2379", "10.96.0.0/16"))
    assert api["--etcd-servers"] == "https://127.0.0.1:2379"
    assert api["--etcd-cafile"] == str(pki.etcd_ca)
    assert api["--etcd-certfile"] == str(pki.apiserver_etcd_client.cert)
    assert api["--etcd-keyfile"] == str(pki.apiserver_etcd_client.key)


def test_scheduler_calls_the_extender_over_mutual_tls(pki: Pki, tmp_path: Path) -> None:
    ends = Endpoints(4242, 4243)
    doc = yaml.safe_load(write_scheduler_config(
        tmp_path, tmp_path / "scheduler.kubeconfig", (), ends.url, scheduler_tls(pki)
    ).read_text())
    [ext] = doc["extenders"]
    assert ext["urlPrefix"] == "https://127.0.0.1:4242" and ext["enableHTTPS"] is True
    assert ext["tlsConfig"] == {"caFile": str(pki.extender_ca),
                                "certFile": str(pki.scheduler_extender_client.cert),
                                "keyFile": str(pki.scheduler_extender_client.key)}


def test_extender_process_flags(pki: Pki, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "extender.kubeconfig"
    argv = extender_argv(pki, kubeconfig, Endpoints(4242, 4243))
    assert argv[:3] == ["-m", "numalign.cli", "extender"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert flags == {"--kubeconfig": str(kubeconfig), "--addr": "127.0.0.1", "--port": "4242",
                     "--tls-cert": str(pki.extender_serving.cert),
                     "--tls-key": str(pki.extender_serving.key),
                     "--client-ca": str(pki.extender_ca),
                     "--probe-addr": "127.0.0.1", "--probe-port": "4243"}


def test_extender_rbac_is_the_installed_role(tmp_path: Path) -> None:
    """The user numalign-extender gets config/extender/rbac.yaml's ClusterRole rules, in
    a ClusterRole of the dev cluster's own (the installed manifests own theirs)."""
    installed = next(d for d in yaml.safe_load_all(RBAC_FILE.read_text())
                     if d and d["kind"] == "ClusterRole")
    (role_path, role), (binding_path, binding) = rbac_objects()
    assert role_path.endswith("/clusterroles") and binding_path.endswith("/clusterrolebindings")
    assert role["rules"] == installed["rules"]
    assert role["metadata"]["name"] != installed["metadata"]["name"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                    "name": "numalign-extender"}]
    (tmp_path / "rbac.yaml").write_text("kind: ServiceAccount\n")
    with pytest.raises(ValueError, match="no ClusterRole numalign-extender"):
        rbac_objects(tmp_path / "rbac.yaml")


def test_extender_kubeconfig_and_urls(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path)
    generate(cluster.pki.dir)
    cluster._write_kubeconfigs("https://127.0.0.1:6443")
    doc = yaml.safe_load(cluster.extender_kubeconfig.read_text())
    assert (cluster.extender_kubeconfig.stat().st_mode & 0o777) == 0o600
    [user] = doc["users"]
    cert = x509.load_pem_x509_certificate(
        base64.b64decode(user["user"]["client-certificate-data"]))
    assert cert.subject.rfc4514_string() == "CN=numalign-extender"  # no system:masters
    cluster.state_file.write_text(json.dumps({"extender": Endpoints(4242, 4243).to_state()}))
    assert cluster.extender_url == "https://127.0.0.1:4242"
    assert cluster.extender_probe_url == "http://127.0.0.1:4243"
    assert cluster.metrics_url("extender") == "http://127.0.0.1:4243/metrics"
