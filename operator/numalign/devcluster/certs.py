"""The dev cluster's PKI, built with :mod:`numalign.api.pki` (EC P-256 keys throughout):

* the cluster CA: the API server's serving certificate (127.0.0.1, localhost and the
  in-cluster names) and the client certificates of the admin (group system:masters),
  the controller manager, the scheduler, the API server towards kubelets, and the
  scheduler extender's own identity (``numalign-extender``: only its RBAC);
* the front-proxy CA and its client; the service-account signing key;
* an etcd CA, of etcd alone: etcd's serving and peer certificates and the API server's
  etcd client certificate. etcd trusts no certificate of the cluster CA, whose key also
  signs what the controller manager approves (kubelet CSRs);
* an extender CA: the extender's serving certificate (127.0.0.1) and kube-scheduler's
  client certificate towards it (``numalign extender --client-ca``).

The etcd and extender CAs' keys are not kept (nothing else is issued from them). Every
file is written mode 0600 in a directory of mode 0700.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from cryptography.hazmat.primitives import serialization

from ..api.pki import (
    CLIENT_AUTH,
    SERVER_AND_CLIENT_AUTH,
    SERVER_AUTH,
    CertificateAuthority,
    Issued,
    extender_certificates,
    key_pem,
    new_key,
    write_file,
)

SERVICE_IP = "10.96.0.1"  # first address of the service range: the kubernetes service
LOOPBACK_DNS = ("localhost",)
LOOPBACK_IPS = ("127.0.0.1", "::1")
EXTENDER_USER = "numalign-extender"  # the extender's API identity (CN, no group)
PRIVATE = 0o600


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path

    def save(self, issued: Issued, cert_mode: int = PRIVATE) -> KeyPair:
        issued.save(self.cert, self.key, cert_mode)
        return self


@dataclass(frozen=True)
class Pki:
    dir: Path
    ca: KeyPair
    apiserver: KeyPair
    front_proxy_ca: KeyPair
    front_proxy_client: KeyPair
    admin: KeyPair
    controller_manager: KeyPair
    scheduler: KeyPair
    apiserver_kubelet_client: KeyPair
    sa_key: Path
    sa_pub: Path
    etcd_ca: Path  # certificate only
    etcd_server: KeyPair
    etcd_peer: KeyPair
    apiserver_etcd_client: KeyPair
    extender_ca: Path  # certificate only: the extender's --client-ca, the scheduler's caFile
    extender_serving: KeyPair
    scheduler_extender_client: KeyPair
    extender_client: KeyPair  # towards the API server, as EXTENDER_USER

    @classmethod
    def at(cls, directory: Path) -> Pki:
        def pair(name: str) -> KeyPair:
            return KeyPair(directory / f"{name}.crt", directory / f"{name}.key")

        return cls(
            dir=directory,
            ca=pair("ca"),
            apiserver=pair("apiserver"),
            front_proxy_ca=pair("front-proxy-ca"),
            front_proxy_client=pair("front-proxy-client"),
            admin=pair("admin"),
            controller_manager=pair("controller-manager"),
            scheduler=pair("scheduler"),
            apiserver_kubelet_client=pair("apiserver-kubelet-client"),
            sa_key=directory / "sa.key",
            sa_pub=directory / "sa.pub",
            etcd_ca=directory / "etcd-ca.crt",
            etcd_server=pair("etcd-server"),
            etcd_peer=pair("etcd-peer"),
            apiserver_etcd_client=pair("apiserver-etcd-client"),
            extender_ca=directory / "extender-ca.crt",
            extender_serving=pair("extender-serving"),
            scheduler_extender_client=pair("scheduler-extender-client"),
            extender_client=pair("extender-client"),
        )

    def files(self) -> list[Path]:
        """Every file :func:`generate` writes."""
        out: list[Path] = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, KeyPair):
                out += [value.cert, value.key]
            elif f.name != "dir":
                out.append(value)
        return out

    def complete(self) -> bool:
        return all(f.is_file() for f in self.files())


def generate(directory: Path, addresses: tuple[str, ...] = ()) -> Pki:
    """Write a fresh PKI into ``directory`` and return where each file is; the API
    server's certificate also names ``addresses`` (where it listens besides loopback)."""
    pki = Pki.at(directory)
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)

    ca = CertificateAuthority.create("numalign-dev-ca")
    ca.save(pki.ca.cert, pki.ca.key, PRIVATE)
    pki.apiserver.save(ca.issue(
        "kube-apiserver", usages=SERVER_AUTH,
        dns=(*LOOPBACK_DNS, "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local"),
        ips=(*LOOPBACK_IPS, SERVICE_IP, *addresses),
    ))
    pki.admin.save(ca.issue("numalign-admin", org="system:masters"))
    pki.controller_manager.save(ca.issue("system:kube-controller-manager"))
    pki.scheduler.save(ca.issue("system:kube-scheduler"))
    # The API server's identity towards kubelets (logs, exec): an admin of the cluster.
    pki.apiserver_kubelet_client.save(
        ca.issue("kube-apiserver-kubelet-client", org="system:masters"))
    pki.extender_client.save(ca.issue(EXTENDER_USER))

    fp = CertificateAuthority.create("numalign-dev-front-proxy-ca")
    fp.save(pki.front_proxy_ca.cert, pki.front_proxy_ca.key, PRIVATE)
    pki.front_proxy_client.save(fp.issue("front-proxy-client"))

    sa = new_key()
    write_file(pki.sa_key, key_pem(sa), PRIVATE)
    write_file(pki.sa_pub, sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo), PRIVATE)

    etcd = CertificateAuthority.create("numalign-dev-etcd-ca")
    write_file(pki.etcd_ca, etcd.pem, PRIVATE)
    # etcd's gRPC gateway dials etcd itself with the serving certificate: client auth too.
    pki.etcd_server.save(etcd.issue("etcd-server", usages=SERVER_AND_CLIENT_AUTH,
                                    dns=LOOPBACK_DNS, ips=LOOPBACK_IPS))
    pki.etcd_peer.save(etcd.issue("etcd-peer", usages=SERVER_AND_CLIENT_AUTH,
                                  dns=LOOPBACK_DNS, ips=LOOPBACK_IPS))
    pki.apiserver_etcd_client.save(etcd.issue("kube-apiserver-etcd-client",
                                              usages=CLIENT_AUTH))

    ext = extender_certificates(dns=LOOPBACK_DNS, ips=LOOPBACK_IPS)
    write_file(pki.extender_ca, ext.ca.pem, PRIVATE)
    pki.extender_serving.save(ext.serving)
    pki.scheduler_extender_client.save(ext.scheduler)
    return pki


def issue_client(pki: Pki, pair: KeyPair, cn: str, org: str | None = None) -> KeyPair:
    """Issue a client certificate (``cn``, group ``org``) from the cluster CA into ``pair``,
    e.g. a kubelet's ``system:node:NAME`` in ``system:nodes``."""
    ca = CertificateAuthority.load(pki.ca.cert, pki.ca.key)
    return pair.save(ca.issue(cn, org=org), cert_mode=0o644)
