"""The one client's credentials: which kubeconfig wins, what it yields, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from numalign.api.kube import ApiError, ConfigError, KubeConfig, is_status, load_config


def _kubeconfig(path: Path, contexts: dict[str, tuple[str, str]], current: str) -> Path:
    """contexts: name -> (server, token)."""
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [{"name": n, "cluster": {"server": s, "insecure-skip-tls-verify": True}}
                     for n, (s, _) in contexts.items()],
        "users": [{"name": n, "user": {"token": t}} for n, (_, t) in contexts.items()],
        "contexts": [{"name": n, "context": {"cluster": n, "user": n}} for n in contexts],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_explicit_kubeconfig_and_context(no_env: Path) -> None:
    kc = _kubeconfig(no_env / "kc", {"a": ("https://a.example:6443", "ta"),
                                     "b": ("https://b.example:6443/", "tb")}, "a")
    cfg = load_config(str(kc))
    assert (cfg.host, cfg.auth_header(), cfg.insecure) == ("https://a.example:6443",
                                                           "Bearer ta", True)
    cfg = load_config(str(kc), context="b")
    assert cfg.host == "https://b.example:6443"
    assert cfg.bearer_token() == ("Bearer", "tb")


def test_kubeconfig_env_then_home(no_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = no_env / "home" / ".kube"
    home.mkdir(parents=True)
    _kubeconfig(home / "config", {"h": ("https://home.example", "th")}, "h")
    assert load_config().host == "https://home.example"
    env = _kubeconfig(no_env / "env", {"e": ("https://env.example", "te")}, "e")
    monkeypatch.setenv("KUBECONFIG", f"{env}:{home / 'config'}")
    assert load_config().host == "https://env.example"


def test_no_credentials_is_a_clear_error(no_env: Path) -> None:
    with pytest.raises(ConfigError, match="KUBECONFIG"):
        load_config()
    with pytest.raises(ConfigError, match="nowhere"):
        load_config(str(no_env / "nowhere"))


def test_files_need_cert_and_key_together(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cert, key"):
        KubeConfig.from_files("https://x", None, cert=tmp_path / "c.crt")
    cfg = KubeConfig.from_files("https://x:6443/", None)
    assert cfg.host == "https://x:6443" and cfg.insecure and cfg.auth_header() is None


def test_api_error_carries_status_and_reason() -> None:
    e = ApiError(409, {"kind": "Status", "reason": "AlreadyExists", "message": "exists"},
                 "POST", "/api/v1/namespaces/x/pods")
    assert (e.status, e.reason, e.message) == (409, "AlreadyExists", "exists")
    assert is_status(e, 404, 409) and not is_status(e, 404)
    assert not is_status(ValueError("x"), 409)
    assert ApiError(502, "bad gateway").reason == ""


def test_kopf_logs_in_with_the_same_credentials(no_env: Path) -> None:
    from numalign.controller import connection

    kc = _kubeconfig(no_env / "kc", {"a": ("https://a.example:6443", "ta")}, "a")
    connection.configure(str(kc))
    try:
        info = connection.connection_info()
        assert (info.server, info.scheme, info.token, info.insecure) == (
            "https://a.example:6443", "Bearer", "ta", True)
        assert info.certificate_path is None and info.username is None
    finally:
        connection.configure(None)
