"""The dev cluster's PKI, generated with ``cryptography``: a cluster CA, the API
server's serving certificate (127.0.0.1, localhost and the in-cluster names), a
front-proxy CA and client, the service-account signing key, and client certificates
for the admin (group system:masters), the controller manager and the scheduler.

EC P-256 keys throughout: fast to generate and accepted by every component.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=365)
SERVICE_IP = "10.96.0.1"  # first address of the service range: the kubernetes service


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


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
        )

    def complete(self) -> bool:
        pairs = (self.ca, self.apiserver, self.front_proxy_ca, self.front_proxy_client,
                 self.admin, self.controller_manager, self.scheduler,
                 self.apiserver_kubelet_client)
        files = [p for kp in pairs for p in (kp.cert, kp.key)] + [self.sa_key, self.sa_pub]
        return all(f.is_file() for f in files)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(cn: str, org: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey,
             now: dt.datetime) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
    )


class _Ca:
    @classmethod
    def load(cls, pair: KeyPair) -> _Ca:
        """The CA that :func:`generate` wrote, to issue more certificates with."""
        ca = cls.__new__(cls)
        key = serialization.load_pem_private_key(pair.key.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{pair.key}: not an EC private key")
        ca.key = key
        ca.cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
        ca.name = ca.cert.subject
        return ca

    def __init__(self, cn: str, now: dt.datetime) -> None:
        self.key = _key()
        self.name = _name(cn)
        self.cert = (
            _builder(self.name, self.name, self.key, now)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()),
                           critical=False)
            .sign(self.key, hashes.SHA256())
        )

    def issue(
        self,
        cn: str,
        now: dt.datetime,
        org: str | None = None,
        server: bool = False,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = _key()
        usage = [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
        b = (
            _builder(_name(cn, org), self.name, key, now)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True, key_encipherment=True, key_cert_sign=False,
                    crl_sign=False, content_commitment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if dns or ips:
            alt: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
            alt += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
            b = b.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        return b.sign(self.key, hashes.SHA256()), key

    def save(self, pair: KeyPair) -> None:
        _write(pair.cert, self.cert.public_bytes(serialization.Encoding.PEM))
        _write(pair.key, _key_pem(self.key), private=True)


def _save(pair: KeyPair, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    _write(pair.cert, cert.public_bytes(serialization.Encoding.PEM))
    _write(pair.key, _key_pem(key), private=True)


def generate(directory: Path, addresses: tuple[str, ...] = ()) -> Pki:
    """Write a fresh PKI into ``directory`` and return where each file is; the API
    server's certificate also names ``addresses`` (where it listens besides loopback)."""
    pki = Pki.at(directory)
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    now = dt.datetime.now(dt.UTC)

    ca = _Ca("numalign-dev-ca", now)
    ca.save(pki.ca)
    _save(pki.apiserver, *ca.issue(
        "kube-apiserver", now, server=True,
        dns=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
             "kubernetes.default.svc.cluster.local"),
        ips=("127.0.0.1", "::1", SERVICE_IP, *addresses),
    ))
    _save(pki.admin, *ca.issue("numalign-admin", now, org="system:masters"))
    _save(pki.controller_manager, *ca.issue("system:kube-controller-manager", now))
    _save(pki.scheduler, *ca.issue("system:kube-scheduler", now))
    # The API server's identity towards kubelets (logs, exec): an admin of the cluster.
    _save(pki.apiserver_kubelet_client,
          *ca.issue("kube-apiserver-kubelet-client", now, org="system:masters"))

    fp = _Ca("numalign-dev-front-proxy-ca", now)
    fp.save(pki.front_proxy_ca)
    _save(pki.front_proxy_client, *fp.issue("front-proxy-client", now))

    sa = _key()
    _write(pki.sa_key, _key_pem(sa), private=True)
    _write(pki.sa_pub, sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pki


def issue_client(pki: Pki, pair: KeyPair, cn: str, org: str | None = None) -> KeyPair:
    """Issue a client certificate (``cn``, group ``org``) from the cluster CA into ``pair``,
    e.g. a kubelet's ``system:node:NAME`` in ``system:nodes``."""
    ca = _Ca.load(pki.ca)
    _save(pair, *ca.issue(cn, dt.datetime.now(dt.UTC), org=org))
    return pair
