"""Taking a real node down (:meth:`numalign.devcluster.realnode.RealNode.down`): stop its
processes, remove its containers, mounts, cgroups, bridge, container log links and folder,
and remove its Node from a control plane that still runs. It works from what is on disk
alone and trusts nothing it reads back: state.json's names are used only when they have
a real node's form, and a folder that is a symbolic link is unlinked, never followed."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from numalign.api.kube import REQUEST_ERRORS

from . import kubeproxy
from .cluster import DevCluster, Log
from .hostcgroups import (
    ForeignNameError,
    delete_bridge,
    kill_cgroups,
    own_bridge,
    own_cgroup_root,
    remove_cgroups,
    unmount_under,
)
from .processes import Process


class NodeOnDisk(Protocol):
    """What the teardown uses of :class:`numalign.devcluster.realnode.RealNode`."""

    cluster: DevCluster
    dir: Path
    name: str
    bridge: str
    cgroup_root: str

    def state(self) -> dict[str, Any]: ...

    def process(self, name: str) -> Process: ...

    def ctr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]: ...


CONTAINER_LOGS = Path("/var/log/containers")  # where the kubelet links container logs
# The kubelet's device plugin registry is there whatever its --root-dir: its mount
# namespace gets <root dir>/device-plugins there instead.
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
# Folders the kubelet creates on the host; removed at down() when empty.
HOST_DIRS = (DEVICE_PLUGINS, DEVICE_PLUGINS.parent, CONTAINER_LOGS, Path("/var/log/pods"))


def tear_down(node: NodeOnDisk, say: Log, keep_logs: bool = False) -> bool:
    """Stop everything and remove the containers, mounts, cgroups, network and state
    (``keep_logs``: all but ``logs/``, e.g. after a failed start); False when there was
    no real node."""
    if node.dir.is_symlink():
        # Not a folder up() made: its pid files, mounts and contents are someone
        # else's. Only the link goes.
        say(f"{node.dir} is a symbolic link, not a real node's folder: link removed, "
            "nothing it points to touched")
        node.dir.unlink()
        return False
    if not node.dir.is_dir():
        return False
    t0 = time.monotonic()
    st = node.state()
    bridge = own_name(st.get("bridge"), own_bridge, node.bridge, say)
    cgroup_root = own_name(st.get("cgroupRoot"), own_cgroup_root, node.cgroup_root, say)
    for name in ("agent", "device-plugin", "dra-plugin", "kube-proxy", "kubelet"):
        node.process(name).stop(timeout=10)
    if st.get("services"):
        error = kubeproxy.cleanup()
        if error:
            say(f"kube-proxy --cleanup: {error}")
    if node.process("containerd").is_running():
        _remove_containers(node)
    node.process("containerd").stop(timeout=10)
    kill_cgroups(cgroup_root)
    # Mount points are canonical paths: the state dir resolved (it may live under a
    # linked home), this folder itself not a link (checked above).
    unmount_under(node.cluster.state_dir.resolve() / node.dir.name)
    remove_cgroups(cgroup_root)
    delete_bridge(bridge)
    _remove_log_links(node)
    if keep_logs:
        for child in node.dir.iterdir():
            if child.name == "logs":
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
    else:
        shutil.rmtree(node.dir, ignore_errors=True)
    for d in HOST_DIRS:
        with contextlib.suppress(OSError):
            d.rmdir()  # only when empty: another kubelet's files stay
    _deregister(node)
    say(f"real node stopped and removed ({time.monotonic() - t0:.1f}s)")
    return True


def own_name(recorded: Any, check: Callable[[str], str], derived: str, say: Log) -> str:
    """The name state.json recorded when it has a real node's form, else the one this
    node derives (state.json is trusted for nothing it could use against the host)."""
    if recorded is None or recorded == derived:
        return derived
    try:
        return check(str(recorded))
    except ForeignNameError as e:
        say(f"state.json ignored: {e}; using {derived}")
        return derived


def _deregister(node: NodeOnDisk) -> None:
    """Remove the Node and its NodeTopology from a control plane that still runs."""
    if not node.cluster.is_running():
        return
    kube = node.cluster.kube()
    for path in (f"/api/v1/nodes/{node.name}",
                 f"/apis/numalign.io/v1alpha1/nodetopologies/{node.name}"):
        with contextlib.suppress(*REQUEST_ERRORS):
            kube.request("DELETE", path)


def _remove_containers(node: NodeOnDisk) -> None:
    """Kill and delete every task and container containerd holds for the CRI (the
    shims then exit and remove their sockets)."""
    proc = node.ctr("tasks", "list", "--quiet", timeout=30)
    tasks = proc.stdout.split() if proc.returncode == 0 else []
    for task in tasks:
        node.ctr("tasks", "kill", "--signal", "SIGKILL", task, timeout=30)
    for task in tasks:
        node.ctr("tasks", "delete", "--force", task, timeout=30)
    proc = node.ctr("containers", "list", "--quiet", timeout=30)
    for c in proc.stdout.split() if proc.returncode == 0 else []:
        node.ctr("containers", "delete", c, timeout=30)


def _remove_log_links(node: NodeOnDisk) -> None:
    logs = str(node.dir / "pod-logs")
    with contextlib.suppress(OSError):
        for link in CONTAINER_LOGS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and os.readlink(link).startswith(logs):
                    link.unlink()
