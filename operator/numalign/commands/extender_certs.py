"""``numalign extender-certs``: the certificates of the scheduler extender's mutual TLS,
from a fresh CA whose key is not kept: the extender's serving certificate (its Service's
IP and names), kube-scheduler's client certificate, and the ``kubernetes.io/tls`` Secret
the extender mounts. See the README section "Scheduler extender"."""

from __future__ import annotations

import argparse
import base64
import re
import sys
from pathlib import Path
from typing import Any

import yaml

from numalign.api.pki import (
    VALIDITY_DAYS,
    ExtenderCertificates,
    cert_pem,
    check_dns_name,
    check_ip,
    extender_certificates,
    key_pem,
    write_file,
)

PROG = "numalign extender-certs"
SERVICE = "numalign-extender"  # config/extender/service.yaml
SERVICE_PORT = 8890  # its port
SECRET = "numalign-extender-tls"
DEFAULT_NAMESPACE = "numalign-system"
MAX_DAYS = 36500
FILES = ("ca.crt", "tls.crt", "tls.key", "scheduler.crt", "scheduler.key", "client-ca.crt",
         "secret.yaml")
PRIVATE = frozenset({"tls.key", "scheduler.key", "secret.yaml"})  # mode 0600, others 0644
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


class UsageError(ValueError):
    """A flag's value is wrong; the message names the flag."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=(
        "Write the TLS files of the scheduler extender's mutual TLS into --out: ca.crt "
        "(the CA that signed both certificates; its key is not kept), tls.crt/tls.key "
        "(the extender's serving certificate: --service-ip, "
        f"{SERVICE}.NAMESPACE.svc[.cluster.local] and every --dns), scheduler.crt/"
        "scheduler.key (kube-scheduler's client certificate: its tlsConfig certFile/"
        "keyFile, with caFile ca.crt), client-ca.crt (the same CA, for the extender's "
        f"--client-ca) and secret.yaml (the {SECRET} Secret, type kubernetes.io/tls, "
        "with tls.crt, tls.key and ca.crt). Keys and the Secret are mode 0600."))
    p.add_argument("--service-ip", required=True, metavar="IP",
                   help=f"the ClusterIP of the {SERVICE} Service (where kube-scheduler on "
                   "the host network calls it)")
    p.add_argument("--dns", action="append", default=[], metavar="NAME",
                   help="another DNS name of the extender (repeatable)")
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE,
                   help=f"the extender's namespace (default {DEFAULT_NAMESPACE})")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write into "
                   "(created if missing)")
    p.add_argument("--days", type=int, default=VALIDITY_DAYS,
                   help=f"validity of the CA and both certificates (default {VALIDITY_DAYS})")
    p.add_argument("--force", action="store_true", help="replace files already in --out")
    return p


def service_names(namespace: str) -> tuple[str, ...]:
    return (f"{SERVICE}.{namespace}.svc", f"{SERVICE}.{namespace}.svc.cluster.local")


def check_args(args: argparse.Namespace) -> tuple[str, tuple[str, ...]]:
    """(the service IP, the DNS names) of the serving certificate; UsageError."""
    try:
        ip = str(check_ip(args.service_ip))
    except ValueError as e:
        raise UsageError(f"--service-ip {e}") from None
    if not _LABEL.fullmatch(args.namespace):
        raise UsageError(f"--namespace {args.namespace!r}: not a namespace name (lower-case "
                         "letters, digits and '-', 1 to 63 characters)")
    names = list(service_names(args.namespace))
    for name in args.dns:
        try:
            names.append(check_dns_name(name))
        except ValueError as e:
            raise UsageError(f"--dns {e}") from None
    if not 1 <= args.days <= MAX_DAYS:
        raise UsageError(f"--days {args.days}: must be between 1 and {MAX_DAYS}")
    return ip, tuple(dict.fromkeys(names))


def secret(namespace: str, certs: ExtenderCertificates) -> dict[str, Any]:
    """The extender's ``kubernetes.io/tls`` Secret (tls.crt, tls.key, ca.crt)."""
    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": namespace,
                     "labels": {"app.kubernetes.io/name": SERVICE,
                                "app.kubernetes.io/component": "scheduler-extender"}},
        "type": "kubernetes.io/tls",
        "data": {"tls.crt": b64(cert_pem(certs.serving.cert)),
                 "tls.key": b64(key_pem(certs.serving.key)),
                 "ca.crt": b64(certs.ca.pem)},
    }


def contents(namespace: str, certs: ExtenderCertificates) -> dict[str, bytes]:
    """Each file of :data:`FILES` and what it holds."""
    out = {
        "ca.crt": certs.ca.pem,
        "tls.crt": cert_pem(certs.serving.cert),
        "tls.key": key_pem(certs.serving.key),
        "scheduler.crt": cert_pem(certs.scheduler.cert),
        "scheduler.key": key_pem(certs.scheduler.key),
        "client-ca.crt": certs.ca.pem,
        "secret.yaml": yaml.safe_dump(secret(namespace, certs), sort_keys=False).encode(),
    }
    assert tuple(out) == FILES
    return out


def write(out: Path, namespace: str, ip: str, dns: tuple[str, ...], days: int,
          force: bool = False) -> list[Path]:
    """Generate and write every file; FileExistsError (unless ``force``), OSError."""
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--out {out}: not a directory")
    existing = [out / f for f in FILES if (out / f).exists()]
    if existing and not force:
        raise FileExistsError(f"refusing to overwrite {', '.join(map(str, existing))} "
                              "(--force replaces them)")
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    certs = extender_certificates(dns=dns, ips=(ip,), days=days)
    written = []
    for name, data in contents(namespace, certs).items():
        write_file(out / name, data, 0o600 if name in PRIVATE else 0o644)
        written.append(out / name)
    return written


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        ip, dns = check_args(args)
    except UsageError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    out = Path(args.out)
    try:
        write(out, args.namespace, ip, dns, args.days, args.force)
    except OSError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {', '.join(FILES)} into {out} (serving certificate for {ip}, "
          f"{', '.join(dns)}; valid {args.days} days)")
    print(f"  kubectl apply -f {out / 'secret.yaml'}: the extender mounts it and runs with "
          "--tls-cert tls.crt --tls-key tls.key --client-ca ca.crt")
    host = f"[{ip}]" if ":" in ip else ip
    print(f"  kube-scheduler: urlPrefix https://{host}:{SERVICE_PORT}, enableHTTPS: true, "
          f"tlsConfig caFile {out / 'ca.crt'}, certFile "
          f"{out / 'scheduler.crt'}, keyFile {out / 'scheduler.key'}")
    return 0
