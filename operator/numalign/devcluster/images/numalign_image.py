"""``numalign.local/numalign:dev``: the operator and the agent in one image, built here
without an image registry (``numalign dev image``).

Three layers, each cached under ``~/.cache/numalign/image/`` by the key of its inputs:

1. ``debian``: Debian's Python 3.11 runtime (:data:`PACKAGES` and their Depends closure,
   as apt resolves them, see :mod:`.debian`), its standard library byte-compiled, and
   the image's ``/etc/passwd``, ``/etc/group`` and ``/tmp``. Key: the package versions.
2. ``deps``: a virtual environment at :data:`VENV` (``pyvenv.cfg`` pointing at Debian's
   ``/usr/bin/python3.11``) with numalign's dependencies at the versions pinned in
   ``requirements.lock``. pip resolves numalign's wheel with the lock as constraints,
   so a lock that misses a dependency, or pins a version that does not fit, is an error.
   Key: the lock, ``pyproject.toml``'s dependencies and the Python version.
3. ``kube-scheduler``: :data:`KUBE_SCHEDULER`, the kube-scheduler of the cluster's
   Kubernetes version (:data:`..build.KUBERNETES_VERSION`), the very binary the dev
   cluster builds and runs (``~/.cache/numalign/k8s-*/bin``, built once there), for the
   second scheduler of ``config/scheduler`` and the chart's ``scheduler.enabled``. Key:
   the binary's hash.
4. ``numalign``: the project's wheel installed into the same environment (the console
   script ``numalign`` included). Key: a hash of the wheel's sources.

The layout, entry point, user and environment are the Dockerfile's (a unit test compares
them), so the image runs under the same manifests whichever way it was built.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..build import KUBERNETES_VERSION, BuildError, cache_root, ensure_built
from ..demo import REPO
from . import debian
from .layers import cached_layer
from .oci import Descriptor, ImageError, ImageSpec, Layer, write_oci_archive

Log = Callable[[str], None]

IMAGE = "numalign.local/numalign:dev"
ARCHIVE = "numalign.oci.tar"
PYTHON_MINOR = "3.11"
PYTHON = f"/usr/bin/python{PYTHON_MINOR}"
# Debian's Python runtime; libstdc++6 for grpcio's extension module
PACKAGES = (f"python{PYTHON_MINOR}-minimal", f"libpython{PYTHON_MINOR}-stdlib", "libstdc++6")
VENV = "/opt/numalign"
# The second scheduler's binary (config/scheduler); the Dockerfile copies the same path
# from the official image of the same version.
KUBE_SCHEDULER = "/usr/local/bin/kube-scheduler"
SITE_PACKAGES = f"{VENV}/lib/python{PYTHON_MINOR}/site-packages"
UID = GID = 65532
USER = f"{UID}:{GID}"
PASSWD = ("root:x:0:0:root:/root:/usr/sbin/nologin\n"
          f"nonroot:x:{UID}:{GID}:nonroot:/tmp:/usr/sbin/nologin\n")
GROUP = f"root:x:0:\nnonroot:x:{GID}:\n"
ENTRYPOINT = ("numalign",)
CMD = ("--help",)
ENV = (
    f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONDONTWRITEBYTECODE=1",
    "PYTHONUNBUFFERED=1",
    "HOME=/tmp",
)
EXPOSED_PORTS = ("8080/tcp", "8081/tcp", "9090/tcp", "9443/tcp")
LABELS = {
    "org.opencontainers.image.title": "numalign",
    "org.opencontainers.image.description":
        "NUMA and device-topology alignment for Kubernetes",
    "org.opencontainers.image.source": "https://github.com/numalign/numalign",
    "org.opencontainers.image.licenses": "Apache-2.0",
}
LOCK = "requirements.lock"
# The files the wheel is built from (the Dockerfile's build context, .dockerignore)
SOURCES = ("pyproject.toml", "README.md", "operator")
# What the runtime wheel leaves out (pyproject.toml's packages.find): the development
# install's packages, so that changing them builds no new image.
DEV_ONLY = ("operator/numalign/devcluster", "operator/numalign/testing")
# Bumped when the way a layer is made changes, so older cached layers are not reused.
RECIPE = "1"


def repo_root() -> Path:
    """The source checkout this package runs from (the image is built from it)."""
    root = REPO
    if not (root / "pyproject.toml").is_file() or not (root / "operator/numalign").is_dir():
        raise ImageError(f"the image is built from numalign's source tree, and {root} is not "
                         "one: install numalign from a checkout (pip install -e .)")
    return root


def _hash(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "big") + part)
    return h.hexdigest()[:16]


def parse_lock(text: str) -> dict[str, str]:
    """``name==version`` lines (comments and blanks skipped) -> {normalized name: version}."""
    pins: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)", line)
        if m is None:
            raise ImageError(f"{LOCK} line {n}: {line!r} is not 'name==version'")
        pins[normalize(m.group(1))] = m.group(2)
    return pins


def normalize(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _check_python() -> None:
    if f"{sys.version_info[0]}.{sys.version_info[1]}" != PYTHON_MINOR:
        raise ImageError(f"the image's Python is Debian's {PYTHON_MINOR}: build it with a "
                         f"Python {PYTHON_MINOR} interpreter (pip picks wheels and compiles "
                         f"byte code for the running one), not {platform.python_version()}")


def _pip(args: Sequence[str], log: Log, timeout: float = 900) -> str:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    log("$ pip " + " ".join(args[:6]) + (" ..." if len(args) > 6 else ""))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                          env=dict(os.environ, PIP_NO_INPUT="1"))
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise ImageError(f"'pip {' '.join(args[:2])}' failed:\n{tail}")
    return proc.stdout


def update_lock(repo: Path, log: Log) -> Path:
    """Resolve numalign's dependencies for this Python and write them to the lock."""
    _check_python()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        _pip(["install", "--dry-run", "--ignore-installed", "--quiet", "--report",
              str(report), str(_staged(repo, Path(tmp) / "src"))], log)
        doc = json.loads(report.read_text())
    pins = sorted((normalize(i["metadata"]["name"]), i["metadata"]["version"])
                  for i in doc["install"] if normalize(i["metadata"]["name"]) != "numalign")
    lines = ["# numalign's runtime dependencies as installed in the image (numalign dev image",
             "# and the Dockerfile use it as pip constraints). Regenerate with:",
             "#   numalign dev image --update-lock", *(f"{n}=={v}" for n, v in pins)]
    out = repo / LOCK
    out.write_text("\n".join(lines) + "\n")
    log(f"{out.name}: {len(pins)} pins")
    return out


