"""Build the local control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) from their Go modules with the machine's Go toolchain.

Binaries are cached under ``~/.cache/numalign/k8s-<version>/bin`` (override the
root with ``NUMALIGN_CACHE``); a finished build is marked by a stamp file, so an
interrupted build is resumed rather than trusted.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KUBERNETES_VERSION = "v1.37.2"
ETCD_VERSION = "v3.7.3"
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
BINARIES = ("etcd", *COMPONENTS)


class BuildError(RuntimeError):
    """The control plane could not be built; the message says what to do."""


@dataclass(frozen=True)
class Toolchain:
    go: str
    version: str


def cache_root() -> Path:
    env = os.environ.get("NUMALIGN_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "numalign"


def bin_dir(version: str = KUBERNETES_VERSION) -> Path:
    return cache_root() / f"k8s-{version}-etcd-{ETCD_VERSION}" / "bin"


def _stamp(version: str) -> Path:
    return bin_dir(version) / ".complete"


def is_built(version: str = KUBERNETES_VERSION) -> bool:
    d = bin_dir(version)
    return _stamp(version).exists() and all((d / b).is_file() for b in BINARIES)


def find_go() -> Toolchain:
    go = shutil.which("go")
    if go is None:
        for cand in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go"):
            if Path(cand).is_file():
                go = cand
                break
    if go is None:
        raise BuildError(
            "the Go toolchain was not found: install Go 1.26 or newer "
            "(e.g. 'apt-get install golang-1.26' or a Go tarball) and put 'go' on PATH"
        )
    out = subprocess.run([go, "version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"go(\d+)\.(\d+)", out)
    if not m or (int(m.group(1)), int(m.group(2))) < (1, 26):
        raise BuildError(
            f"Kubernetes {KUBERNETES_VERSION} needs Go >= 1.26, found {out.strip() or 'nothing'}: "
            "install a newer Go toolchain"
        )
    return Toolchain(go=go, version=out.strip())


def _go_env(cgo: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("GOTOOLCHAIN", "local")
    env.setdefault("GOFLAGS", "-buildvcs=false")
    env["CGO_ENABLED"] = "1" if cgo else "0"
    return env


def _run(cmd: list[str], cwd: Path, log: Callable[[str], None], cgo: bool = False) -> str:
    log("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, cwd=cwd, env=_go_env(cgo), capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-25:])
        raise BuildError(f"'{' '.join(cmd[:3])} ...' failed in {cwd}:\n{tail}")
    return proc.stdout


def _staging_modules(go: str, work: Path, version: str, log: Callable[[str], None]) -> list[str]:
    """The k8s.io/* modules that k8s.io/kubernetes replaces with its staging tree."""
    out = _run([go, "mod", "download", "-json", f"k8s.io/kubernetes@{version}"], work, log)
    info = json.loads(out)
    gomod = Path(info["GoMod"]).read_text()
    return sorted(set(re.findall(r"^\s*(k8s\.io/[\w.-]+)\s*=>\s*\./staging/", gomod, re.M)))


def _ldflags(version: str) -> str:
    m = re.match(r"v(\d+)\.(\d+)", version)
    assert m
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={m.group(1)}",
            f"-X {pkg}.gitMinor={m.group(2)}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate={stamp}",
        ]
    return " ".join(flags)


def kubernetes_module(tc: Toolchain, work: Path, module: str, version: str,
                      log: Callable[[str], None]) -> None:
    """Make ``work`` a scratch Go module ``module`` that requires k8s.io/kubernetes
    ``version`` with its staging modules replaced by their released versions (what
    k8s.io/kubernetes' own go.mod points at its staging tree)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text(f"module {module}\n\ngo 1.26\n")
    minor = version.split(".", 1)[1]
    staging = _staging_modules(tc.go, work, version, log)
    lines = [
        f"module {module}",
        "",
        "go 1.26",
        "",
        f"require k8s.io/kubernetes {version}",
        "",
        "replace (",
    ]
    lines += [f"\t{mod} => {mod} v0.{minor}" for mod in staging]
    lines += [")", ""]
    (work / "go.mod").write_text("\n".join(lines))


def go_build(tc: Toolchain, work: Path, out: str, pkgs: list[str], log: Callable[[str], None],
             ldflags: str = "-s -w") -> None:
    """``go mod tidy`` then ``go build -trimpath`` in ``work`` (a scratch module)."""
    _run([tc.go, "mod", "tidy", "-e"], work, log)
    _run([tc.go, "build", "-trimpath", "-ldflags", ldflags, "-o", out, *pkgs], work, log)


def _build_kubernetes(tc: Toolchain, version: str, out: Path, log: Callable[[str], None],
                      components: tuple[str, ...] = COMPONENTS, src: str = "kubernetes") -> None:
    """Build ``k8s.io/kubernetes/cmd/<component>`` for each component in a scratch module
    under ``src/<src>-<version>`` (one per set of components: builds never share one)."""
    work = cache_root() / "src" / f"{src}-{version}"
    kubernetes_module(tc, work, "numalign.local/k8sbuild", version, log)
    imports = "\n".join(f'\t_ "k8s.io/kubernetes/cmd/{c}"' for c in components)
    (work / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n")
    pkgs = [f"k8s.io/kubernetes/cmd/{c}" for c in components]
    go_build(tc, work, str(out) + "/", pkgs, log, ldflags=_ldflags(version))


def _build_etcd(tc: Toolchain, out: Path, log: Callable[[str], None]) -> None:
    work = cache_root() / "src" / f"etcd-{ETCD_VERSION}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "go.mod").write_text(
        "module numalign.local/etcdbuild\n\ngo 1.26\n\n"
        f"require go.etcd.io/etcd/server/v3 {ETCD_VERSION}\n"
    )
    (work / "main.go").write_text(
        "package main\n\nimport (\n\t\"os\"\n\n\t\"go.etcd.io/etcd/server/v3/etcdmain\"\n)\n\n"
        "func main() { etcdmain.Main(os.Args) }\n"
    )
    go_build(tc, work, str(out / "etcd"), ["."], log)


def ensure_built(
    version: str = KUBERNETES_VERSION, log: Callable[[str], None] | None = None
) -> Path:
    """Build (or reuse) the control plane binaries; return their directory."""
    say = log or (lambda _m: None)
    out = bin_dir(version)
    if is_built(version):
        return out
    tc = find_go()
    say(f"building the control plane {version} and etcd {ETCD_VERSION} with {tc.version} "
        "(a cold build takes about 8 minutes on 2 cores; it is cached afterwards)")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if not (out / "etcd").is_file():
        _build_etcd(tc, out, say)
        say(f"etcd built ({time.monotonic() - t0:.0f}s)")
    if not all((out / c).is_file() for c in COMPONENTS):
        _build_kubernetes(tc, version, out, say)
    _stamp(version).write_text(f"{version} {ETCD_VERSION} built in {time.monotonic() - t0:.0f}s\n")
    say(f"control plane built in {time.monotonic() - t0:.0f}s into {out}")
    return out


def main() -> int:
    try:
        d = ensure_built(log=lambda m: print(m, file=sys.stderr, flush=True))
    except BuildError as e:
        print(f"numalign: {e}", file=sys.stderr)
        return 1
    print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
