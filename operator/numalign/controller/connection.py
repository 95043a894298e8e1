"""The operator's connection to the API server: the one client
(:mod:`numalign.api.kube`) on Kopf's event loop, with the credentials Kopf logs in with."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from numalign.api.common import GROUP, VERSION
from numalign.api.kube import ApiError, Kube, KubeConfig, load_config, q

NT_PLURAL = "nodetopologies"
TP_PLURAL = "topologypolicies"
TP_BASE = f"/apis/{GROUP}/{VERSION}/{TP_PLURAL}"
COMPONENT = "numalign-operator"
MAX_CONNECTIONS = 32

log = logging.getLogger(__name__)

_kubeconfig: str | None = None
_config: KubeConfig | None = None
_client: Kube | None = None
_client_loop: asyncio.AbstractEventLoop | None = None


def configure(kubeconfig: str | None) -> None:
    """Choose the credentials: an explicit kubeconfig, else $KUBECONFIG, else in-cluster,
    else ~/.kube/config (:func:`numalign.api.kube.load_config`), loaded on first use."""
    global _kubeconfig, _config, _client, _client_loop
    _kubeconfig, _config, _client, _client_loop = kubeconfig, None, None, None


def config() -> KubeConfig:
    global _config
    if _config is None:
        _config = load_config(_kubeconfig)
    return _config


def client() -> Kube:
    """The operator's client, bound to the running event loop (Kopf's)."""
    global _client, _client_loop
    loop = asyncio.get_running_loop()
    if _client is None or _client_loop is not loop:
        _client = Kube(config(), max_connections=MAX_CONNECTIONS, user_agent=COMPONENT)
        _client_loop = loop
    return _client


async def close() -> None:
    global _client, _client_loop
    kube, _client, _client_loop = _client, None, None
    if kube is not None:
        await kube.close()


def connection_info() -> kopf.ConnectionInfo:
    """Kopf's view of the same credentials (used by the ``@kopf.on.login`` handler)."""
    cfg = config()
    scheme: str | None = None
    token: str | None = None
    if not cfg.username:
        scheme, token = cfg.bearer_token()
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ca_file,
        insecure=cfg.insecure,
        username=cfg.username,
        password=cfg.password,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        default_namespace=None,
    )


# -- paths ---------------------------------------------------------------------------


def tp_path(name: str, sub: str = "") -> str:
    base = f"{TP_BASE}/{q(name)}"
    return f"{base}/{sub}" if sub else base


def ns_path(namespace: str, resource: str, name: str = "", group: str = "",
            sub: str = "") -> str:
    """``/api/v1/namespaces/NS/RESOURCE[/NAME[/SUB]]`` (``group``: ``apps/v1`` ->
    ``/apis/apps/v1/...``)."""
    root = f"/apis/{group}" if group else "/api/v1"
    path = f"{root}/namespaces/{q(namespace)}/{resource}"
    if name:
        path += f"/{q(name)}"
    if sub:
        path += f"/{sub}"
    return path


# -- reads and events ----------------------------------------------------------------


async def list_items(path: str, params: Mapping[str, str] | None = None,
                     keep: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None
                     ) -> tuple[list[dict[str, Any]], str]:
    """Every item at ``path`` and the list's resourceVersion; nothing when the kind is
    not served (404: a CRD not installed). ``keep``: as ``Kube.list_all``'s."""
    try:
        return await client().list_all(path, params, keep=keep)
    except ApiError as e:
        if e.status == 404:
            return [], ""
        raise


async def event(obj: Mapping[str, Any], type_: str, *, reason: str, message: str) -> None:
    """Post a core/v1 Event about ``obj`` (never raises: events are best effort), reported
    by this replica (``POD_ID``, its peering identity, where set)."""
    await client().event(obj, type_, reason=reason, message=message, component=COMPONENT,
                         instance=os.environ.get("POD_ID") or None)