def source_files(repo: Path) -> list[Path]:
    """The files the wheel is built from (paths relative to ``repo``), without byte code,
    build metadata left by earlier builds, or the development install's packages."""
    out: list[Path] = []
    for top in SOURCES:
        base = repo / top
        if base.is_file():
            out.append(Path(top))
            continue
        out += sorted(p.relative_to(repo) for p in base.rglob("*") if p.is_file()
                      and not any(part == "__pycache__" or part.endswith(".egg-info")
                                  for part in p.parts) and p.suffix != ".pyc"
                      and not any(p.relative_to(repo).is_relative_to(d) for d in DEV_ONLY))
    return out


def source_key(repo: Path) -> str:
    """A hash of every file the wheel is built from."""
    h = hashlib.sha256()
    for rel in source_files(repo):
        h.update(rel.as_posix().encode() + b"\0" + (repo / rel).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _staged(repo: Path, dest: Path) -> Path:
    """A copy of the wheel's sources in ``dest``: pip builds there, leaving the checkout
    without build/ and egg-info."""
    for rel in source_files(repo):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / rel, dest / rel)
    return dest


def _dependencies(repo: Path) -> bytes:
    """pyproject.toml's [project] dependencies, as the deps layer's key sees them."""
    import tomllib

    doc = tomllib.loads((repo / "pyproject.toml").read_text())
    return json.dumps(doc["project"].get("dependencies", [])).encode()


def _compile(tree: Path, top: str) -> None:
    """Byte-compile ``tree/top`` for the image: paths as the image sees them, and pycs
    checked by nothing (layers carry no modification times; the root is read-only)."""
    target = tree / top.lstrip("/")
    proc = subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0",
                           "--invalidation-mode", "unchecked-hash", "-s", str(tree), "-p", "/",
                           str(target)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ImageError(f"byte-compiling {top} failed: {(proc.stdout + proc.stderr)[-800:]}")


