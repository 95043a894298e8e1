"""The admission webhook server and the certificates the operator manages.

The operator serves its webhooks over TLS with a certificate signed by its own CA
(RSA 2048, CA valid 10 years, serving certificate 1 year, renewed when it expires
within 30 days or no longer covers the served host names: checked at start and every
6 hours while running). Kopf registers the
Mutating/ValidatingWebhookConfiguration ``numalign.io`` (``settings.admission.managed``)
with that CA as ``caBundle`` and the URL ``https://HOST:PORT/<handler id>``.

Where the certificate lives: ``--cert-secret NAMESPACE/NAME`` keeps it in a Secret so
that every replica (peering standby included) serves the same CA; otherwise in
``--cert-dir`` (a temporary directory by default). Failure policies: see
:mod:`.pods` (pods: Ignore) and :mod:`.policies` (TopologyPolicy: Ignore).

The server cannot tell the API server from any other client that reaches its port (the
NetworkPolicy numalign-operator admits only the API server's addresses), so it treats a
review as a request from anyone: a namespaced review is answered only when its object is
in the namespace the review names (what a handler then reads, the namespace's Failed
pods and redeploy records, is that namespace's; the only other workloads' data an answer
carries is keyed by a controller's uid, which the sender must already know), at most
:data:`MAX_REVIEW_BYTES` are read, and every review is answered (or given up with a 503,
which the API server's ``failurePolicy: Ignore`` treats like a time-out) within
:data:`REVIEW_TIMEOUT_S`, its body's arrival included.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import ipaddress
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from numalign.api.kube import ApiError

from . import connection, webhookconfig

log = logging.getLogger(__name__)

CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"
CA_KEY_FILE = "ca.key"
RENEW_BEFORE = dt.timedelta(days=30)
RENEW_CHECK_S = 6 * 3600.0
# The API server waits this long for an answer (the webhooks' timeoutSeconds); work on a
# review past it is wasted, and a client that sends its body slowly holds nothing longer.
REVIEW_TIMEOUT_S = float(webhookconfig.TIMEOUT_SECONDS)
# The largest review read: aiohttp's own limit (client_max_size of Kopf's application,
# which refuses a larger chunked body with a 413 as it reads); a declared larger body is
# refused before it is read. A pod's CREATE review is its object, well below it.
MAX_REVIEW_BYTES = 1024 ** 2


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _pem_key(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def make_ca(now: dt.datetime) -> tuple[bytes, bytes]:
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "numalign-webhook-ca")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def make_serving(ca_pem: bytes, ca_key_pem: bytes, hosts: list[str],
                 now: dt.datetime) -> tuple[bytes, bytes]:
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, None)
    assert isinstance(ca_key, rsa.RSAPrivateKey)
    key = _key()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=365))
            .add_extension(_san(hosts), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def needs_renewal(cert_pem: bytes | None, hosts: list[str], now: dt.datetime) -> bool:
    if not cert_pem:
        return True
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return True
    have = {str(v) for v in san.get_values_for_type(x509.DNSName)}
    have |= {str(v) for v in san.get_values_for_type(x509.IPAddress)}
    wanted = set()
    for h in hosts:
        try:
            wanted.add(str(ipaddress.ip_address(h)))
        except ValueError:
            wanted.add(h)
    return not wanted <= have or cert.not_valid_after_utc - now < RENEW_BEFORE


def ensure_material(files: dict[str, bytes], hosts: list[str]) -> dict[str, bytes]:
    """CA + serving certificate covering ``hosts``; reuses what is valid."""
    now = dt.datetime.now(dt.UTC)
    out = dict(files)
    if not out.get(CA_FILE) or not out.get(CA_KEY_FILE):
        out[CA_FILE], out[CA_KEY_FILE] = make_ca(now)
        out.pop(CERT_FILE, None)
    if needs_renewal(out.get(CERT_FILE), hosts, now):
        out[CERT_FILE], out[KEY_FILE] = make_serving(out[CA_FILE], out[CA_KEY_FILE], hosts, now)
    return out


async def _from_secret(namespace: str, name: str) -> tuple[dict[str, bytes], str | None]:
    s = await connection.client().get_or_none(connection.ns_path(namespace, "secrets", name))
    if s is None:
        return {}, None
    return ({k: base64.b64decode(v) for k, v in (s.get("data") or {}).items()},
            str((s.get("metadata") or {}).get("resourceVersion")))


async def certificates(cert_dir: Path, hosts: list[str], secret: str | None = None) -> Path:
    """Write ca.crt / tls.crt / tls.key into ``cert_dir`` (from the Secret if given,
    creating or renewing it there) and return the directory."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    if secret:
        ns, _, name = secret.partition("/")
        for _attempt in range(5):
            files, rv = await _from_secret(ns, name)
            new = await asyncio.to_thread(ensure_material, files, hosts)  # RSA: CPU-bound
            if new == files:
                break
            body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                    "metadata": {"name": name, "namespace": ns},
                    "data": {k: base64.b64encode(v).decode() for k, v in new.items()}}
            try:
                if rv is None:
                    await connection.client().create(connection.ns_path(ns, "secrets"), body)
                else:
                    body["metadata"]["resourceVersion"] = rv  # type: ignore[index]
                    await connection.client().put(connection.ns_path(ns, "secrets", name), body)
                files = new
                break
            except ApiError as e:
                if e.status != 409:  # another replica wrote it first: read theirs
                    raise
        else:
            raise RuntimeError(f"cannot store webhook certificates in Secret {secret}")
    else:
        files = {}
        for fn in (CA_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE):
            p = cert_dir / fn
            if p.exists():
                files[fn] = p.read_bytes()
        files = await asyncio.to_thread(ensure_material, files, hosts)
    for fn in (CA_FILE, CERT_FILE, KEY_FILE):
        p = cert_dir / fn
        p.write_bytes(files[fn])
        p.chmod(0o600)
    return cert_dir


