"""Build Helm (``helm.sh/helm/v4``) from its Go module, for the chart's tests (``helm lint``,
``helm template``) and installs into the local cluster.

Cached under ``~/.cache/numalign/helm-<version>/helm`` with a stamp file, built in a
scratch module like the real node's tools (:mod:`numalign.devcluster.nodebuild`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from .build import _run, cache_root, find_go
from .nodebuild import _scratch, _tools_go

HELM_VERSION = "v4.3.1"
HELM_MODULE = "helm.sh/helm/v4"

Log = Callable[[str], None]


def helm_dir(version: str = HELM_VERSION) -> Path:
    return cache_root() / f"helm-{version}"


def helm_path(version: str = HELM_VERSION) -> Path:
    return helm_dir(version) / "helm"


def is_helm_built(version: str = HELM_VERSION) -> bool:
    return (helm_dir(version) / ".complete").exists() and helm_path(version).is_file()


def ensure_helm_built(version: str = HELM_VERSION, log: Log | None = None) -> Path:
    """Build (or reuse) ``helm``; return its path."""
    say = log or (lambda _m: None)
    if is_helm_built(version):
        return helm_path(version)
    tc = find_go()
    say(f"building helm {version} with {tc.version} (cached afterwards)")
    t0 = time.monotonic()
    pkg = f"{HELM_MODULE}/cmd/helm"
    work = _scratch(f"helm-{version}", {HELM_MODULE: version})
    (work / "tools.go").write_text(_tools_go([pkg]))
    _run([tc.go, "mod", "tidy", "-e"], work, say)
    out = helm_dir(version)
    out.mkdir(parents=True, exist_ok=True)
    ldflags = f"-s -w -X {HELM_MODULE}/internal/version.version={version}"
    _run([tc.go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(helm_path(version)),
          pkg], work, say)
    (out / ".complete").write_text(f"{version} built in {time.monotonic() - t0:.0f}s\n")
    say(f"helm {version} built in {time.monotonic() - t0:.0f}s into {out}")
    return helm_path(version)
