"""The webhook configurations the operator writes: they skip kube-system and numalign's
namespace, time out in seconds, fail open, and are never Kopf-managed (Kopf would strip
them when a replica stops)."""

from __future__ import annotations

import base64

import kopf

from numalign.controller import (
    main,  # noqa: F401 - registers the handlers
    webhookconfig,
)


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
