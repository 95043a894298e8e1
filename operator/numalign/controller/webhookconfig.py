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
  the webhooks in place (same target and CA for every replica);
- the API server reaches them either through a Service (``clientConfig.service``: the
  operator's replicas behind ``numalign-webhook``, routed by the cluster to a ready one)
  or at a URL (``clientConfig.url``: an operator outside the cluster, the dev cluster's).
"""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from numalign.api.common import GROUP, VERSION
from numalign.api.kube import MERGE_PATCH, ApiError, q

from . import connection

log = logging.getLogger(__name__)

NAME = "numalign.io"
TIMEOUT_SECONDS = 5
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


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
    # a pod's generated claim: one NUMA node under single-numa-node (controller.claims)
    Hook("numa-constraint", True, "resource.k8s.io", "v1", "resourceclaims", ("CREATE",)),
    Hook("overrides", False, "", "v1", "pods", ("CREATE",)),
    Hook("policy-overlaps", False, GROUP, VERSION, connection.TP_PLURAL,
         ("CREATE", "UPDATE"), namespaced=False),
)


@dataclass(frozen=True)
class ServiceRef:
    """Port ``port`` of the Service ``namespace/name``, as the API server calls it (TLS
    server name ``name.namespace.svc``)."""
    namespace: str
    name: str
    port: int

    @property
    def host(self) -> str:
        return f"{self.name}.{self.namespace}.svc"

    def __str__(self) -> str:
        return f"service {self.namespace}/{self.name}:{self.port}"


# Where the API server calls the webhooks: a URL ``https://HOST:PORT``, or a Service.
Target = str | ServiceRef


def parse_service(text: str, port: int) -> ServiceRef:
    """``NAMESPACE/NAME`` (the value of ``--webhook-service``); ValueError naming the
    problem otherwise."""
    namespace, sep, name = text.partition("/")
    for what, value in (("namespace", namespace), ("name", name)):
        if not sep or not _DNS_LABEL.fullmatch(value):
            raise ValueError(f"--webhook-service {text!r}: expected NAMESPACE/NAME, the {what} "
                             "must be a DNS label (lower-case letters, digits, '-'; at most 63)")
    if not 1 <= port <= 65535:
        raise ValueError(f"--webhook-port {port}: not a port number")
    return ServiceRef(namespace, name, port)


def client_config(target: Target, hook_id: str, ca: bytes) -> dict[str, Any]:
    bundle = base64.b64encode(ca).decode()
    if isinstance(target, ServiceRef):
        return {"service": {"namespace": target.namespace, "name": target.name,
                            "path": f"/{hook_id}", "port": target.port},
                "caBundle": bundle}
    return {"url": f"{target.rstrip('/')}/{hook_id}", "caBundle": bundle}


def webhooks(mutating: bool, target: Target, ca: bytes,
             exclude: Sequence[str]) -> list[dict[str, Any]]:
    """The ``webhooks`` list of one configuration, calling ``target``."""
    selector: dict[str, Any] = {"matchExpressions": [
        {"key": NAMESPACE_LABEL, "operator": "NotIn", "values": sorted(set(exclude))}]}
    out: list[dict[str, Any]] = []
    for h in HOOKS:
        if h.mutating != mutating:
            continue
        out.append({
            "name": f"{h.id}.{NAME}",
            "clientConfig": client_config(target, h.id, ca),
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
    client = connection.client()
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


async def apply(target: Target, ca: bytes, exclude: Sequence[str]) -> None:
    """Write both configurations (idempotent; every replica writes the same)."""
    for mutating in (True, False):
        await _apply(mutating, webhooks(mutating, target, ca, exclude))
    log.info("webhook configurations %s point at %s (namespaces skipped: %s)", NAME, target,
             ", ".join(exclude) or "none")
