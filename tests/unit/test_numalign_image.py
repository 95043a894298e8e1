"""The pieces of ``numalign dev image`` that need no network: layers from directory trees
(deterministic, symlinks and modes kept, cached by key), apt's resolution as parsed from
its simulation, the dependency lock, and multi-layer OCI archives."""

from __future__ import annotations

import gzip
import io
import os
import tarfile
from pathlib import Path

import pytest

from numalign.devcluster.images import debian
from numalign.devcluster.images import numalign_image as dev_image
from numalign.devcluster.images.layers import cached_layer, tree_layer
from numalign.devcluster.images.oci import ImageError, ImageFile, ImageSpec, write_oci_archive
from oci_helpers import read_archive


def _tree(root: Path) -> Path:
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python3.11").write_bytes(b"\x7fELF")
    (root / "usr/bin/python3.11").chmod(0o755)
    (root / "usr/bin/python3").symlink_to("python3.11")
    (root / "etc").mkdir()
    (root / "etc/passwd").write_text("root:x:0:0::/root:/bin/false\n")
    (root / "etc/passwd").chmod(0o644)
    (root / "tmp").mkdir()
    (root / "tmp").chmod(0o1777)
    (root / "lib64").symlink_to("lib")
    return root


def _members(layer_path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(layer_path.read_bytes()))) as tar:
        return {m.name.rstrip("/"): m for m in tar.getmembers()}


def test_tree_layer_keeps_links_modes_and_is_reproducible(tmp_path: Path) -> None:
    root = _tree(tmp_path / "root")
    a = tree_layer(root, tmp_path / "a.tar.gz")
    os.utime(root / "etc/passwd", (1_000_000, 1_000_000))  # times never reach the layer
    b = tree_layer(root, tmp_path / "b.tar.gz")
    assert (a.digest, a.diff_id, a.size) == (b.digest, b.diff_id, b.size)
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()
    assert a.size == (tmp_path / "a.tar.gz").stat().st_size
    m = _members(tmp_path / "a.tar.gz")
    names = list(m)
    assert names.index("usr") < names.index("usr/bin") < names.index("usr/bin/python3.11")
    assert m["usr/bin/python3"].issym() and m["usr/bin/python3"].linkname == "python3.11"
    assert m["lib64"].issym()
    assert m["tmp"].isdir() and m["tmp"].mode == 0o1777
    assert m["usr/bin/python3.11"].mode == 0o755 and m["etc/passwd"].mode == 0o644
    assert {(i.uid, i.gid, i.mtime) for i in m.values()} == {(0, 0, 0)}


