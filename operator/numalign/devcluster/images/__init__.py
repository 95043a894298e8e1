"""The real node's two images, built locally (no registry is reachable):

- ``numalign.local/pause:dev``: the pod sandbox; waits for signals, reaps children, exits
  0 on SIGTERM/SIGINT.
- ``numalign.local/workload:dev``: prints its ``Cpus_allowed_list`` and
  ``Mems_allowed_list`` lines of ``/proc/self/status``, then sleeps until signalled
  (``/workload status`` prints them and exits, ``/workload cat FILE...`` prints files:
  the image has no shell).

Both are small static Go programs (``go/`` next to this file) built with the local Go
toolchain (``CGO_ENABLED=0``) and cached under ``~/.cache/numalign/images-<key>/`` (the
key covers the sources and the Go version), then written as OCI image-layout archives
that ``ctr -n k8s.io images import`` names as above.

numalign's own image, ``numalign.local/numalign:dev`` (``numalign dev image``), is built
from Debian's packages and this checkout by :mod:`.numalign_image`.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..build import BuildError, _go_env, _run, cache_root, find_go
from .oci import Descriptor, ImageError, ImageFile, ImageSpec, write_oci_archive

__all__ = [
    "IMAGES",
    "PAUSE_IMAGE",
    "WORKLOAD_IMAGE",
    "BuildError",
    "ImageError",
    "ProgramImage",
    "build_images",
    "build_programs",
    "source_dir",
]

PAUSE_IMAGE = "numalign.local/pause:dev"
WORKLOAD_IMAGE = "numalign.local/workload:dev"


@dataclass(frozen=True)
class ProgramImage:
    """An image made of one Go program (``go/<program>``) at ``/<program>``."""

    name: str
    program: str
    archive: str  # file name of the OCI archive

    def spec(self, binary: bytes, architecture: str) -> ImageSpec:
        return ImageSpec(
            name=self.name,
            files=[ImageFile(f"/{self.program}", binary, 0o755)],
            entrypoint=[f"/{self.program}"],
            architecture=architecture,
            labels={"io.numalign.image": self.program},
        )


IMAGES = (
    ProgramImage(PAUSE_IMAGE, "pause", "pause.oci.tar"),
    ProgramImage(WORKLOAD_IMAGE, "workload", "workload.oci.tar"),
)


def source_dir() -> Path:
    """The Go module with the programs' sources (shipped with the package)."""
    return Path(__file__).resolve().parent / "go"


def _source_key(go_version: str, goarch: str) -> str:
    h = hashlib.sha256(f"{go_version}\n{goarch}\n".encode())
    src = source_dir()
    for f in sorted(p for p in src.rglob("*") if p.is_file() and p.suffix in (".go", ".mod")):
        h.update(f.relative_to(src).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _goarch(go: str) -> str:
    proc = subprocess.run([go, "env", "GOARCH"], env=_go_env(), capture_output=True,
                          text=True, check=False)
    arch = proc.stdout.strip()
    if proc.returncode != 0 or not arch:
        raise BuildError(f"'go env GOARCH' failed: {proc.stderr.strip() or 'no output'}")
    return arch


def build_programs(log: Callable[[str], None] | None = None) -> tuple[Path, str]:
    """Build (or reuse) the static programs; return their directory and GOARCH."""
    say = log or (lambda _m: None)
    tc = find_go()
    goarch = _goarch(tc.go)
    out = cache_root() / f"images-{_source_key(tc.version, goarch)}"
    stamp = out / ".complete"
    programs = [img.program for img in IMAGES]
    if stamp.exists() and all((out / p).is_file() for p in programs):
        return out, goarch
    t0 = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build into a fresh folder and move it in place: a half-built cache is never trusted.
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        _run([tc.go, "build", "-trimpath", "-ldflags", "-s -w", "-o", str(tmp) + "/",
              *[f"./{p}" for p in programs]], source_dir(), say)
        (tmp / ".complete").write_text(f"{tc.version} GOARCH={goarch}\n")
        if out.exists() and not stamp.exists():
            shutil.rmtree(out, ignore_errors=True)  # an interrupted build
        try:
            tmp.rename(out)
        except OSError:
            if not stamp.exists():  # not a concurrent build that finished first
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    say(f"image programs built in {time.monotonic() - t0:.1f}s into {out}")
    return out, goarch


def build_images(out_dir: Path, log: Callable[[str], None] | None = None) -> list[Path]:
    """Write the OCI archives of ``numalign.local/pause:dev`` and
    ``numalign.local/workload:dev`` into ``out_dir``; return their paths (pause first).

    Import them with ``ctr -n k8s.io images import FILE``; the image names come from the
    archives' annotations."""
    bins, goarch = build_programs(log)
    paths: list[Path] = []
    for img in IMAGES:
        path = Path(out_dir) / img.archive
        manifest: Descriptor = write_oci_archive(
            img.spec((bins / img.program).read_bytes(), goarch), path)
        if log:
            log(f"{img.name}: {path} (manifest {manifest.digest[:19]})")
        paths.append(path)
    return paths
