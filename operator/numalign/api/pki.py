"""X.509 for numalign's own TLS, with ``cryptography``: a certificate authority that
issues serving and client certificates (EC P-256 keys), PEM files written with private
modes, and the checks of the names a certificate is issued for.

``numalign extender-certs`` builds the scheduler extender's certificates with it
(:func:`extender_certificates`), and the dev cluster its whole PKI.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import ObjectIdentifier
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY_DAYS = 365
# Extended key usages: what a certificate may prove in a TLS handshake.
SERVER_AUTH: tuple[ObjectIdentifier, ...] = (ExtendedKeyUsageOID.SERVER_AUTH,)
CLIENT_AUTH: tuple[ObjectIdentifier, ...] = (ExtendedKeyUsageOID.CLIENT_AUTH,)
SERVER_AND_CLIENT_AUTH = SERVER_AUTH + CLIENT_AUTH  # e.g. an etcd member (it dials peers)
# A certificate's not-before is set this far back: clocks a little behind still accept it.
CLOCK_SKEW = dt.timedelta(minutes=5)
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

Key = ec.EllipticCurvePrivateKey


def new_key() -> Key:
    return ec.generate_private_key(ec.SECP256R1())


def key_pem(key: Key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write_file(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` with ``mode`` (0600 unless told: keys, and whatever
    else only its owner reads), whatever mode an existing file had."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), mode)
        f.write(data)


def check_dns_name(name: str) -> str:
    """``name`` as a certificate's DNS name (RFC 1123 labels, lower-cased; a leading
    ``*.`` for a wildcard); ValueError saying what is wrong."""
    text = name.strip().lower().removesuffix(".")
    labels = text.split(".")
    if labels[0] == "*" and len(labels) > 1:
        labels = labels[1:]
    if not text or len(text) > 253:
        raise ValueError(f"{name!r}: not a DNS name (1 to 253 characters)")
    for label in labels:
        if not _DNS_LABEL.fullmatch(label):
            raise ValueError(f"{name!r}: not a DNS name (label {label!r}: letters, digits "
                             "and '-', 1 to 63 characters, no '-' at either end)")
    return text


def check_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """``text`` as an IP address; ValueError saying what is wrong."""
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        raise ValueError(f"{text!r}: not an IPv4 or IPv6 address") from None


def subject(cn: str, org: str | None = None) -> x509.Name:
    """CN ``cn`` and, for a Kubernetes client, its group ``org``."""
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
    if org:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
    return x509.Name(attrs)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _builder(name: x509.Name, issuer: x509.Name, key: Key, now: dt.datetime,
             days: int) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=days))
    )


def _key_usage(ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, key_cert_sign=ca, crl_sign=ca, content_commitment=False,
        key_encipherment=False, data_encipherment=False, key_agreement=False,
        encipher_only=False, decipher_only=False,
    )


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key."""

    cert: x509.Certificate
    key: Key

    def save(self, cert_file: Path, key_file: Path, cert_mode: int = 0o644) -> None:
        write_file(cert_file, cert_pem(self.cert), cert_mode)
        write_file(key_file, key_pem(self.key), 0o600)


class CertificateAuthority:
    """A self-signed CA (issues end-entity certificates only: path length 0)."""

    def __init__(self, cert: x509.Certificate, key: Key) -> None:
        self.cert = cert
        self.key = key

    @classmethod
    def create(cls, cn: str, days: int = VALIDITY_DAYS,
               now: dt.datetime | None = None) -> CertificateAuthority:
        key = new_key()
        name = subject(cn)
        cert = (
            _builder(name, name, key, now or _now(), days)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @classmethod
    def load(cls, cert_file: Path, key_file: Path) -> CertificateAuthority:
        """A CA written by :meth:`save`, to issue more certificates with."""
        key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_file}: not an EC private key")
        return cls(x509.load_pem_x509_certificate(cert_file.read_bytes()), key)

    @property
    def pem(self) -> bytes:
        return cert_pem(self.cert)

    def save(self, cert_file: Path, key_file: Path, cert_mode: int = 0o644) -> None:
        Issued(self.cert, self.key).save(cert_file, key_file, cert_mode)

    def issue(
        self,
        cn: str,
        *,
        org: str | None = None,
        usages: tuple[ObjectIdentifier, ...] = CLIENT_AUTH,
        dns: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        days: int = VALIDITY_DAYS,
        now: dt.datetime | None = None,
    ) -> Issued:
        """An end-entity certificate for ``cn`` (group ``org``) with ``usages``, naming
        ``dns`` and ``ips`` as its subject alternative names."""
        key = new_key()
        b = (
            _builder(subject(cn, org), self.cert.subject, key, now or _now(), days)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        if dns or ips:
            alt: list[x509.GeneralName] = [x509.DNSName(check_dns_name(d)) for d in dns]
            alt += [x509.IPAddress(check_ip(i)) for i in ips]
            b = b.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        return Issued(b.sign(self.key, hashes.SHA256()), key)


@dataclass(frozen=True)
class ExtenderCertificates:
    """What the scheduler extender's mutual TLS needs: one CA, the extender's serving
    certificate and kube-scheduler's client certificate, both signed by it (the extender
    trusts that CA for clients, ``--client-ca``; the scheduler for the server,
    ``tlsConfig.caFile``)."""

    ca: CertificateAuthority
    serving: Issued
    scheduler: Issued


EXTENDER_CA_CN = "numalign-extender-ca"
EXTENDER_CN = "numalign-extender"
SCHEDULER_CLIENT_CN = "kube-scheduler"


def extender_certificates(dns: tuple[str, ...], ips: tuple[str, ...],
                          days: int = VALIDITY_DAYS) -> ExtenderCertificates:
    """A fresh CA, the extender's serving certificate for ``dns`` and ``ips`` and the
    scheduler's client certificate (the CA's key is not kept: only these two exist)."""
    if not dns and not ips:
        raise ValueError("the extender's serving certificate needs a DNS name or an IP")
    ca = CertificateAuthority.create(EXTENDER_CA_CN, days)
    return ExtenderCertificates(
        ca=ca,
        serving=ca.issue(EXTENDER_CN, usages=SERVER_AUTH, dns=dns, ips=ips, days=days),
        scheduler=ca.issue(SCHEDULER_CLIENT_CN, usages=CLIENT_AUTH, days=days),
    )
