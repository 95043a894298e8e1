"""Credentials for the API server, loaded once for every client of the product.

Where they come from, first match wins: an explicit kubeconfig (and context),
``$KUBECONFIG``, the in-cluster service account, ``~/.kube/config``; or, for the dev
cluster's own bring-up, a server address with CA and client certificate files. Kubeconfig
parsing (exec plugins, embedded data, token files) is the official client's loader; only
the loaders are used, never its API classes.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

IN_CLUSTER_HOST = "KUBERNETES_SERVICE_HOST"
SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class ConfigError(ValueError):
    """No usable credentials."""


@dataclass
class KubeConfig:
    """Where the API server is and how to prove who we are."""

    host: str
    ca_file: str | None = None  # None: the system's trust store (or none, with insecure)
    cert_file: str | None = None
    key_file: str | None = None
    insecure: bool = False  # skip server certificate verification
    token_source: Callable[[], str | None] | None = None  # "Bearer ..." (or "Basic ...")
    username: str | None = None
    password: str | None = None
    namespace: str | None = None  # the kubeconfig context's (or the pod's) namespace
    extra_headers: dict[str, str] = field(default_factory=dict)
    _ssl: ssl.SSLContext | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_files(cls, server: str, ca: Path | str | None, cert: Path | str | None = None,
                   key: Path | str | None = None) -> KubeConfig:
        """A server address with a CA bundle (None: do not verify) and a client
        certificate and key (None: anonymous)."""
        if (cert is None) != (key is None):
            raise ConfigError("client certificate and key go together (cert, key)")
        return cls(host=server.rstrip("/"), ca_file=None if ca is None else str(ca),
                   cert_file=None if cert is None else str(cert),
                   key_file=None if key is None else str(key), insecure=ca is None)

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            if self.insecure:
                ctx = ssl.create_default_context()
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            else:
                ctx = ssl.create_default_context(cafile=self.ca_file)
            if self.cert_file:
                ctx.load_cert_chain(self.cert_file, self.key_file)
            self._ssl = ctx
        return self._ssl

    def auth_header(self) -> str | None:
        if self.token_source is None:
            return None
        value = self.token_source()
        return str(value) if value else None

    def bearer_token(self) -> tuple[str | None, str | None]:
        """(scheme, token) of the Authorization header, for clients that take them apart
        (Kopf's login)."""
        auth = self.auth_header()
        if not auth:
            return None, None
        scheme, _, token = auth.partition(" ")
        if not token:
            return "Bearer", scheme
        return scheme, token


def kubeconfig_path(explicit: str | None = None) -> str | None:
    """The kubeconfig to read: ``explicit``, else the first of ``$KUBECONFIG``, else None
    (in-cluster, then ``~/.kube/config``)."""
    if explicit:
        return explicit
    env = os.environ.get("KUBECONFIG", "")
    first = next((p for p in env.split(os.pathsep) if p), None)
    return first


def load_config(kubeconfig: str | None = None, context: str | None = None) -> KubeConfig:
    """Credentials from ``kubeconfig`` (and ``context``), else ``$KUBECONFIG``, else the
    in-cluster service account, else ``~/.kube/config``."""
    from kubernetes import client as kclient
    from kubernetes import config as kconfig

    conf = kclient.Configuration()
    path = kubeconfig_path(kubeconfig)
    default = os.path.expanduser("~/.kube/config")
    namespace: str | None = None
    try:
        if path is None and os.environ.get(IN_CLUSTER_HOST):
            kconfig.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=conf)
            try:
                namespace = Path(SA_NAMESPACE).read_text().strip() or None
            except OSError:
                namespace = None
        else:
            if path is None and not os.path.exists(default):
                raise ConfigError("no credentials: pass --kubeconfig, set KUBECONFIG, run "
                                  "in a pod, or write ~/.kube/config")
            path = path or default
            kconfig.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=conf)
            namespace = _context_namespace(kconfig, path, context)
    except (kconfig.ConfigException, OSError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"kubeconfig {path or default}: {e}") from e
    cfg = _from_client_configuration(conf)
    cfg.namespace = namespace
    return cfg


def _context_namespace(kconfig: Any, path: str, context: str | None) -> str | None:
    contexts, active = kconfig.list_kube_config_contexts(config_file=path)
    if context:
        active = next((c for c in contexts if c.get("name") == context), active)
    ns = ((active or {}).get("context") or {}).get("namespace")
    return str(ns) if ns else None


def _from_client_configuration(conf: Any) -> KubeConfig:
    def token() -> str | None:
        # The loaders file a kubeconfig token under BearerToken, the in-cluster one
        # (refreshed by its hook) under authorization.
        value = (conf.get_api_key_with_prefix("authorization")
                 or conf.get_api_key_with_prefix("BearerToken"))
        if not value and conf.username:
            value = conf.get_basic_auth_token()
        return str(value) if value else None

    return KubeConfig(host=str(conf.host).rstrip("/"), ca_file=conf.ssl_ca_cert or None,
                      cert_file=conf.cert_file or None, key_file=conf.key_file or None,
                      insecure=not conf.verify_ssl, token_source=token,
                      username=conf.username or None, password=conf.password or None)
