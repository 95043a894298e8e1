"""The real node's images: OCI archives that ``ctr images import`` names, holding the
locally built pause and workload programs, which behave as the pods rely on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from numalign.devcluster import images
from numalign.devcluster.build import BuildError, find_go
from numalign.devcluster.images.oci import (
    ImageError,
    ImageFile,
    ImageSpec,
    split_reference,
    write_oci_archive,
)
from oci_helpers import read_archive


def _go_available() -> bool:
    try:
        find_go()
    except BuildError:
        return False
    return True


needs_go = pytest.mark.skipif(not _go_available(), reason="no Go >= 1.26 toolchain on PATH")


def test_archive_structure_and_digests(tmp_path: Path) -> None:
    spec = ImageSpec(
        name="numalign.local/sample:v1",
        files=[ImageFile("/bin/tool", b"\x7fELF-not-really", 0o755),
               ImageFile("/etc/tool.conf", b"x=1\n", 0o644)],
        entrypoint=["/bin/tool"], cmd=["--flag"], architecture="arm64",
    )
    desc = write_oci_archive(spec, tmp_path / "img.tar")
    got = read_archive(tmp_path / "img.tar")
    assert got["manifest_digest"] == desc.digest
    # ctr images import takes the full name from io.containerd.image.name; the OCI
    # annotation carries the tag alone (ctr's --base-name prefixes it).
    assert got["annotations"] == {"io.containerd.image.name": "numalign.local/sample:v1",
                                  "org.opencontainers.image.ref.name": "v1"}
    cfg = got["config"]
    assert (cfg["architecture"], cfg["os"]) == ("arm64", "linux")
    assert cfg["config"]["Entrypoint"] == ["/bin/tool"]
    assert cfg["config"]["Cmd"] == ["--flag"]
    files = got["files"]
    assert set(files) == {"/bin", "/bin/tool", "/etc", "/etc/tool.conf"}
    assert files["/bin"].isdir()
    assert files["/bin/tool"].mode == 0o755
    assert files["/etc/tool.conf"].mode == 0o644
    assert all(m.uid == 0 and m.gid == 0 for m in files.values())
    assert got["contents"]["/bin/tool"] == b"\x7fELF-not-really"


def test_archive_is_reproducible(tmp_path: Path) -> None:
    spec = ImageSpec(name="numalign.local/sample:v1", files=[ImageFile("/a", b"abc")],
                     entrypoint=["/a"])
    write_oci_archive(spec, tmp_path / "one.tar")
    time.sleep(1.1)  # a writer that stamped the time would differ now
    write_oci_archive(spec, tmp_path / "two.tar")
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()
    other = ImageSpec(name="numalign.local/sample:v1", files=[ImageFile("/a", b"abd")],
                      entrypoint=["/a"])
    assert write_oci_archive(other, tmp_path / "three.tar").digest != \
        write_oci_archive(spec, tmp_path / "one.tar").digest


@pytest.mark.parametrize("name", ["pause", "pause:dev", "numalign.local/pause",
                                  "Numalign.local/Pause:dev", "numalign.local/pause:"])
def test_image_names_must_be_full_references(name: str, tmp_path: Path) -> None:
    spec = ImageSpec(name=name, files=[ImageFile("/a", b"a")], entrypoint=["/a"])
    with pytest.raises(ImageError, match="image name"):
        write_oci_archive(spec, tmp_path / "x.tar")


def test_split_reference() -> None:
    assert split_reference("numalign.local/workload:dev") == ("numalign.local/workload", "dev")
    assert split_reference("localhost:5000/a/b:1.0") == ("localhost:5000/a/b", "1.0")


def test_bad_image_contents_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match=r"files\[0\]\.path"):
        write_oci_archive(ImageSpec(name="numalign.local/a:b", files=[ImageFile("rel", b"")],
                                    entrypoint=["/rel"]), tmp_path / "x.tar")
    with pytest.raises(ImageError, match="entrypoint"):
        write_oci_archive(ImageSpec(name="numalign.local/a:b", files=[ImageFile("/a", b"")]),
                          tmp_path / "x.tar")


def _status_lines(cpus: set[int]) -> list[str]:
    """What the kernel says for a process limited to ``cpus`` (Mems from our own status)."""
    mems = next(line for line in Path("/proc/self/status").read_text().splitlines()
                if line.startswith("Mems_allowed_list:"))
    return [f"Cpus_allowed_list:\t{_cpulist(cpus)}", mems]


def _cpulist(cpus: set[int]) -> str:
    out, ids = [], sorted(cpus)
    start = prev = ids[0]
    for c in [*ids[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(out)


def _pinned(cpu: int) -> Any:
    return lambda: os.sched_setaffinity(0, {cpu})


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    if not _go_available():
        pytest.skip("no Go >= 1.26 toolchain on PATH")
    out = tmp_path_factory.mktemp("images")
    paths = images.build_images(out)
    bins, _arch = images.build_programs()
    return {"pause.tar": paths[0], "workload.tar": paths[1],
            "pause": bins / "pause", "workload": bins / "workload"}


@needs_go
def test_build_images_names_and_holds_the_programs(built: dict[str, Path]) -> None:
    assert built["pause.tar"].name == "pause.oci.tar"
    for key, name in (("pause", "numalign.local/pause:dev"),
                      ("workload", "numalign.local/workload:dev")):
        got = read_archive(built[f"{key}.tar"])
        assert got["annotations"]["io.containerd.image.name"] == name
        assert got["annotations"]["org.opencontainers.image.ref.name"] == "dev"
        assert got["config"]["config"]["Entrypoint"] == [f"/{key}"]
        assert got["config"]["os"] == "linux"
        assert got["files"][f"/{key}"].mode == 0o755
        assert got["contents"][f"/{key}"] == built[key].read_bytes()
        # static: no program interpreter, so it runs in an image without libc
        assert b"/lib64/ld-linux" not in built[key].read_bytes()[:4096]


@needs_go
def test_workload_from_the_archive_prints_its_affinity_then_sleeps(
        built: dict[str, Path], tmp_path: Path) -> None:
    got = read_archive(built["workload.tar"])
    exe = tmp_path / "workload"
    exe.write_bytes(got["contents"]["/workload"])
    exe.chmod(0o755)
    cpu = max(os.sched_getaffinity(0))  # the last allowed CPU: not what a default prints
    proc = subprocess.Popen([str(exe)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_pinned(cpu))
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().rstrip("\n") for _ in range(2)]
        assert lines == _status_lines({cpu})
        time.sleep(0.3)
        assert proc.poll() is None, "the workload must keep running until signalled"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_go
def test_workload_status_and_cat_exit(built: dict[str, Path], tmp_path: Path) -> None:
    allowed = os.sched_getaffinity(0)
    out = subprocess.run([str(built["workload"]), "status"], capture_output=True, text=True,
                         timeout=10, check=True).stdout
    assert out.splitlines() == _status_lines(allowed)
    (tmp_path / "f").write_text("hello\n")
    cat = subprocess.run([str(built["workload"]), "cat", str(tmp_path / "f")],
                         capture_output=True, text=True, timeout=10, check=False)
    assert (cat.returncode, cat.stdout) == (0, "hello\n")
    missing = subprocess.run([str(built["workload"]), "cat", str(tmp_path / "nope")],
                             capture_output=True, text=True, timeout=10, check=False)
    assert missing.returncode == 1 and "nope" in missing.stderr


@needs_go
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_pause_waits_reaps_and_exits_zero_when_told(built: dict[str, Path],
                                                    sig: signal.Signals) -> None:
    proc = subprocess.Popen([str(built["pause"])], stderr=subprocess.PIPE)
    try:
        time.sleep(0.3)
        proc.send_signal(signal.SIGCHLD)  # a child ended: reap, keep waiting
        time.sleep(0.3)
        assert proc.poll() is None, "pause must keep running until SIGTERM/SIGINT"
        proc.send_signal(sig)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _proc_state(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, None once it is gone (reaped)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return fields[0], int(fields[1])


@needs_go
def test_pause_reaps_orphans(built: dict[str, Path], tmp_path: Path) -> None:
    """As PID 1 of a pod, pause inherits orphans and must not leave them zombies. Here a
    launcher makes itself a child subreaper, orphans a short sleep, then execs pause:
    the sleep re-parents to pause and must be reaped when it ends."""
    launcher = tmp_path / "launch.py"
    launcher.write_text(
        "import ctypes, os, subprocess, sys\n"
        "ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER\n"
        "with open(sys.argv[2], 'w') as out:\n"
        "    subprocess.run(['sh', '-c', 'sleep 0.5 & echo $!'], check=True, stdout=out)\n"
        "os.execv(sys.argv[1], [sys.argv[1]])\n"
    )
    orphan_file = tmp_path / "orphan"
    proc = subprocess.Popen([sys.executable, str(launcher), str(built["pause"]),
                             str(orphan_file)])
    try:
        deadline = time.monotonic() + 10
        while not (orphan_file.exists() and orphan_file.read_text().strip()):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        orphan = int(orphan_file.read_text())
        seen_parent = None
        while (st := _proc_state(orphan)) is not None:
            seen_parent = st[1]
            assert time.monotonic() < deadline, f"orphan {orphan} never reaped: {st}"
            time.sleep(0.05)
        assert seen_parent in (None, proc.pid)
        assert proc.poll() is None, "pause must outlive its children"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_go
def test_programs_are_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NUMALIGN_CACHE", str(tmp_path))
    first, _ = images.build_programs()
    assert first.parent == tmp_path and (first / ".complete").is_file()

    def no_build(*_a: object, **_k: object) -> str:
        raise AssertionError("rebuilt although the cache holds the programs")

    monkeypatch.setattr(images, "_run", no_build)
    again, _ = images.build_programs()
    assert again == first
    (first / ".complete").unlink()  # an unfinished build is not trusted
    with pytest.raises(AssertionError, match="rebuilt"):
        images.build_programs()
