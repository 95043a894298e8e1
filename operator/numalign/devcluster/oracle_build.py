"""Build the kubelet oracle: a small Go program (``oracle/main.go`` next to this file)
that links the kubelet's own admission packages of ``build.KUBERNETES_VERSION`` and
answers like ``numalign admit`` (see ``numalign.testing.kubelet_oracle``).

Built the way the control plane is (a scratch module requiring k8s.io/kubernetes with
its staging modules replaced, ``GOTOOLCHAIN=local``, no cgo), into
``~/.cache/numalign/kubelet-oracle-<version>/``; the stamp records a hash of the source,
so a changed ``main.go`` is rebuilt and an interrupted build is not trusted.
"""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from . import build

SOURCE = Path(__file__).with_name("oracle") / "main.go"
MODULE = "numalign.local/kubeletoracle"


def oracle_dir(version: str = build.KUBERNETES_VERSION) -> Path:
    return build.cache_root() / f"kubelet-oracle-{version}"


def oracle_path(version: str = build.KUBERNETES_VERSION) -> Path:
    return oracle_dir(version) / "kubelet-oracle"


def _digest() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]


def _stamp(version: str) -> Path:
    return oracle_dir(version) / ".complete"


def is_built(version: str = build.KUBERNETES_VERSION) -> bool:
    stamp = _stamp(version)
    return (oracle_path(version).is_file() and stamp.is_file()
            and stamp.read_text().split()[:1] == [_digest()])


def ensure_oracle_built(version: str = build.KUBERNETES_VERSION,
                        log: Callable[[str], None] | None = None) -> Path:
    """Build (or reuse) the kubelet oracle; return the path of its binary."""
    say = log or (lambda _m: None)
    if is_built(version):
        return oracle_path(version)
    tc = build.find_go()
    say(f"building the kubelet oracle against Kubernetes {version} with {tc.version}")
    t0 = time.monotonic()
    out = oracle_dir(version)
    out.mkdir(parents=True, exist_ok=True)
    _stamp(version).unlink(missing_ok=True)
    work = build.cache_root() / "src" / f"kubelet-oracle-{version}"
    build.kubernetes_module(tc, work, MODULE, version, say)
    shutil.copyfile(SOURCE, work / "main.go")
    build.go_build(tc, work, str(oracle_path(version)), ["."], say)
    took = time.monotonic() - t0
    _stamp(version).write_text(f"{_digest()} {version} built in {took:.0f}s\n")
    say(f"kubelet oracle built in {took:.0f}s into {out}")
    return oracle_path(version)
