"""``numalign dev down`` trusts nothing it reads back: a hostile real-node state.json
(cgroup root ``/``, bridge ``lo``) or a state folder that is a symbolic link touches
nothing outside the real node's own names.

Nothing here acts on the host: the cgroup hierarchies, mounts, host folders and the
signal, ``umount`` and ``ip`` calls are redirected into a temporary tree or recorded.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from numalign.devcluster import hostcgroups, realnode, realnode_down
from numalign.devcluster.cluster import DevCluster
from numalign.devcluster.hostcgroups import (
    ForeignNameError,
    own_bridge,
    own_cgroup_root,
    unmount_under,
)
from numalign.devcluster.processes import Process
from numalign.devcluster.realnode import RealNode


class Host:
    """A fake host: one cgroup hierarchy under ``root/cgroup``, a mount table, and every
    kill, ``umount`` and ``ip`` call recorded instead of done."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.hierarchy = root / "cgroup"
        self.mounts: list[tuple[str, str]] = []
        self.killed: list[int] = []
        self.commands: list[list[str]] = []
        # The system's own cgroups, with processes, at the top of the hierarchy.
        for name in ("", "system.slice", "user.slice"):
            d = self.hierarchy / name
            d.mkdir(parents=True, exist_ok=True)
            (d / "cgroup.procs").write_text("1\n4242\n")
        monkeypatch.setattr(hostcgroups, "cgroup_hierarchies", lambda: [self.hierarchy])
        monkeypatch.setattr(hostcgroups, "mountinfo", lambda: list(self.mounts))
        monkeypatch.setattr(hostcgroups.os, "kill", self._kill)
        monkeypatch.setattr(hostcgroups.time, "sleep", lambda _s: None)
        monkeypatch.setattr(hostcgroups.subprocess, "run", self._run)
        monkeypatch.setattr(realnode.subprocess, "run", self._run)
        host_dirs = tuple(root / "host" / d for d in ("device-plugins", "kubelet", "logs"))
        for d in host_dirs:
            d.mkdir(parents=True)
        monkeypatch.setattr(realnode_down, "HOST_DIRS", host_dirs)
        monkeypatch.setattr(realnode_down, "CONTAINER_LOGS", host_dirs[2])
        # cgroupfs removes a cgroup with its interface files: so does the fake.
        rmdir = Path.rmdir

        def cgroup_rmdir(path: Path) -> None:
            if path.is_relative_to(self.hierarchy):
                (path / "cgroup.procs").unlink(missing_ok=True)
            rmdir(path)

        monkeypatch.setattr(Path, "rmdir", cgroup_rmdir)

    def _kill(self, pid: int, _sig: int) -> None:
        self.killed.append(pid)

    def _run(self, argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        self.commands.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, "", "")

    def node_cgroup(self, node: RealNode, pid: int) -> Path:
        d = self.hierarchy / node.cgroup_root.lstrip("/") / "pod1"
        d.mkdir(parents=True)
        (d / "cgroup.procs").write_text(f"{pid}\n")
        return d


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Host:
    return Host(tmp_path, monkeypatch)


def _node(tmp_path: Path, state: dict[str, Any]) -> RealNode:
    cluster = DevCluster(tmp_path / "state")
    node = RealNode(cluster)
    node.dir.mkdir(parents=True)
    node.state_file.write_text(json.dumps(state))
    return node


def test_hostile_state_json_touches_only_the_nodes_own_names(tmp_path: Path,
                                                               host: Host) -> None:
    node = _node(tmp_path, {"cgroupRoot": "/", "bridge": "lo"})
    own = host.node_cgroup(node, pid=777)
    said: list[str] = []
    assert node.down(said.append)
    # Only the node's own cgroup's process was killed and only its cgroups removed.
    assert set(host.killed) == {777}  # (killed again on each of the three passes)
    assert not own.exists() and not (host.hierarchy / node.cgroup_root.lstrip("/")).exists()
    for name in ("", "system.slice", "user.slice"):
        assert (host.hierarchy / name / "cgroup.procs").read_text() == "1\n4242\n"
    # No `ip link delete lo` (the node's own bridge does not exist here: no ip call).
    assert not any(c[:2] == ["ip", "link"] for c in host.commands), host.commands
    text = "\n".join(said)
    assert "cgroup root '/' is not a real node's" in text
    assert "bridge 'lo' is not a real node's" in text


@pytest.mark.parametrize("root", ["/", "", "/system.slice", "/numalign-1234abcd/../..",
                                  "numalign-1234abcd", "/numalign-1234ABCD"])
def test_teardown_refuses_a_foreign_cgroup_root(root: str, host: Host) -> None:
    with pytest.raises(ForeignNameError, match="not a real node's"):
        hostcgroups.kill_cgroups(root)
    with pytest.raises(ForeignNameError):
        hostcgroups.remove_cgroups(root)
    assert host.killed == []
    assert (host.hierarchy / "system.slice").is_dir()