def _debian_layer(cache: Path, log: Log) -> tuple[Layer, str]:
    """The runtime layer and Debian's Python version (``3.11.2``)."""
    pkgs = debian.resolve(PACKAGES, cache / "apt")
    python = next(p for p in pkgs if p.name == PACKAGES[0])
    version = python.version.split(":")[-1].split("-")[0]
    key = _hash(RECIPE.encode(), "\n".join(p.pin for p in pkgs).encode(), PASSWD.encode(),
                GROUP.encode())

    def build(tree: Path) -> None:
        log(f"Debian packages: {len(pkgs)} ({', '.join(p.name for p in pkgs)})")
        debian.unpack(debian.download(pkgs, cache / "debs", log), tree)
        if not (tree / PYTHON.lstrip("/")).is_file():
            raise ImageError(f"the packages {', '.join(PACKAGES)} hold no {PYTHON}")
        _compile(tree, f"/usr/lib/python{PYTHON_MINOR}")
        (tree / "etc").mkdir(exist_ok=True)
        (tree / "etc/passwd").write_text(PASSWD)
        (tree / "etc/group").write_text(GROUP)
        (tree / "tmp").mkdir(exist_ok=True)
        (tree / "tmp").chmod(0o1777)

    return cached_layer(cache / "layers", "debian", key, build, log), version


def file_hash(path: Path) -> str:
    """The sha256 of a file, read in chunks (binaries of ~100 MiB)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _scheduler_layer(cache: Path, binary: Path, log: Log) -> Layer:
    """:data:`KUBE_SCHEDULER`: ``binary`` (the dev cluster's kube-scheduler), mode 0755."""
    if not binary.is_file():
        raise ImageError(f"no kube-scheduler at {binary}: build the control plane "
                         "('numalign dev build')")
    key = _hash(RECIPE.encode(), KUBERNETES_VERSION.encode(), file_hash(binary).encode())

    def build(tree: Path) -> None:
        dest = tree / KUBE_SCHEDULER.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(binary, dest)
        dest.chmod(0o755)

    return cached_layer(cache / "layers", "kube-scheduler", key, build, log)


def _venv_skeleton(tree: Path, python_version: str) -> None:
    """What ``python -m venv --without-pip`` makes, for the image's interpreter."""
    venv = tree / VENV.lstrip("/")
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / f"lib/python{PYTHON_MINOR}/site-packages").mkdir(parents=True, exist_ok=True)
    (venv / "lib64").symlink_to("lib")
    (venv / "pyvenv.cfg").write_text(
        f"home = {Path(PYTHON).parent}\ninclude-system-site-packages = false\n"
        f"version = {python_version}\nexecutable = {PYTHON}\n"
        f"command = {PYTHON} -m venv {VENV}\n")
    (venv / f"bin/python{PYTHON_MINOR}").symlink_to(PYTHON)
    (venv / "bin/python3").symlink_to(f"python{PYTHON_MINOR}")
    (venv / "bin/python").symlink_to(f"python{PYTHON_MINOR}")


def _install(tree: Path, args: Sequence[str], log: Log) -> None:
    """pip install into the image's environment under ``tree``, its scripts made to run
    with the image's interpreter."""
    prefix = tree / VENV.lstrip("/")
    _pip(["install", "--quiet", "--no-compile", "--no-warn-script-location",
          "--ignore-installed", "--prefix", str(prefix), *args], log)
    fix_scripts(prefix / "bin")


def fix_scripts(bindir: Path) -> None:
    """Make pip's Python scripts in ``bindir`` run with the environment's interpreter."""
    for script in sorted(bindir.iterdir()):
        if script.is_symlink() or not script.is_file():
            continue
        lines = script.read_bytes().split(b"\n")
        # pip's shebang names the build's interpreter; a long path gets a /bin/sh
        # trampoline of three lines instead (the image has no shell)
        trampoline = lines[0] == b"#!/bin/sh" and len(lines) > 3 and \
            lines[1].startswith(b"'''exec'")
        head = 3 if trampoline else 1
        if lines[0].startswith(b"#!") and b"python" in b"\n".join(lines[:head]):
            shebang = f"#!{VENV}/bin/python{PYTHON_MINOR}".encode()
            script.write_bytes(b"\n".join([shebang, *lines[head:]]))


def _own_files(site: Path, name: str) -> list[Path]:
    """The files a distribution's RECORD lists (relative to site-packages)."""
    records = list(site.glob(f"{name}-*.dist-info/RECORD"))
    if len(records) != 1:
        raise ImageError(f"{name} is not installed once in {site}")
    out = []
    for line in records[0].read_text().splitlines():
        path = line.split(",", 1)[0]
        if path:
            out.append((site / path).resolve())
    return out


def _remove_empty_dirs(top: Path) -> None:
    for dirpath, _dirs, _files in os.walk(top, topdown=False):
        with contextlib.suppress(OSError):  # not empty: kept
            Path(dirpath).rmdir()


