"""``numalign extender-certs``: the files it writes (modes, the Secret), the chain and the
usages of its certificates, a mutual-TLS handshake with them, and its user errors."""

from __future__ import annotations

import base64
import datetime as dt
import socket
import ssl
import threading
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from numalign import cli
from numalign.commands import extender_certs

NS = "sched-ext"
IP = "10.96.7.8"


def handshake(server: ssl.SSLContext, client: ssl.SSLContext,
              hostname: str = "127.0.0.1") -> bool:
    """Whether a client with ``client`` completes a TLS handshake with a server with
    ``server`` on 127.0.0.1 and reads what the server sends once it has."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)

        def serve() -> None:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                try:
                    with server.wrap_socket(conn, server_side=True) as tls:
                        tls.sendall(b"k")
                except OSError:  # ssl.SSLError included: a refused client
                    pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with socket.create_connection(listener.getsockname(), timeout=10) as raw, \
                    client.wrap_socket(raw, server_hostname=hostname) as tls:
                return tls.recv(1) == b"k"
        except OSError:
            return False
        finally:
            thread.join(10)


def server_context(cert: Path, key: Path, client_ca: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(cafile=client_ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(ca: Path, cert: Path | None = None, key: Path | None = None
                   ) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


def _cert(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _eku(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def _run(out: Path, *extra: str) -> int:
    return extender_certs.main(["--service-ip", IP, "--namespace", NS, "--out", str(out),
                                *extra])


def test_writes_every_file_keys_and_secret_private(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    assert _run(out, "--dns", "ext.example.com", "--days", "30") == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(extender_certs.FILES)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert modes == {"ca.crt": 0o644, "client-ca.crt": 0o644, "tls.crt": 0o644,
                     "scheduler.crt": 0o644, "tls.key": 0o600, "scheduler.key": 0o600,
                     "secret.yaml": 0o600}
    assert (out / "client-ca.crt").read_bytes() == (out / "ca.crt").read_bytes()
    assert not list(out.glob("ca.key"))  # the CA signs these two and nothing more

    secret = yaml.safe_load((out / "secret.yaml").read_text())
    assert secret["kind"] == "Secret" and secret["type"] == "kubernetes.io/tls"
    assert secret["metadata"]["name"] == "numalign-extender-tls"
    assert secret["metadata"]["namespace"] == NS
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    assert data == {name: (out / name).read_bytes() for name in ("tls.crt", "tls.key",
                                                                 "ca.crt")}


def test_chain_names_and_usages(tmp_path: Path) -> None:
    out = tmp_path / "tls"
    assert _run(out, "--dns", "Ext.Example.com", "--dns", f"numalign-extender.{NS}.svc",
                "--days", "30") == 0
    ca, serving, scheduler = (_cert(out / n) for n in ("ca.crt", "tls.crt", "scheduler.crt"))
    basic = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert basic.ca and basic.path_length == 0
    serving.verify_directly_issued_by(ca)
    scheduler.verify_directly_issued_by(ca)
    sans = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        f"numalign-extender.{NS}.svc", f"numalign-extender.{NS}.svc.cluster.local",
        "ext.example.com"]  # lower-cased, each once
    assert [str(i) for i in sans.get_values_for_type(x509.IPAddress)] == [IP]
    assert _eku(serving) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert _eku(scheduler) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    for cert in (ca, serving, scheduler):
        days = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
        assert dt.timedelta(days=29) < days <= dt.timedelta(days=30)


def test_mutual_tls_with_the_files(tmp_path: Path) -> None:
    """An extender serving tls.crt with --client-ca client-ca.crt answers a client with
    scheduler.crt (checking the serving certificate against ca.crt, by the Service's IP or
    name), and no client without it or with another CA's certificate."""
    out, other = tmp_path / "tls", tmp_path / "other"
    assert _run(out) == 0 and _run(other) == 0
    server = server_context(out / "tls.crt", out / "tls.key", out / "client-ca.crt")
    scheduler = client_context(out / "ca.crt", out / "scheduler.crt", out / "scheduler.key")
    assert handshake(server, scheduler, IP)
    assert handshake(server, client_context(out / "ca.crt", out / "scheduler.crt",
                                            out / "scheduler.key"),
                     f"numalign-extender.{NS}.svc")
    assert not handshake(server, client_context(out / "ca.crt"), IP)
    assert not handshake(server, client_context(out / "ca.crt", other / "scheduler.crt",
                                                other / "scheduler.key"), IP)
    # and the scheduler does not accept another extender's certificate
    impostor = server_context(other / "tls.crt", other / "tls.key", other / "client-ca.crt")
    assert not handshake(impostor, client_context(out / "ca.crt", out / "scheduler.crt",
                                                  out / "scheduler.key"), IP)


def test_refuses_to_overwrite_unless_forced(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tls"
    assert _run(out) == 0
    before = (out / "tls.key").read_bytes()
    assert _run(out) == 1
    err = capsys.readouterr().err
    assert "refusing to overwrite" in err and "--force" in err and "tls.key" in err
    assert (out / "tls.key").read_bytes() == before
    assert _run(out, "--force") == 0
    assert (out / "tls.key").read_bytes() != before
    (out / "tls.key").unlink()
    (out / "ca.crt").chmod(0o600)
    assert _run(out) == 1  # any one of the files is enough to refuse
    assert _run(out, "--force") == 0 and (out / "ca.crt").stat().st_mode & 0o777 == 0o644


@pytest.mark.parametrize(("args", "flag"), [
    (["--service-ip", "10.96.0"], "--service-ip '10.96.0': not an IPv4 or IPv6 address"),
    (["--service-ip", "svc.example"], "--service-ip"),
    (["--dns", "under_score.example"], "--dns 'under_score.example': not a DNS name"),
    (["--dns=-lead.example"], "--dns '-lead.example'"),
    (["--dns", "a" * 64 + ".example"], "--dns"),
    (["--namespace", "Numalign_System"], "--namespace 'Numalign_System'"),
    (["--days", "0"], "--days 0: must be between 1"),
])
def test_user_errors_name_the_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   args: list[str], flag: str) -> None:
    out = tmp_path / "tls"
    argv = ["--service-ip", IP, "--out", str(out), *args]
    assert extender_certs.main(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err
    assert not out.exists()


def test_out_must_be_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("")
    assert extender_certs.main(["--service-ip", IP, "--out", str(tmp_path / "file")]) == 1
    assert "--out" in capsys.readouterr().err


def test_ipv6_service_ip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tls"
    assert extender_certs.main(["--service-ip", "fd00::a", "--out", str(out)]) == 0
    assert "https://[fd00::a]:8890" in capsys.readouterr().out
    sans = _cert(out / "tls.crt").extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert [str(i) for i in sans.get_values_for_type(x509.IPAddress)] == ["fd00::a"]
    assert "numalign-extender.numalign-system.svc" in sans.get_values_for_type(x509.DNSName)


def test_a_numalign_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert "extender-certs" in cli.usage()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["extender-certs", "--help"])
    assert exit_.value.code == 0
    assert "--service-ip" in capsys.readouterr().out
    assert cli.main(["extender_certs"]) == 2  # the module's name is not a command
