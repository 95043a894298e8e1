"""A private containerd v2 for tests of the agent's NRI plugin: its own state, sockets and
NRI socket under the test's tmp_path, the CRI enabled (NRI hooks into containers created
through the CRI), the local images imported. Started and stopped by the test; stopping it
removes its pods, containers, shims and mounts.

The binaries come from the real node's build (``numalign.devcluster.nodebuild``, the local
real node): when that build code is not on this branch, or its binaries are not built, or
this machine cannot run containers (not root), the tests skip with that reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from numalign.devcluster.images import PAUSE_IMAGE

K8S_NAMESPACE = "k8s.io"


def node_bin_dir_or_none() -> Path | None:
    """The real node's binaries, when built and when their build code is here."""
    try:
        from numalign.devcluster import nodebuild  # type: ignore[attr-defined]
    except ImportError:
        return None
    return Path(nodebuild.node_bin_dir()) if nodebuild.is_node_built() else None


def node_bin_dir() -> Path:
    try:
        from numalign.devcluster import nodebuild  # type: ignore[attr-defined]
    except ImportError:
        pytest.skip("the real node's build code (numalign.devcluster.nodebuild) is not on "
                    "this branch: containerd v2 is built there")
    if not nodebuild.is_node_built():
        pytest.skip(f"containerd v2 is not built in {nodebuild.node_bin_dir()} "
                    "(numalign dev build --real-node builds it)")
    return Path(nodebuild.node_bin_dir())


@dataclass
class Containerd:
    bins: Path
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
    # the cgroup parent of the tests' pods, removed at cleanup
    cgroup_parent: str = field(default_factory=lambda: f"/numalign-test-{uuid.uuid4().hex[:8]}")

    @property
    def socket(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def nri_socket(self) -> Path:
        return self.dir / "nri.sock"

    @property
    def log(self) -> Path:
        return self.dir / "containerd.log"

    def ctr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bins / "ctr"), "--address", str(self.socket),
                               "--namespace", K8S_NAMESPACE, *args],
                              capture_output=True, text=True, timeout=timeout, check=False)

    def write_config(self) -> None:
        d = self.dir
        for sub in ("root", "state", "runc", "cni", "nri/plugins", "nri/conf", "opt"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        q = json.dumps
        rt = "plugins.'io.containerd.cri.v1.runtime'"
        (d / "config.toml").write_text(f"""version = 3
root = {q(str(d / 'root'))}
state = {q(str(d / 'state'))}

[grpc]
  address = {q(str(self.socket))}

[ttrpc]
  address = {q(str(d / 'containerd.sock.ttrpc'))}

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = {q(str(d / 'opt'))}
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = {q(PAUSE_IMAGE)}
  [{rt}]
    enable_selinux = false
    # root here may lack CAP_SYS_RESOURCE: the sandbox's oom_score_adj of -998 is refused
    restrict_oom_score_adj = true
    [{rt}.containerd]
      default_runtime_name = 'runc'
      [{rt}.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [{rt}.containerd.runtimes.runc.options]
          BinaryName = {q(str(self.bins / 'runc'))}
          Root = {q(str(d / 'runc'))}
          SystemdCgroup = false
    [{rt}.cni]
      conf_dir = {q(str(d / 'cni'))}
  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = {q(str(self.nri_socket))}
    plugin_path = {q(str(d / 'nri/plugins'))}
    plugin_config_path = {q(str(d / 'nri/conf'))}
    plugin_registration_timeout = '5s'
    plugin_request_timeout = '5s'
""")

    def start(self, timeout: float = 60) -> None:
        env = {**os.environ, "PATH": f"{self.bins}:{os.environ.get('PATH', '')}"}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(self.bins / "containerd"), "--config", str(self.dir / "config.toml")],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"containerd exited {self.proc.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            if self.socket.exists() and self.ctr("version", timeout=10).returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"containerd not ready in {timeout}s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def shim_pids(self) -> list[int]:
        """The shims of this containerd (their command line names its socket)."""
        pids = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                cmd = (p / "cmdline").read_bytes().split(b"\0")
                if cmd and cmd[0].endswith(b"containerd-shim-runc-v2") and \
                        str(self.socket).encode() in cmd:
                    pids.append(int(p.name))
        return pids

    def cleanup(self) -> None:
        """Kill what this containerd left: its tasks, shims, and mounts under its folder."""
        if self.proc is not None and self.proc.poll() is None:
            listed = self.ctr("tasks", "list", "--quiet", timeout=30)
            for task in listed.stdout.split():
                self.ctr("tasks", "kill", "--signal", "SIGKILL", task, timeout=30)
        self.stop()
        for pid in self.shim_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for point in sorted((m for m in mounts if m.startswith(str(self.dir))), reverse=True):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            top = hierarchy / self.cgroup_parent.lstrip("/")
            if top.is_dir():
                for root, _dirs, _files in sorted(os.walk(top), reverse=True):
                    with contextlib.suppress(OSError):
                        Path(root).rmdir()