def check_pins(site: Path, pins: dict[str, str]) -> None:
    """Every distribution pip installed is pinned, at the version installed."""
    bad = []
    for meta in sorted(site.glob("*.dist-info/METADATA")):
        text = meta.read_text(errors="replace")
        name = re.search(r"^Name: (.+)$", text, re.M)
        version = re.search(r"^Version: (.+)$", text, re.M)
        if name is None or version is None:
            raise ImageError(f"{meta}: no Name or Version")
        n = normalize(name.group(1).strip())
        if n != "numalign" and pins.get(n) != version.group(1).strip():
            bad.append(f"{n} {version.group(1).strip()} (lock: {pins.get(n, 'missing')})")
    if bad:
        raise ImageError(f"{LOCK} does not pin what numalign needs: {', '.join(bad)}; "
                         "run 'numalign dev image --update-lock'")


def _wheel(repo: Path, out: Path, log: Log) -> Path:
    src = _staged(repo, out / "src")
    _pip(["wheel", "--quiet", "--no-deps", "--wheel-dir", str(out), str(src)], log)
    wheels = sorted(out.glob("numalign-*.whl"))
    if len(wheels) != 1:
        raise ImageError(f"pip wheel left {len(wheels)} numalign wheels in {out}")
    return wheels[0]


def build_image(out_dir: Path | None = None, log: Log | None = None) -> tuple[Path, Descriptor]:
    """Build (layers from the cache where current) and write the OCI archive of
    :data:`IMAGE`; return its path and manifest descriptor."""
    say = log or (lambda _m: None)
    _check_python()
    repo = repo_root()
    cache = cache_root() / "image"
    out = (out_dir or cache) / ARCHIVE
    t0 = time.monotonic()
    base, python_version = _debian_layer(cache, say)
    try:
        scheduler = _scheduler_layer(cache, ensure_built(log=say) / "kube-scheduler", say)
    except BuildError as e:
        raise ImageError(f"kube-scheduler {KUBERNETES_VERSION}: {e}") from None
    lock_text = (repo / LOCK).read_text() if (repo / LOCK).is_file() else ""
    pins = parse_lock(lock_text)
    if not pins:
        raise ImageError(f"{repo / LOCK} is missing or empty: run "
                         "'numalign dev image --update-lock'")
    machine = platform.machine()
    deps_key = _hash(RECIPE.encode(), lock_text.encode(), _dependencies(repo),
                     python_version.encode(), machine.encode())
    src_key = _hash(RECIPE.encode(), source_key(repo).encode(), python_version.encode())
    with tempfile.TemporaryDirectory(prefix="numalign-wheel-") as tmp:
        wheel: list[Path] = []

        def the_wheel() -> Path:
            if not wheel:
                wheel.append(_wheel(repo, Path(tmp), say))
            return wheel[0]

        def build_deps(tree: Path) -> None:
            _venv_skeleton(tree, python_version)
            _install(tree, ["--constraint", str(repo / LOCK), str(the_wheel())], say)
            site = tree / SITE_PACKAGES.lstrip("/")
            check_pins(site, pins)
            for path in _own_files(site, "numalign"):  # numalign is the next layer's
                if path.is_file() or path.is_symlink():
                    path.unlink()
            for top in site.glob("numalign*"):
                _remove_empty_dirs(top)
            _compile(tree, VENV)

        def build_app(tree: Path) -> None:
            _install(tree, ["--no-deps", str(the_wheel())], say)
            _compile(tree, VENV)

        deps = cached_layer(cache / "layers", "deps", deps_key, build_deps, say)
        app = cached_layer(cache / "layers", "numalign", src_key, build_app, say)
    spec = image_spec((base, deps, scheduler, app), _oci_arch(machine))
    manifest = write_oci_archive(spec, out)
    size = sum(layer.size for layer in spec.layers)
    say(f"{IMAGE}: {out} ({size / 2**20:.1f} MiB in layers, manifest {manifest.digest[:19]}, "
        f"{time.monotonic() - t0:.1f}s)")
    return out, manifest


def image_spec(layers: Sequence[Layer], architecture: str) -> ImageSpec:
    """The image's description: its layers and the run configuration (the Dockerfile's)."""
    return ImageSpec(name=IMAGE, files=(), layers=tuple(layers), entrypoint=ENTRYPOINT,
                     cmd=CMD, env=ENV, user=USER, working_dir="/",
                     exposed_ports=EXPOSED_PORTS, labels=LABELS, architecture=architecture)


def _oci_arch(machine: str) -> str:
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}
    if machine not in arch:
        raise ImageError(f"no image for this machine's architecture {machine!r}")
    return arch[machine]
