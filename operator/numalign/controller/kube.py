"""The operator's Kubernetes client: one configuration shared by Kopf's login and the
synchronous ``kubernetes`` client the handlers use (they run in Kopf's thread pool)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

import kopf
import kubernetes.client as k8s
import kubernetes.config as k8s_config
from kubernetes.client.exceptions import ApiException

GROUP = "numalign.io"
VERSION = "v1alpha1"
NT_PLURAL = "nodetopologies"
TP_PLURAL = "topologypolicies"

_lock = threading.Lock()
_config: k8s.Configuration | None = None
_kubeconfig: str | None = None


def configure(kubeconfig: str | None) -> None:
    """Choose the credentials: an explicit kubeconfig, else $KUBECONFIG, else in-cluster,
    else ~/.kube/config. Loaded lazily by :func:`configuration`."""
    global _config, _kubeconfig
    with _lock:
        _config = None
        _kubeconfig = kubeconfig


def configuration() -> k8s.Configuration:
    global _config
    with _lock:
        if _config is None:
            cfg = k8s.Configuration()
            path = _kubeconfig or os.environ.get("KUBECONFIG")
            if path:
                k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                    config_file=path, client_configuration=cfg)
            else:
                try:
                    k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
                        client_configuration=cfg)
                except k8s_config.ConfigException:
                    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                        client_configuration=cfg)
            _config = cfg
        return _config


def connection_info() -> kopf.ConnectionInfo:
    """Kopf's view of the same credentials (used by the ``@kopf.on.login`` handler)."""
    cfg = configuration()
    token: str | None = None
    scheme: str | None = None
    auth = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
    if auth:
        scheme, _, token = str(auth).partition(" ")
        if not token:
            scheme, token = "Bearer", scheme
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert or None,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        default_namespace=None,
    )


_local = threading.local()


def api() -> k8s.ApiClient:
    client: k8s.ApiClient | None = getattr(_local, "client", None)
    if client is None:
        client = k8s.ApiClient(configuration())
        _local.client = client
    return client


def core() -> Any:  # typed loosely: dict bodies are fine at runtime
    return k8s.CoreV1Api(api())


def custom() -> Any:
    return k8s.CustomObjectsApi(api())


def apps() -> Any:
    return k8s.AppsV1Api(api())


def batch() -> Any:
    return k8s.BatchV1Api(api())


def to_dict(obj: Any) -> dict[str, Any]:
    """A client model object as the API's JSON (camelCase keys)."""
    out: dict[str, Any] = api().sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return out


def list_policies() -> list[dict[str, Any]]:
    try:
        res = custom().list_cluster_custom_object(GROUP, VERSION, TP_PLURAL)
    except ApiException as e:
        if e.status == 404:  # CRD not installed
            return []
        raise
    items: list[dict[str, Any]] = res.get("items", [])
    return items


def list_node_topologies() -> list[dict[str, Any]]:
    try:
        res = custom().list_cluster_custom_object(GROUP, VERSION, NT_PLURAL)
    except ApiException as e:
        if e.status == 404:
            return []
        raise
    items: list[dict[str, Any]] = res.get("items", [])
    return items


def get_node_topology(name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = custom().get_cluster_custom_object(GROUP, VERSION, NT_PLURAL, name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    return obj


def namespace_labels(name: str) -> dict[str, str]:
    try:
        ns = core().read_namespace(name)
    except ApiException as e:
        if e.status == 404:
            return {}
        raise
    labels: Mapping[str, str] | None = ns.metadata.labels
    return dict(labels or {})


def all_namespace_labels() -> dict[str, dict[str, str]]:
    return {ns.metadata.name: dict(ns.metadata.labels or {})
            for ns in core().list_namespace().items}


def is_status(e: BaseException, *codes: int) -> bool:
    return isinstance(e, ApiException) and e.status in codes


def event(obj: Mapping[str, Any], type_: str, *, reason: str, message: str) -> None:
    """Post a core/v1 Event about ``obj`` (never raises: events are best effort)."""
    import datetime as dt
    import uuid

    meta = obj.get("metadata") or {}
    ns = str(meta.get("namespace") or "default")
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{meta.get('name', 'numalign')}.{uuid.uuid4().hex[:12]}",
                     "namespace": ns},
        "involvedObject": {"apiVersion": obj.get("apiVersion", "v1"),
                           "kind": obj.get("kind", "Pod"), "name": meta.get("name"),
                           "namespace": meta.get("namespace"), "uid": meta.get("uid")},
        "type": type_, "reason": reason, "message": message[:1024],
        "source": {"component": "numalign-operator"}, "reportingComponent": "numalign.io/operator",
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    }
    try:
        core().create_namespaced_event(ns, body)
    except Exception:  # best effort
        logging.getLogger(__name__).debug("cannot post event", exc_info=True)
