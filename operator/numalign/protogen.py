"""What the proto stub generators share (:mod:`numalign.kubeletapi.generate`,
:mod:`numalign.nriapi.generate`): the Go module a proto comes from, gogoproto's options
removed, grpcio-tools' ``protoc``, and which generated files are not current."""

from __future__ import annotations

import filecmp
import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path


class GenerateError(RuntimeError):
    pass


def module_dir(module: str, version: str, go: str = "go") -> Path:
    """The folder of Go module ``module@version``, downloaded if needed."""
    if shutil.which(go) is None:
        raise GenerateError(f"{go!r} is not on PATH (the protos come from the Go module cache)")
    ref = f"{module}@{version}"
    proc = subprocess.run([go, "mod", "download", "-json", ref], capture_output=True,
                          text=True, check=False, cwd=tempfile.gettempdir())
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        info = {}
    if proc.returncode != 0 or not info.get("Dir"):
        detail = info.get("Error") or proc.stderr.strip() or f"exit {proc.returncode}"
        raise GenerateError(f"go mod download {ref}: {detail}")
    return Path(info["Dir"])


_GOGO_IMPORT = re.compile(r'^\s*import\s+"[^"]*gogo\.proto"\s*;\s*\n', re.M)
_GOGO_FILE_OPTION = re.compile(r"^\s*option\s+\(gogoproto\.[^)]*\)\s*=\s*[^;]*;\s*\n", re.M)
_FIELD_OPTIONS = re.compile(r"\s*\[([^\]]*)\]")


def strip_gogo(text: str) -> str:
    """The proto without gogoproto's import, file options and field options (they only
    steer Go code generation)."""
    text = _GOGO_IMPORT.sub("", text)
    text = _GOGO_FILE_OPTION.sub("", text)

    def fields(m: re.Match[str]) -> str:
        kept = [o.strip() for o in m.group(1).split(",")
                if o.strip() and not o.strip().startswith("(gogoproto.")]
        return f" [{', '.join(kept)}]" if kept else ""

    return _FIELD_OPTIONS.sub(fields, text)


def protoc(args: list[str]) -> None:
    """grpcio-tools' protoc (a dev dependency) with its well-known protos included."""
    from grpc_tools import protoc as tool  # dev dependency: grpcio-tools

    include = str(Path(tool.__file__).resolve().parent / "_proto")
    code = tool.main(["grpc_tools.protoc", f"-I{include}", *args])
    if code != 0:
        raise GenerateError(f"grpc_tools.protoc {' '.join(args)} failed (exit {code})")


def stale(out_root: Path, fresh_root: Path, files: Iterable[Path]) -> list[str]:
    """Of ``files`` (relative paths), those that differ between the two trees."""
    bad: list[str] = []
    for rel in files:
        a, b = out_root / rel, fresh_root / rel
        if not a.exists() or not b.exists() or not filecmp.cmp(a, b, shallow=False):
            bad.append(str(rel))
    return bad
