"""What a real node leaves on the host, found and removed: its cgroups in every hierarchy
(the processes in them killed first) and the mounts under its folder."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path


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
    """Every cgroup under ``cgroup_root`` (the kubelet's), in every hierarchy, deepest first."""
    dirs: list[Path] = []
    for h in cgroup_hierarchies():
        top = h / cgroup_root.lstrip("/")
        if top.is_dir():
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
    root dir), deepest first."""
    top = str(base.resolve())
    for _ in range(3):
        points = [p for p, _ in mountinfo() if p == top or p.startswith(top + "/")]
        if not points:
            return
        for p in sorted(set(points), key=len, reverse=True):
            subprocess.run(["umount", "--lazy", p], capture_output=True, check=False)
