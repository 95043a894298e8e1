"""What a real node leaves on the host, found and removed: its cgroups in every hierarchy
(the processes in them killed first) and the mounts under its folder.

Teardown runs as root from names read back from disk, so each function here accepts only
the names a real node derives itself: a cgroup root ``/numalign-<8 hex digits>``
(:func:`own_cgroup_root`) and a bridge ``nal<8 hex digits>`` (:func:`own_bridge`);
anything else (``/``, ``lo``, ``../system.slice``) raises :class:`ForeignNameError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

_DIGEST = "[0-9a-f]{8}"
CGROUP_ROOT_PATTERN = re.compile(f"/numalign-{_DIGEST}")
BRIDGE_PATTERN = re.compile(f"nal{_DIGEST}")


class ForeignNameError(ValueError):
    """A cgroup root or bridge name that a real node does not derive: never touched."""


def node_digest(state_dir: Path) -> str:
    """The digest a real node's host names carry: of its cluster's resolved state dir."""
    return hashlib.sha1(str(state_dir.resolve()).encode()).hexdigest()[:8]


def own_cgroup_root(name: str) -> str:
    """``name`` when it is a real node's cgroup root (``/numalign-<digest>``)."""
    if not CGROUP_ROOT_PATTERN.fullmatch(name):
        raise ForeignNameError(f"cgroup root {name!r} is not a real node's "
                               "(expected /numalign-<8 hex digits>)")
    return name


def own_bridge(name: str) -> str:
    """``name`` when it is a real node's bridge (``nal<digest>``)."""
    if not BRIDGE_PATTERN.fullmatch(name):
        raise ForeignNameError(f"bridge {name!r} is not a real node's "
                               "(expected nal<8 hex digits>)")
    return name


def mountinfo() -> list[tuple[str, str]]:
    """(mount point, file system type) of every mount, in mount order."""
    out = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) >= 5 and right:
                point = fields[4].encode().decode("unicode_escape")
                out.append((point, right.split()[0]))
    return out


def cgroup_hierarchies() -> list[Path]:
    """The cgroup v1 hierarchies (or the cgroup v2 root) mounted under /sys/fs/cgroup."""
    points = [Path(p) for p, fs in mountinfo()
              if fs in ("cgroup", "cgroup2") and p.startswith("/sys/fs/cgroup")]
    return sorted(set(points))


def cgroup_dirs(cgroup_root: str) -> list[Path]:
    """Every cgroup under ``cgroup_root`` (the kubelet's), in every hierarchy, deepest first.
    Raises :class:`ForeignNameError` for a root that is not a real node's."""
    root = own_cgroup_root(cgroup_root).lstrip("/")
    dirs: list[Path] = []
    for h in cgroup_hierarchies():
        top = h / root
        if top.is_dir() and not top.is_symlink():
            dirs += [Path(p) for p, _, _ in os.walk(top)]
    return sorted(dirs, key=lambda p: len(p.parts), reverse=True)


def kill_cgroups(cgroup_root: str) -> None:
    """SIGKILL what still runs in those cgroups (containers and the shims the node started)."""
    for _ in range(3):
        pids: set[int] = set()
        for d in cgroup_dirs(cgroup_root):
            if (d / "freezer.state").is_file():
                with contextlib.suppress(OSError):
                    (d / "freezer.state").write_text("THAWED")
            with contextlib.suppress(OSError, ValueError):
                pids |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)


def remove_cgroups(cgroup_root: str) -> None:
    for _ in range(10):
        left = []
        for d in cgroup_dirs(cgroup_root):
            try:
                d.rmdir()
            except OSError:
                left.append(d)
        if not left:
            return
        time.sleep(0.3)


def unmount_under(base: Path) -> None:
    """Detach every mount at or under ``base`` (volumes, netns, shm, rootfs, the shared
    root dir), deepest first. ``base`` is taken as it is (the caller resolved it without
    following a link out of its folder); a relative path or ``/`` raises ValueError."""
    if not base.is_absolute() or base == Path(base.anchor):
        raise ValueError(f"unmount_under({str(base)!r}): expected an absolute path below /")
    top = str(base)
    for _ in range(3):
        points = [p for p, _ in mountinfo() if p == top or p.startswith(top + "/")]
        if not points:
            return
        for p in sorted(set(points), key=len, reverse=True):
            subprocess.run(["umount", "--lazy", p], capture_output=True, check=False)


def delete_bridge(bridge: str) -> bool:
    """``ip link delete`` a real node's bridge when it exists (True then)."""
    name = own_bridge(bridge)
    if not Path(f"/sys/class/net/{name}").exists():
        return False
    subprocess.run(["ip", "link", "delete", name], capture_output=True, check=False)
    return True


def add_host_address(address: str) -> None:
    """Give this host ``address`` (a /32 on the loopback device), unless it has it."""
    proc = subprocess.run(["ip", "-4", "addr", "show", "dev", "lo"], capture_output=True,
                          text=True, check=False)
    if f" {address}/" in proc.stdout:
        return
    proc = subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise OSError(f"ip addr add {address}/32 dev lo: {proc.stderr.strip()}")


def remove_host_address(address: str) -> None:
    """Take ``address`` off the loopback device (nothing when it is not there)."""
    subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], capture_output=True,
                   check=False)
