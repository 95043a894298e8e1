"""A root file system from Debian packages, fetched with apt (no image registry needed).

The packages asked for are resolved the way apt resolves an installation on an empty
system: ``apt-get --simulate install`` against an empty dpkg status file, without
Recommends, lists every package of their Depends/Pre-Depends closure with the version
apt picked (alternatives and virtual packages decided by apt itself). ``apt-get
download`` fetches exactly those versions from the machine's configured sources (run
``apt-get update`` first), and ``dpkg-deb --extract`` unpacks them into a tree; no
maintainer script runs. Documentation, manual pages and translations are removed (each
package's ``copyright`` file stays).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .oci import ImageError

Log = Callable[[str], None]

# "Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64]) []"; an upgrade shows the
# installed version in brackets first, which an empty status never has.
_INST = re.compile(r"^Inst (?P<name>[a-z0-9][a-z0-9+.-]+)(?: \[[^\]]*\])? "
                   r"\((?P<version>\S+) .*\[(?P<arch>[a-z0-9-]+)\]\)", re.M)
# what a rootfs without manual pages and translations does not need
PRUNED = ("usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian",
          "usr/share/bug", "usr/share/doc-base")


@dataclass(frozen=True, order=True)
class Package:
    name: str
    version: str
    arch: str

    @property
    def pin(self) -> str:
        """``name:arch=version``, as apt-get download takes it."""
        return f"{self.name}:{self.arch}={self.version}"

    @property
    def deb_name(self) -> str:
        """The file name apt-get download gives it (an epoch's ':' as '%3a')."""
        return f"{self.name}_{self.version.replace(':', '%3a')}_{self.arch}.deb"


def parse_simulation(text: str) -> list[Package]:
    """The packages ``apt-get --simulate install`` would install, sorted by name."""
    pkgs = {Package(m["name"], m["version"], m["arch"]) for m in _INST.finditer(text)}
    return sorted(pkgs)


def _apt_get() -> str:
    apt = shutil.which("apt-get")
    if apt is None or shutil.which("dpkg-deb") is None:
        raise ImageError("the image's Python runtime comes from Debian packages: this needs "
                         "apt-get and dpkg-deb (a Debian or Ubuntu machine with Debian 12 "
                         "'bookworm' sources)")
    return apt


def _run(cmd: Sequence[str], cwd: Path | None = None, timeout: float = 600) -> str:
    env = dict(os.environ, LC_ALL="C", DEBIAN_FRONTEND="noninteractive")
    proc = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        raise ImageError(f"'{' '.join(cmd[:3])} ...' failed: {tail}\n(if apt cannot find a "
                         "package or a version, run 'apt-get update' and build again)")
    return proc.stdout


def resolve(packages: Sequence[str], work: Path) -> list[Package]:
    """The closure of ``packages`` as apt would install it on an empty system."""
    apt = _apt_get()
    work.mkdir(parents=True, exist_ok=True)
    status = work / "empty-status"
    status.write_text("")
    out = _run([apt, "--simulate", "--quiet", "-o", f"Dir::State::status={status}",
                "-o", "APT::Install-Recommends=false", "-o", "APT::Install-Suggests=false",
                "-o", "Debug::NoLocking=true", "install", *packages])
    found = parse_simulation(out)
    missing = sorted(set(packages) - {p.name for p in found})
    if missing:
        raise ImageError(f"apt would not install {', '.join(missing)}: its output was\n"
                         f"{out[-1500:]}")
    return found


def download(pkgs: Sequence[Package], debs: Path, log: Log) -> list[Path]:
    """The ``.deb`` files of ``pkgs`` in ``debs`` (kept there: a cache), fetched with
    apt-get download where missing."""
    debs.mkdir(parents=True, exist_ok=True)
    missing = [p for p in pkgs if not (debs / p.deb_name).is_file()]
    if missing:
        log(f"apt-get download: {len(missing)} packages")
        _run([_apt_get(), "download", "--quiet", *(p.pin for p in missing)], cwd=debs)
    paths = [debs / p.deb_name for p in pkgs]
    absent = [p.name for p in paths if not p.is_file()]
    if absent:
        raise ImageError(f"apt-get download left no {', '.join(absent)} in {debs}")
    return paths


def unpack(debs: Sequence[Path], root: Path) -> None:
    """Extract each package's files into ``root`` and drop documentation (not copyrights)."""
    for deb in debs:
        _run(["dpkg-deb", "--extract", str(deb), str(root)])
    for sub in PRUNED:
        shutil.rmtree(root / sub, ignore_errors=True)
    doc = root / "usr/share/doc"
    if doc.is_dir():
        for path in sorted(doc.rglob("*"), reverse=True):
            if path.is_dir() and not path.is_symlink():
                if not any(path.iterdir()):
                    path.rmdir()
            elif path.name != "copyright":
                path.unlink()
