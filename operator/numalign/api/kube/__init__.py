"""The one Kubernetes API client: :class:`Kube` (asyncio), its credentials
(:func:`load_config`), its one error type (:class:`ApiError`) and a synchronous facade
(:class:`SyncKube`) for synchronous code."""

from .client import (
    JSON,
    JSON_PATCH,
    MERGE_PATCH,
    METADATA_ONLY,
    NT_BASE,
    REQUEST_ERRORS,
    STRATEGIC_PATCH,
    TRANSPORT_ERRORS,
    ApiError,
    Kube,
    is_status,
    nt_path,
    pod_path,
    q,
)
from .config import ConfigError, KubeConfig, kubeconfig_path, load_config
from .sync import SyncKube

__all__ = [
    "JSON", "JSON_PATCH", "MERGE_PATCH", "METADATA_ONLY", "NT_BASE", "REQUEST_ERRORS",
    "STRATEGIC_PATCH", "TRANSPORT_ERRORS", "ApiError", "ConfigError", "Kube", "KubeConfig",
    "SyncKube", "is_status", "kubeconfig_path", "load_config", "nt_path", "pod_path", "q",
]
