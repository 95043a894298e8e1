"""The runtime wheel (what ``pip install .`` and the image install) ships the operator,
the agent, the extender and their commands, and neither the dev cluster
(``numalign.devcluster``) nor the test oracles (``numalign.testing``), even when an earlier
editable install left an egg-info that lists them. Every module it ships imports without
them, and ``numalign dev`` from it says what to install instead of a traceback.

The wheel is built from a copy of the wheel's sources (the checkout keeps no build/ or
egg-info) with the development install's setuptools, offline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEV_ONLY = ("numalign/devcluster/", "numalign/testing/")


def _stage(dest: Path) -> Path:
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    shutil.copytree(REPO / "operator", dest / "operator",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    # What an editable install of an earlier layout leaves behind: an egg-info whose
    # SOURCES.txt lists every file, the dev cluster's included.
    egg = dest / "operator" / "numalign.egg-info"
    egg.mkdir()
    listed = sorted(p.relative_to(dest).as_posix()
                    for p in (dest / "operator" / "numalign").rglob("*") if p.is_file())
    (egg / "SOURCES.txt").write_text("\n".join(["pyproject.toml", *listed]) + "\n")
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    src = _stage(tmp_path_factory.mktemp("wheel-src"))
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                           "--no-build-isolation", "--no-index", "--wheel-dir", str(out),
                           str(src)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    [whl] = out.glob("numalign-*.whl")
    yield whl


@pytest.fixture(scope="module")
def unpacked(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("unpacked")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(root)
    return root


def test_the_wheel_ships_the_runtime_and_not_the_dev_cluster_or_the_oracles(
        wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        entry_points = next(z.read(n).decode() for n in names
                            if n.endswith(".dist-info/entry_points.txt"))
    assert not [n for n in names if n.startswith(DEV_ONLY)]
    for module in ("cli.py", "commands/operator.py", "commands/agent.py",
                   "commands/extender.py", "commands/kubectl.py", "controller/main.py",
                   "agent/node.py", "extender/server.py", "api/allocation.py", "topology/admit.py",
                   "kubeletapi/podresources_v1/api_pb2.py", "nriapi/v1alpha1/api_pb2.py",
                   "py.typed"):
        assert f"numalign/{module}" in names, module
    assert "numalign = numalign.cli:main" in entry_points
    assert "kubectl-numalign = numalign.commands.kubectl:main" in entry_points


def _run(unpacked: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Python with the unpacked wheel first on its path: ``numalign`` is the wheel's, and
    ``numalign.devcluster`` is not found (the package's path is the wheel's alone)."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          cwd=unpacked, env=dict(os.environ, PYTHONPATH=str(unpacked)),
                          timeout=120, check=False)


def test_every_module_of_the_wheel_imports_without_the_dev_packages(unpacked: Path) -> None:
    modules = sorted(".".join(p.relative_to(unpacked).with_suffix("").parts)
                     .removesuffix(".__init__")
                     for p in (unpacked / "numalign").rglob("*.py"))
    code = ("import importlib, sys, numalign\n"
            f"assert numalign.__path__ == [{str(unpacked / 'numalign')!r}], numalign.__path__\n"
            f"for m in {modules!r}:\n"
            "    importlib.import_module(m)\n"
            "bad = sorted(m for m in sys.modules if m.startswith(('numalign.devcluster', "
            "'numalign.testing')))\n"
            "assert not bad, bad\n"
            "print(len(sys.modules))\n")
    proc = _run(unpacked, "-c", code)
    assert proc.returncode == 0, proc.stderr


def test_numalign_dev_from_the_wheel_names_the_development_install(unpacked: Path) -> None:
    proc = _run(unpacked, "-m", "numalign.cli", "dev", "up")
    assert proc.returncode == 2
    assert proc.stderr == ("numalign: 'dev' needs the development install (it is not in the "
                           "runtime wheel): pip install -e '.[dev]' from a checkout of "
                           "numalign\n")
    assert "Traceback" not in proc.stderr
    help_ = _run(unpacked, "-m", "numalign.cli", "--help")
    assert help_.returncode == 0 and "operator" in help_.stdout
