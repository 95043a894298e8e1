"""Image layers made from directory trees, written once and cached on disk.

:func:`tree_layer` turns a directory (a root file system fragment) into a gzip-compressed
layer tar, streamed to a file while both digests are computed, so a layer of hundreds of
megabytes is never held in memory. It is deterministic: entries sorted, every time 0,
owner root, permission bits kept (set-id bits and the sticky bit included), symlinks kept,
hard links stored as separate files. :func:`cached_layer` keeps finished layers under a
cache folder by a key the caller derives from the layer's inputs (package versions, a
hash of the sources), so a warm build reads them back instead of building them again.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from .oci import ImageError, Layer

# Layer contents the runtime needs to be the image's, not the host's: refused in a tree.
_UNSUPPORTED = {stat.S_IFSOCK: "socket", stat.S_IFIFO: "fifo", stat.S_IFBLK: "block device",
                stat.S_IFCHR: "character device"}


class _Hashing:
    """A write-only file that hashes and counts what goes through it to ``inner``."""

    def __init__(self, inner: IO[bytes]) -> None:
        self.inner = inner
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.inner.write(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.inner.flush()


def _info(name: str, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _entries(root: Path) -> list[Path]:
    """Every path under ``root``, parents before children, in a stable order."""
    out: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        base = Path(dirpath)
        # symlinks to directories are listed in dirnames; os.walk does not follow them
        out += [base / n for n in sorted(dirnames + filenames)]
    return sorted(out, key=lambda p: p.relative_to(root).parts)


def tree_layer(root: Path, out: Path) -> Layer:
    """Write the tree under ``root`` as a gzip layer at ``out``; return its descriptor."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as raw_file:
        compressed = _Hashing(raw_file)
        with gzip.GzipFile(filename="", mode="wb", fileobj=compressed,  # type: ignore[arg-type]
                           mtime=0, compresslevel=6) as gz:
            plain = _Hashing(gz)  # type: ignore[arg-type]
            with tarfile.open(fileobj=plain, mode="w",  # type: ignore[call-overload]
                              format=tarfile.PAX_FORMAT) as tar:
                for path in _entries(root):
                    _add(tar, root, path)
    return Layer(out, "sha256:" + compressed.sha.hexdigest(),
                 "sha256:" + plain.sha.hexdigest(), compressed.size)


def _add(tar: tarfile.TarFile, root: Path, path: Path) -> None:
    name = path.relative_to(root).as_posix()
    st = path.lstat()
    info = _info(name, st)
    fmt = stat.S_IFMT(st.st_mode)
    if fmt == stat.S_IFLNK:
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
        info.mode = 0o777
        tar.addfile(info)
    elif fmt == stat.S_IFDIR:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif fmt == stat.S_IFREG:
        info.size = st.st_size
        with path.open("rb") as f:
            tar.addfile(info, f)
    else:
        raise ImageError(f"layer tree {root}: {name} is a {_UNSUPPORTED.get(fmt, 'special file')}"
                         ", which an image layer built here cannot hold")


def cached_layer(cache: Path, name: str, key: str, build: Callable[[Path], None],
                 log: Callable[[str], None] | None = None) -> Layer:
    """The layer ``name`` for ``key`` from ``cache``, built when missing: ``build(root)``
    fills an empty directory with the layer's tree. A half-written layer is never used
    (the descriptor file is written last, after the blob is in place)."""
    blob = cache / f"{name}-{key}.tar.gz"
    meta = cache / f"{name}-{key}.json"
    if meta.is_file() and blob.is_file():
        doc: dict[str, Any] = json.loads(meta.read_text())
        if blob.stat().st_size == doc.get("size"):
            return Layer(blob, str(doc["digest"]), str(doc["diff_id"]), int(doc["size"]))
    cache.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache))
    try:
        tree = work / "root"
        tree.mkdir()
        build(tree)
        layer = tree_layer(tree, work / "layer.tar.gz")
        os.replace(layer.path, blob)
        meta.write_text(json.dumps({"digest": layer.digest, "diff_id": layer.diff_id,
                                    "size": layer.size}) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if log:
        log(f"layer {name} built: {layer.size / 2**20:.1f} MiB compressed ({blob.name})")
    return Layer(blob, layer.digest, layer.diff_id, layer.size)