def test_tree_layer_refuses_special_files(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    os.mkfifo(root / "pipe")
    with pytest.raises(ImageError, match="pipe is a fifo"):
        tree_layer(root, tmp_path / "x.tar.gz")


def test_cached_layer_builds_once_per_key(tmp_path: Path) -> None:
    calls: list[str] = []

    def build(tree: Path) -> None:
        calls.append(tree.name)
        (tree / "f").write_text("x")

    first = cached_layer(tmp_path, "base", "k1", build)
    again = cached_layer(tmp_path, "base", "k1", build)
    assert calls == ["root"] and first == again
    cached_layer(tmp_path, "base", "k2", build)
    assert len(calls) == 2
    # a blob whose size does not match its record is rebuilt, not trusted
    first.path.write_bytes(b"truncated")
    rebuilt = cached_layer(tmp_path, "base", "k1", build)
    assert len(calls) == 3 and rebuilt.digest == first.digest
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no leftovers"


def test_cached_layer_keeps_nothing_of_a_failed_build(tmp_path: Path) -> None:
    def build(tree: Path) -> None:
        (tree / "half").write_text("x")
        raise ImageError("download failed")

    with pytest.raises(ImageError, match="download failed"):
        cached_layer(tmp_path, "base", "k", build)
    assert list(tmp_path.iterdir()) == []


def test_archive_of_prebuilt_layers_and_files(tmp_path: Path) -> None:
    base = tree_layer(_tree(tmp_path / "root"), tmp_path / "base.tar.gz")
    spec = ImageSpec(name="numalign.local/multi:v1", files=[ImageFile("/app", b"app")],
                     layers=[base], entrypoint=["/app"], user="65532:65532",
                     working_dir="/work", exposed_ports=["9443/tcp"])
    write_oci_archive(spec, tmp_path / "img.tar")
    got = read_archive(tmp_path / "img.tar")
    cfg = got["config"]
    assert len(cfg["rootfs"]["diff_ids"]) == 2 and cfg["rootfs"]["diff_ids"][0] == base.diff_id
    assert len(cfg["history"]) == 2
    assert cfg["config"]["User"] == "65532:65532"
    assert cfg["config"]["WorkingDir"] == "/work"
    assert cfg["config"]["ExposedPorts"] == {"9443/tcp": {}}
    assert got["files"]["/usr/bin/python3"].issym() and got["contents"]["/app"] == b"app"


def test_bad_image_settings_name_the_field(tmp_path: Path) -> None:
    def spec(**kw: object) -> ImageSpec:
        return ImageSpec(name="numalign.local/a:b", files=[ImageFile("/a", b"")],
                         entrypoint=["/a"], **kw)  # type: ignore[arg-type]

    with pytest.raises(ImageError, match="working_dir"):
        write_oci_archive(spec(working_dir="rel"), tmp_path / "x.tar")
    with pytest.raises(ImageError, match=r"exposed_ports\[0\]"):
        write_oci_archive(spec(exposed_ports=["http"]), tmp_path / "x.tar")
    with pytest.raises(ImageError, match="file or layer"):
        write_oci_archive(ImageSpec(name="numalign.local/a:b", files=[], entrypoint=["/a"]),
                          tmp_path / "x.tar")


SIMULATION = """\
NOTE: This is only a simulation!
Reading package lists...
Inst gcc-12-base (12.2.0-14+deb12u1 Debian:12.15/oldstable [amd64])
Inst libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64]) []
Inst media-types (10.0.0 Debian:12.15/oldstable [all])
Inst zlib1g (1:1.2.13.dfsg-1+deb12u1 Debian-Security:12/oldstable-security [amd64])
Conf libc6 (2.36-9+deb12u14 Debian:12.15/oldstable [amd64])
"""


def test_apt_simulation_is_parsed_to_exact_versions() -> None:
    pkgs = debian.parse_simulation(SIMULATION)
    assert [p.pin for p in pkgs] == [
        "gcc-12-base:amd64=12.2.0-14+deb12u1", "libc6:amd64=2.36-9+deb12u14",
        "media-types:all=10.0.0", "zlib1g:amd64=1:1.2.13.dfsg-1+deb12u1"]
    # apt-get download names an epoch's ':' as '%3a'
    assert pkgs[-1].deb_name == "zlib1g_1%3a1.2.13.dfsg-1+deb12u1_amd64.deb"


def test_unpack_drops_documentation_but_keeps_copyrights(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for rel in ("usr/share/doc/libc6/copyright", "usr/share/doc/libc6/changelog.gz",
                "usr/share/man/man1/python3.11.1.gz", "usr/share/locale/de/x.mo",
                "usr/lib/python3.11/os.py"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    debian.unpack([], root)
    left = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert left == ["usr/lib/python3.11/os.py", "usr/share/doc/libc6/copyright"]


def test_lock_parsing() -> None:
    text = "# header\nPyYAML==6.0.4\ntyping_extensions==4.16.0  # why\n\n"
    assert dev_image.parse_lock(text) == {"pyyaml": "6.0.4", "typing-extensions": "4.16.0"}
    with pytest.raises(ImageError, match=r"line 2: 'kopf>=1\.37'"):
        dev_image.parse_lock("aiohttp==3.14.5\nkopf>=1.37\n")


def test_scripts_run_with_the_images_interpreter(tmp_path: Path) -> None:
    """pip's console scripts name the build's interpreter; in the image they name the
    environment's (a long path's /bin/sh trampoline too: the image has no shell)."""
    bindir = tmp_path / dev_image.VENV.lstrip("/") / "bin"
    bindir.mkdir(parents=True)
    body = "import sys\nfrom numalign.cli import main\nsys.exit(main())\n"
    (bindir / "numalign").write_text("#!/home/u/.venv/bin/python\n" + body)
    (bindir / "long").write_text("#!/bin/sh\n'''exec' \"/very/long/bin/python\" \"$0\" "
                                 "\"$@\"\n' '''\n" + body)
    (bindir / "plain.sh").write_text("#!/bin/sh\necho hi\n")
    dev_image.fix_scripts(bindir)
    shebang = f"#!{dev_image.VENV}/bin/python{dev_image.PYTHON_MINOR}\n"
    assert (bindir / "numalign").read_text() == shebang + body
    assert (bindir / "long").read_text() == shebang + body
    assert (bindir / "plain.sh").read_text() == "#!/bin/sh\necho hi\n"


def test_wheel_sources_leave_build_leftovers_out(tmp_path: Path) -> None:
    for rel in ("pyproject.toml", "README.md", "operator/numalign/__init__.py",
                "operator/numalign/__pycache__/x.cpython-311.pyc",
                "operator/numalign.egg-info/PKG-INFO", "build/lib/numalign/__init__.py",
                "operator/numalign/devcluster/cluster.py", "operator/numalign/testing/x.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x")
    assert [p.as_posix() for p in dev_image.source_files(tmp_path)] == [
        "pyproject.toml", "README.md", "operator/numalign/__init__.py"]
    key = dev_image.source_key(tmp_path)
    (tmp_path / "operator/numalign.egg-info/SOURCES.txt").write_text("new")
    assert dev_image.source_key(tmp_path) == key, "a build's egg-info changes nothing"
    (tmp_path / "operator/numalign/devcluster/cluster.py").write_text("new")
    assert dev_image.source_key(tmp_path) == key, "nor the dev cluster (not in the wheel)"
    (tmp_path / "operator/numalign/__init__.py").write_text("y")
    assert dev_image.source_key(tmp_path) != key


def test_every_installed_distribution_must_be_pinned(tmp_path: Path) -> None:
    for name, version in (("numalign", "0.1.0"), ("PyYAML", "6.0.4"), ("kopf", "1.45.2")):
        info = tmp_path / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\n"
                                       f"Version: {version}\n")
    dev_image.check_pins(tmp_path, {"pyyaml": "6.0.4", "kopf": "1.45.2"})
    with pytest.raises(ImageError, match=r"kopf 1\.45\.2 \(lock: 1\.40\.0\)"):
        dev_image.check_pins(tmp_path, {"pyyaml": "6.0.4", "kopf": "1.40.0"})
    with pytest.raises(ImageError, match=r"pyyaml 6\.0\.4 \(lock: missing\)"):
        dev_image.check_pins(tmp_path, {"kopf": "1.45.2"})


def test_scheduler_layer_carries_the_binary_and_follows_it(tmp_path: Path) -> None:
    """The image's kube-scheduler is the given binary, executable at KUBE_SCHEDULER; a
    new build of it makes a new layer, the same one reuses the cached layer."""
    binary = tmp_path / "kube-scheduler"
    binary.write_bytes(b"\x7fELF one")
    binary.chmod(0o600)
    first = dev_image._scheduler_layer(tmp_path / "cache", binary, lambda _m: None)
    m = _members(first.path)
    entry = m[dev_image.KUBE_SCHEDULER.lstrip("/")]
    assert entry.isfile() and entry.mode == 0o755
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(first.path.read_bytes()))) as tar:
        got = tar.extractfile(entry)
        assert got is not None and got.read() == b"\x7fELF one"
    assert dev_image._scheduler_layer(tmp_path / "cache", binary, print) == first
    binary.write_bytes(b"\x7fELF two")
    assert dev_image._scheduler_layer(tmp_path / "cache", binary, print).digest != first.digest
    with pytest.raises(ImageError, match="numalign dev build"):
        dev_image._scheduler_layer(tmp_path / "cache", tmp_path / "missing", print)
