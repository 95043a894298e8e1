"""Build the real node's binaries from their Go modules: the kubelet and kube-proxy (same
Kubernetes version and module set as the control plane), containerd v2 and ``ctr``, runc
and the CNI plugins bridge, host-local, loopback and portmap.

They are cached under ``~/.cache/numalign/realnode-<versions>/bin`` with a stamp file
of their own, so the control plane's cache (:mod:`numalign.devcluster.build`) stays
valid and each can be rebuilt alone.

runc is built with its ``seccomp`` support, which links libseccomp through cgo: the
build needs a C compiler, pkg-config and the libseccomp headers. Where the headers are
missing and this runs as root on a machine with apt-get, the build installs
``libseccomp-dev`` itself (the OS's runc package would be an older runc than the one
containerd v2 is tested with); elsewhere it stops with an error that says what to install.
kube-proxy programs netfilter with the ``iptables`` and ``nft`` commands: the build installs
``iptables`` and ``nftables`` the same way where they are missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from .build import (
    KUBERNETES_VERSION,
    BuildError,
    Toolchain,
    _build_kubernetes,
    _run,
    cache_root,
    find_go,
)

CONTAINERD_VERSION = "v2.4.2"
RUNC_VERSION = "v1.5.3"
CNI_PLUGINS_VERSION = "v1.10.0"
CNI_PLUGINS = {
    "bridge": "plugins/main/bridge",
    "host-local": "plugins/ipam/host-local",
    "loopback": "plugins/main/loopback",
    "portmap": "plugins/meta/portmap",
}
NODE_BINARIES = ("kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "ctr",
                 "runc")
SECCOMP_PACKAGE = "libseccomp-dev"
NETFILTER_PACKAGES = {"iptables": "iptables", "nft": "nftables"}  # command: package

Log = Callable[[str], None]


def node_dir(version: str = KUBERNETES_VERSION) -> Path:
    """The real node's build root: ``bin/`` (kubelet, containerd, ctr, runc) and
    ``cni/`` (the CNI plugins)."""
    return cache_root() / (f"realnode-k8s-{version}-containerd-{CONTAINERD_VERSION}"
                           f"-runc-{RUNC_VERSION}-cni-{CNI_PLUGINS_VERSION}")


def node_bin_dir(version: str = KUBERNETES_VERSION) -> Path:
    return node_dir(version) / "bin"


def cni_bin_dir(version: str = KUBERNETES_VERSION) -> Path:
    return node_dir(version) / "cni"


def _stamp(version: str) -> Path:
    return node_dir(version) / ".complete"


def _all_present(version: str) -> bool:
    b, c = node_bin_dir(version), cni_bin_dir(version)
    return (all((b / n).is_file() for n in NODE_BINARIES)
            and all((c / n).is_file() for n in CNI_PLUGINS))


def is_node_built(version: str = KUBERNETES_VERSION) -> bool:
    return _stamp(version).exists() and _all_present(version)


def _scratch(name: str, requires: dict[str, str], main: str | None = None) -> Path:
    """A scratch module under ``src/<name>`` that requires ``requires``."""
    work = cache_root() / "src" / name
    work.mkdir(parents=True, exist_ok=True)
    req = "".join(f"require {m} {v}\n" for m, v in requires.items())
    (work / "go.mod").write_text(f"module numalign.local/{name.split('-')[0]}build\n\n"
                                 f"go 1.26\n\n{req}")
    if main is not None:
        (work / "main.go").write_text(main)
    return work


def _tools_go(pkgs: list[str]) -> str:
    imports = "\n".join(f'\t_ "{p}"' for p in pkgs)
    return f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n"


def _build_containerd(tc: Toolchain, out: Path, log: Log) -> None:
    mod = "github.com/containerd/containerd/v2"
    pkgs = [f"{mod}/cmd/containerd", f"{mod}/cmd/containerd-shim-runc-v2", f"{mod}/cmd/ctr"]
    work = _scratch(f"containerd-{CONTAINERD_VERSION}", {mod: CONTAINERD_VERSION})
    (work / "tools.go").write_text(_tools_go(pkgs))
    _run([tc.go, "mod", "tidy", "-e"], work, log)
    ldflags = f"-s -w -X {mod}/version.Version={CONTAINERD_VERSION}"
    _run([tc.go, "build", "-trimpath", "-tags", "no_btrfs", "-ldflags", ldflags,
          "-o", str(out) + "/", *pkgs], work, log)


def _apt_install(packages: list[str], hint: str, say: Log) -> None:
    """``apt-get install`` ``packages`` where this runs as root with apt-get; BuildError
    with ``hint`` otherwise or when it fails."""
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise BuildError(hint)
    say(f"installing {', '.join(packages)} with apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in ([apt, "update", "-qq"],
                [apt, "install", "-y", "-qq", "--no-install-recommends", *packages]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0 and cmd[1] == "install":
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-10:])
            raise BuildError(f"{hint}\n'apt-get install' failed:\n{tail}")


def _seccomp_headers(say: Log) -> None:
    """Make sure libseccomp's headers are there (installing them when we can)."""
    def have() -> bool:
        return subprocess.run(["pkg-config", "--exists", "libseccomp"],
                              capture_output=True, check=False).returncode == 0

    if shutil.which("pkg-config") and have():
        return
    hint = (f"runc's seccomp support needs a C compiler, pkg-config and the libseccomp headers: "
            f"install them (Debian/Ubuntu: 'apt-get install gcc pkg-config {SECCOMP_PACKAGE}') "
            "and run 'numalign dev build --real-node' again")
    _apt_install([SECCOMP_PACKAGE, "pkg-config"], hint, say)
    if not (shutil.which("pkg-config") and have()):
        raise BuildError(hint)


