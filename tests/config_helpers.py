"""config/ rendered with kubectl's built-in kustomize, and the accessors the tests of its
manifests share (tests/unit's config tests, tests/helm's chart tests)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "config"
IMAGE = "ghcr.io/numalign/numalign:0.1.0"
Obj = dict[str, Any]


def kustomize(path: Path) -> list[Obj]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (with its built-in kustomize) must be on PATH"
    proc = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True,
                          check=False, timeout=60)
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def of_kind(objs: list[Obj], *kinds: str) -> list[Obj]:
    return [o for o in objs if o["kind"] in kinds]


def pod_spec(obj: Obj) -> Obj:
    spec: Obj = obj["spec"]
    if obj["kind"] == "Pod":
        return spec
    if obj["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    result: Obj = spec["template"]["spec"]
    return result


def containers(obj: Obj) -> Iterator[Obj]:
    spec = pod_spec(obj)
    yield from spec.get("initContainers") or []
    yield from spec.get("containers") or []


@cache
def _default() -> tuple[Obj, ...]:
    return tuple(kustomize(CONFIG / "default"))


def default_objects() -> list[Obj]:
    """config/default rendered (once per test session)."""
    return list(_default())


def default_overlay(tmp_path: Path, **fields: Any) -> list[Obj]:
    """An overlay of config/default in ``tmp_path`` with ``fields`` (namePrefix,
    components, ...), rendered."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(CONFIG / "default", tmp_path)], **fields}))
    return kustomize(tmp_path)


def named(objs: list[Obj], kind: str, name: str) -> Obj:
    [obj] = [o for o in of_kind(objs, kind) if o["metadata"]["name"] == name]
    return obj


def role_rules(objs: list[Obj], name: str) -> list[Obj]:
    rules: list[Obj] = named(objs, "ClusterRole", name)["rules"]
    return rules
