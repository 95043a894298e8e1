"""The webhook configurations the operator writes: they skip kube-system and numalign's
namespace, time out in seconds, fail open, and are never Kopf-managed (Kopf would strip
them when a replica stops)."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
from pathlib import Path
from typing import Any

import kopf
import pytest
from cryptography import x509

from numalign.controller import main, webhookconfig, webhooks


def test_every_webhook_skips_system_namespaces_and_times_out_fast() -> None:
    ca = b"-----BEGIN CERTIFICATE-----\n"
    for mutating in (True, False):
        hooks = webhookconfig.webhooks(mutating, "https://h.ns.svc:9443", ca,
                                       ["kube-system", "numalign-system"])
        assert hooks
        for h in hooks:
            sel = h["namespaceSelector"]["matchExpressions"]
            assert sel == [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                            "values": ["kube-system", "numalign-system"]}], h["name"]
            assert 1 <= h["timeoutSeconds"] <= 5
            assert h["failurePolicy"] == "Ignore"
            assert h["sideEffects"] == "None"
            assert base64.b64decode(h["clientConfig"]["caBundle"]) == ca
            assert h["clientConfig"]["url"].startswith("https://h.ns.svc:9443/")


def test_webhooks_through_a_service_name_it_and_the_handler_path() -> None:
    """In a cluster the API server calls the webhooks through the operator's Service
    (--webhook-service NAMESPACE/NAME): a service reference, no URL."""
    target = webhookconfig.parse_service("numalign-system/numalign-webhook", 9443)
    assert target.host == "numalign-webhook.numalign-system.svc"
    for mutating in (True, False):
        for h in webhookconfig.webhooks(mutating, target, b"ca", ["kube-system"]):
            cc = h["clientConfig"]
            assert "url" not in cc and base64.b64decode(cc["caBundle"]) == b"ca"
            assert cc["service"] == {"namespace": "numalign-system", "name": "numalign-webhook",
                                     "path": "/" + h["name"].removesuffix(".numalign.io"),
                                     "port": 9443}


@pytest.mark.parametrize(("text", "port", "complaint"), [
    ("numalign-webhook", 9443, "NAMESPACE/NAME"),
    ("ns/", 9443, "the name"),
    ("/svc", 9443, "the namespace"),
    ("NS/svc", 9443, "the namespace"),
    ("ns/svc.x", 9443, "the name"),
    ("ns/svc", 0, "--webhook-port 0"),
])
def test_a_bad_webhook_service_is_refused_naming_it(text: str, port: int,
                                                    complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        webhookconfig.parse_service(text, port)


def test_the_configurations_cover_every_admission_handler() -> None:
    """One webhook per Kopf admission handler, with its path, resource and operations."""
    registered = {(h.id, h.reason.value == "mutating", h.selector.group, h.selector.version,
                   h.selector.any_name, tuple(h.operations or ()))
                  for h in kopf.get_default_registry()._webhooks.get_all_handlers()}
    written = set()
    for mutating in (True, False):
        for h in webhookconfig.webhooks(mutating, "https://x:1", b"c", ["kube-system"]):
            [rule] = h["rules"]
            written.add((h["clientConfig"]["url"].rsplit("/", 1)[1], mutating,
                         rule["apiGroups"][0], rule["apiVersions"][0], rule["resources"][0],
                         tuple(rule["operations"])))
    assert written == registered


def test_a_running_operator_renews_its_certificate_before_it_expires(tmp_path: Path) -> None:
    """The renewal check the operator repeats every few hours: a serving certificate
    25 days from expiry is replaced (same CA, so the configurations stay valid); a fresh
    one is left alone."""
    hosts = ["numalign-webhook.ns.svc"]
    now = dt.datetime.now(dt.UTC)
    ca, ca_key = webhooks.make_ca(now)
    old_cert, old_key = webhooks.make_serving(ca, ca_key, hosts, now - dt.timedelta(days=340))
    for name, data in ((webhooks.CA_FILE, ca), (webhooks.CA_KEY_FILE, ca_key),
                       (webhooks.CERT_FILE, old_cert), (webhooks.KEY_FILE, old_key)):
        (tmp_path / name).write_bytes(data)
    assert asyncio.run(webhooks.renew(tmp_path, hosts)) is True
    new = x509.load_pem_x509_certificate((tmp_path / webhooks.CERT_FILE).read_bytes())
    assert new.not_valid_after_utc - now > dt.timedelta(days=300)
    assert (tmp_path / webhooks.CA_FILE).read_bytes() == ca
    assert asyncio.run(webhooks.renew(tmp_path, hosts)) is False
    assert webhooks.RENEW_CHECK_S <= 24 * 3600


def test_the_operator_schedules_the_renewal(monkeypatch: Any, tmp_path: Path) -> None:
    calls: list[str] = []

    async def renew(cert_dir: Path, hosts: list[str], secret: str | None) -> bool:
        calls.append("renew")
        return len(calls) == 1

    async def apply(target: webhookconfig.Target, ca: bytes, exclude: list[str]) -> None:
        calls.append(str(target))

    monkeypatch.setattr(webhooks, "renew", renew)
    monkeypatch.setattr(webhookconfig, "apply", apply)
    (tmp_path / webhooks.CA_FILE).write_bytes(b"ca")

    async def run() -> None:
        task = asyncio.create_task(main._renew_certificates(
            tmp_path, ["h"], None, "https://h:1", ["kube-system"], interval=0.01))
        while len(calls) < 3:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(run())
    assert calls[:3] == ["renew", "https://h:1", "renew"]