def missing_netfilter_tools() -> list[str]:
    """The packages of the netfilter commands kube-proxy runs that are not installed."""
    return [pkg for cmd, pkg in NETFILTER_PACKAGES.items() if shutil.which(cmd) is None]


def ensure_netfilter_tools(say: Log) -> None:
    """kube-proxy's ``iptables`` and ``nft`` (installing them when we can)."""
    missing = missing_netfilter_tools()
    if not missing:
        return
    hint = (f"kube-proxy needs the iptables and nft commands: install them (Debian/Ubuntu: "
            f"'apt-get install {' '.join(missing)}') and run 'numalign dev build --real-node' "
            "again")
    _apt_install(missing, hint, say)
    if missing_netfilter_tools():
        raise BuildError(hint)


def _build_runc(tc: Toolchain, out: Path, log: Log) -> None:
    if shutil.which("gcc") is None and shutil.which("cc") is None:
        raise BuildError("runc needs a C compiler (cgo): install gcc "
                         "(Debian/Ubuntu: 'apt-get install gcc')")
    _seccomp_headers(log)
    mod = "github.com/opencontainers/runc"
    work = _scratch(f"runc-{RUNC_VERSION}", {mod: RUNC_VERSION})
    (work / "tools.go").write_text(_tools_go([mod]))
    _run([tc.go, "mod", "tidy", "-e"], work, log)
    ldflags = f"-X main.version={RUNC_VERSION.lstrip('v')}"
    _run([tc.go, "build", "-trimpath", "-tags", "seccomp urfave_cli_no_docs",
          "-ldflags", ldflags, "-o", str(out / "runc"), mod], work, log, cgo=True)


def _build_cni(tc: Toolchain, out: Path, log: Log) -> None:
    mod = "github.com/containernetworking/plugins"
    pkgs = {name: f"{mod}/{path}" for name, path in CNI_PLUGINS.items()}
    work = _scratch(f"cni-plugins-{CNI_PLUGINS_VERSION}", {mod: CNI_PLUGINS_VERSION})
    (work / "tools.go").write_text(_tools_go(list(pkgs.values())))
    _run([tc.go, "mod", "tidy", "-e"], work, log)
    out.mkdir(parents=True, exist_ok=True)
    ldflags = f"-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion" \
              f".BuildVersion={CNI_PLUGINS_VERSION}"
    _run([tc.go, "build", "-trimpath", "-ldflags", ldflags, "-o", str(out) + "/",
          *pkgs.values()], work, log)


def ensure_node_built(version: str = KUBERNETES_VERSION, log: Log | None = None) -> Path:
    """Build (or reuse) the real node's binaries; return the build root (``bin/``, ``cni/``)."""
    say = log or (lambda _m: None)
    root = node_dir(version)
    if is_node_built(version) and not missing_netfilter_tools():
        return root
    tc = find_go()
    say(f"building the real node (kubelet and kube-proxy {version}, containerd "
        f"{CONTAINERD_VERSION}, runc {RUNC_VERSION}, CNI plugins {CNI_PLUGINS_VERSION}) "
        f"with {tc.version}; cached afterwards")
    bins, cni = node_bin_dir(version), cni_bin_dir(version)
    bins.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    steps: list[tuple[str, bool, Callable[[], None]]] = [
        ("runc", (bins / "runc").is_file(), lambda: _build_runc(tc, bins, say)),
        ("CNI plugins", all((cni / n).is_file() for n in CNI_PLUGINS),
         lambda: _build_cni(tc, cni, say)),
        ("containerd", all((bins / n).is_file()
                           for n in ("containerd", "containerd-shim-runc-v2", "ctr")),
         lambda: _build_containerd(tc, bins, say)),
        ("kubelet", (bins / "kubelet").is_file(),
         lambda: _build_kubernetes(tc, version, bins, say, ("kubelet",), "kubelet")),
        ("kube-proxy", (bins / "kube-proxy").is_file(),
         lambda: _build_kubernetes(tc, version, bins, say, ("kube-proxy",), "kube-proxy")),
        ("iptables and nftables", not missing_netfilter_tools(),
         lambda: ensure_netfilter_tools(say)),
    ]
    times: list[str] = []
    for name, done, step in steps:
        if done:
            continue
        t = time.monotonic()
        step()
        times.append(f"{name} {time.monotonic() - t:.0f}s")
        say(f"{name} built ({time.monotonic() - t:.0f}s)")
    if not _all_present(version):
        raise BuildError(f"the real node's build left binaries missing in {root}")
    _stamp(version).write_text(f"built in {time.monotonic() - t0:.0f}s: {', '.join(times)}\n")
    say(f"real node built in {time.monotonic() - t0:.0f}s into {root}")
    return root