async def renew(cert_dir: Path, hosts: list[str], secret: str | None = None) -> bool:
    """One renewal check (the operator runs it every :data:`RENEW_CHECK_S`): renew the
    serving certificate when it expires within :data:`RENEW_BEFORE` (or take the one
    another replica renewed in the Secret). Kopf's server notices the changed files and
    serves the new certificate. Returns whether the files changed."""
    before = {fn: (cert_dir / fn).read_bytes() if (cert_dir / fn).exists() else b""
              for fn in (CA_FILE, CERT_FILE, KEY_FILE)}
    await certificates(cert_dir, hosts, secret)
    return any((cert_dir / fn).read_bytes() != data for fn, data in before.items())


def namespace_problem(request: Any) -> str | None:
    """Why a review is not answered: its object (or old object) names a namespace other
    than the review's ``request.namespace``. The API server never sends one (it refuses
    such a write before admission); a forged review would make the handlers read the
    named namespace's pods and redeploy records."""
    req = request.get("request") if isinstance(request, dict) else None
    if not isinstance(req, dict):
        return None
    namespace = req.get("namespace") or ""
    for key in ("object", "oldObject"):
        obj = req.get(key)
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        other = meta.get("namespace") if isinstance(meta, dict) else None
        if other and other != namespace:
            return (f"request.{key}.metadata.namespace {other!r} is not the review's "
                    f"request.namespace {namespace!r}")
    return None


def _refusal(request: Any, message: str) -> dict[str, Any]:
    req = request.get("request") if isinstance(request, dict) else None
    uid = req.get("uid") if isinstance(req, dict) else None
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": uid if isinstance(uid, str) else "", "allowed": False,
                         "status": {"code": 400, "message": message}}}


class Server(kopf.WebhookServer):
    """kopf.WebhookServer that fills ``metadata.namespace`` of the reviewed object from the
    request (pods created by controllers, generateName, arrive without it), refuses a
    review whose object is in another namespace than the review's, and bounds each
    review's size and time (see the module's docstring)."""

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async def with_namespace(request: Any, *args: Any, **kwargs: Any) -> Any:
            problem = namespace_problem(request)
            if problem is not None:
                log.warning(f"admission review refused unread: {problem}")
                return _refusal(request, problem)
            req = request.get("request") if isinstance(request, dict) else None
            if isinstance(req, dict) and req.get("namespace"):
                for key in ("object", "oldObject"):
                    obj = req.get(key)
                    if isinstance(obj, dict):
                        meta = obj.setdefault("metadata", {})
                        if isinstance(meta, dict) and not meta.get("namespace"):
                            meta["namespace"] = req["namespace"]
            return await fn(request, *args, **kwargs)

        async for config in super().__call__(with_namespace):
            yield config

    @staticmethod
    async def _serve(fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:
        size = request.content_length
        if size is not None and size > MAX_REVIEW_BYTES:
            raise aiohttp.web.HTTPRequestEntityTooLarge(max_size=MAX_REVIEW_BYTES,
                                                        actual_size=size)
        try:
            async with asyncio.timeout(REVIEW_TIMEOUT_S):
                return await kopf.WebhookServer._serve(fn, request)
        except TimeoutError:
            log.warning(f"admission review not answered within {REVIEW_TIMEOUT_S:g} s")
            raise aiohttp.web.HTTPServiceUnavailable(
                reason=f"no answer within {REVIEW_TIMEOUT_S:g} s") from None


def server(addr: str, port: int, host: str, cert_dir: Path) -> kopf.WebhookServer:
    return Server(
        addr=addr, port=port, host=host,
        certfile=cert_dir / CERT_FILE, pkeyfile=cert_dir / KEY_FILE, cafile=cert_dir / CA_FILE)
