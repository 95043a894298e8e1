"""The Mutating/ValidatingWebhookConfiguration ``numalign.io``, written by the operator.

Kopf's own manager (``settings.admission.managed``) cannot set a ``namespaceSelector`` or
a timeout (it writes 30 s), and removes every non-persistent webhook from the
configurations when a replica shuts down, which a standby does not re-add. The operator
therefore writes the configurations itself (Kopf only serves the handlers):

- every webhook skips the namespaces in ``exclude`` (``kube-system`` and numalign's own:
  a failing or slow operator must never hold up the control plane or its own restart),
  answers within :data:`TIMEOUT_SECONDS` and fails open (``failurePolicy: Ignore``);
- it replaces the ``webhooks`` of the existing objects by name (a merge patch: RBAC
  grants ``get``/``patch`` on the two objects named ``numalign.io`` only; config/webhook
  ships them) and creates them only where they are missing and it may;
- nothing is removed on shutdown: a replica stopping, or a standby taking over, leaves
  the webhooks in place (same URL and CA for every replica).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from numalign.api.kube import MERGE_PATCH, ApiError, q

from . import kube

log = logging.getLogger(__name__)

NAME = "numalign.io"
TIMEOUT_SECONDS = 5
NAMESPACE_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Hook:
    id: str  # the Kopf handler id, served at /<id>
    mutating: bool
    group: str
    version: str
    plural: str
    operations: tuple[str, ...]
    namespaced: bool = True


HOOKS: tuple[Hook, ...] = (
    Hook("resolve", True, "", "v1", "pods", ("CREATE",)),
    Hook("overrides", False, "", "v1", "pods", ("CREATE",)),
    Hook("policy-overlaps", False, kube.GROUP, kube.VERSION, kube.TP_PLURAL,
         ("CREATE", "UPDATE"), namespaced=False),
)


def webhooks(mutating: bool, url: str, ca: bytes, exclude: Sequence[str]) -> list[dict[str, Any]]:
    """The ``webhooks`` list of one configuration: ``url`` is ``https://HOST:PORT``."""
    selector: dict[str, Any] = {"matchExpressions": [
        {"key": NAMESPACE_LABEL, "operator": "NotIn", "values": sorted(set(exclude))}]}
    out: list[dict[str, Any]] = []
    for h in HOOKS:
        if h.mutating != mutating:
            continue
        out.append({
            "name": f"{h.id}.{NAME}",
            "clientConfig": {"url": f"{url.rstrip('/')}/{h.id}",
                             "caBundle": base64.b64encode(ca).decode()},
            "rules": [{"apiGroups": [h.group], "apiVersions": [h.version],
                       "resources": [h.plural], "operations": list(h.operations),
                       "scope": "Namespaced" if h.namespaced else "Cluster"}],
            "namespaceSelector": selector if exclude else {},
            "failurePolicy": "Ignore",
            "matchPolicy": "Equivalent",
            "sideEffects": "None",
            "timeoutSeconds": TIMEOUT_SECONDS,
            "admissionReviewVersions": ["v1"],
        })
    return out


ADMISSION = "/apis/admissionregistration.k8s.io/v1"


async def _apply(mutating: bool, hooks: list[dict[str, Any]]) -> None:
    kind = "MutatingWebhookConfiguration" if mutating else "ValidatingWebhookConfiguration"
    base = f"{ADMISSION}/{kind.lower()}s"
    client = kube.client()
    try:
        await client.patch(f"{base}/{q(NAME)}", {"webhooks": hooks}, MERGE_PATCH)
        return
    except ApiError as e:
        if e.status != 404:
            raise
    body = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
            "metadata": {"name": NAME}, "webhooks": hooks}
    try:
        await client.create(base, body)
    except ApiError as e:
        if e.status != 409:
            raise
        # another replica created it meanwhile
        await client.patch(f"{base}/{q(NAME)}", {"webhooks": hooks}, MERGE_PATCH)


async def apply(url: str, ca: bytes, exclude: Sequence[str]) -> None:
    """Write both configurations (idempotent; every replica writes the same)."""
    for mutating in (True, False):
        await _apply(mutating, webhooks(mutating, url, ca, exclude))
    log.info("webhook configurations %s point at %s (namespaces skipped: %s)", NAME, url,
             ", ".join(exclude) or "none")