@pytest.mark.parametrize("bridge", ["lo", "eth0", "nal", "nal1234abcd0", "cni0", "nal1234abc;"])
def test_teardown_refuses_a_foreign_bridge(bridge: str, host: Host) -> None:
    with pytest.raises(ForeignNameError, match="not a real node's"):
        hostcgroups.delete_bridge(bridge)
    assert host.commands == []


def test_own_names_are_accepted() -> None:
    assert own_cgroup_root("/numalign-0123abcd") == "/numalign-0123abcd"
    assert own_bridge("nal0123abcd") == "nal0123abcd"


def test_a_recorded_name_of_the_nodes_form_is_used(tmp_path: Path, host: Host) -> None:
    """A state dir that moved keeps its recorded names (they have the node's form)."""
    node = _node(tmp_path, {"cgroupRoot": "/numalign-0badc0de"})
    d = host.hierarchy / "numalign-0badc0de" / "pod"
    d.mkdir(parents=True)
    (d / "cgroup.procs").write_text("99\n")
    node.down()
    assert set(host.killed) == {99}
    assert not (host.hierarchy / "numalign-0badc0de").exists()


def test_symlinked_state_folder_is_not_followed(tmp_path: Path, host: Host) -> None:
    outside = tmp_path / "outside"
    (outside / "run").mkdir(parents=True)
    (outside / "precious").write_text("keep")
    # A pid file naming a process that is not ours, and a mount under the target.
    (outside / "run" / "kubelet.pid").write_text(f"{os.getpid()}\npython\n")
    host.mounts = [(str(outside / "mnt"), "tmpfs"), ("/", "ext4")]
    (outside / "state.json").write_text(json.dumps({"cgroupRoot": "/", "bridge": "lo"}))
    cluster = DevCluster(tmp_path / "state")
    cluster.state_dir.mkdir()
    link = cluster.state_dir / "realnode"
    link.symlink_to(outside, target_is_directory=True)
    said: list[str] = []
    assert RealNode(cluster).down(said.append) is False
    assert not link.exists() and not link.is_symlink()  # the link went, nothing else
    assert (outside / "precious").read_text() == "keep"
    assert (outside / "run" / "kubelet.pid").is_file()
    assert host.commands == [] and host.killed == []
    assert "is a symbolic link" in "\n".join(said)


def test_symlinked_state_folder_through_dev_down(tmp_path: Path, host: Host) -> None:
    """``DevCluster.down`` (``numalign dev down``) goes through the same check."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    host.mounts = [(str(outside / "mnt"), "tmpfs")]
    cluster = DevCluster(tmp_path / "state")
    cluster.state_dir.mkdir()
    (cluster.state_dir / "realnode").symlink_to(outside, target_is_directory=True)
    cluster.down()
    assert (outside / "precious").read_text() == "keep"
    assert host.commands == [] and host.killed == []


def test_unmount_under_only_below_its_folder(tmp_path: Path, host: Host) -> None:
    base = tmp_path / "state" / "realnode"
    host.mounts = [("/", "ext4"), (str(tmp_path), "tmpfs"), (str(base) + "-other", "tmpfs"),
                   (str(base / "kubelet" / "pods"), "tmpfs"), (str(base), "tmpfs")]
    # The fake mount table does not change: the three passes repeat the same two calls.
    unmount_under(base)
    assert {tuple(c) for c in host.commands} == {
        ("umount", "--lazy", str(base / "kubelet" / "pods")), ("umount", "--lazy", str(base))}
    for bad in (Path("/"), Path("relative")):
        with pytest.raises(ValueError, match="expected an absolute path below /"):
            unmount_under(bad)


def test_a_dangling_realnode_link_is_removed_by_dev_down(tmp_path: Path, host: Host) -> None:
    cluster = DevCluster(tmp_path / "state")
    cluster.state_dir.mkdir()
    link = cluster.state_dir / "realnode"
    link.symlink_to(tmp_path / "gone", target_is_directory=True)
    cluster.down()
    assert not link.is_symlink() and not cluster.state_dir.exists()
    assert host.commands == [] and host.killed == []


def test_a_pid_file_naming_a_process_it_did_not_start_is_not_signalled(tmp_path: Path
                                                                        ) -> None:
    """A live process of the recorded program, but not one the dev cluster started (those
    lead their own session), and init: neither is stopped."""
    sleeper = subprocess.Popen(["sleep", "30"])  # in this session, like any other process
    try:
        run = tmp_path / "run"
        run.mkdir()
        for name, text in (("kubelet", f"{sleeper.pid}\nsleep\n"), ("init", "1\n\n"),
                           ("any", f"{sleeper.pid}\n\n")):
            (run / f"{name}.pid").write_text(text)
            proc = Process(name, run, tmp_path / "logs")
            assert not proc.is_running()
            proc.stop(timeout=0.1)
        assert sleeper.poll() is None, "the process must not have been signalled"
        # One that the dev cluster starts itself is found and stopped.
        own = Process("own", run, tmp_path / "logs")
        own.start(["sleep", "30"])
        assert own.is_running()
        own.stop(timeout=5)
        assert not own.is_running()
    finally:
        sleeper.kill()
        sleeper.wait()
