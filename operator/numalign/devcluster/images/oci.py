"""Write a container image as an OCI image-layout archive (a tar), as ``ctr images import``
and other OCI tools read it.

The archive holds ``oci-layout``, ``index.json`` and ``blobs/sha256/<digest>``: the
gzip-compressed layers (prebuilt ones from disk, see :mod:`.layers`, then one with the
given files), the image config and the manifest. The
index names the image twice, as containerd's own exporter does: the full reference in
``io.containerd.image.name`` (which ``ctr images import`` uses as the image's name) and
the tag alone in ``org.opencontainers.image.ref.name`` (the OCI annotation). Everything
is deterministic: the same files give the same bytes and digests.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import tarfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
ANNOTATION_REF_NAME = "org.opencontainers.image.ref.name"
ANNOTATION_CONTAINERD_NAME = "io.containerd.image.name"
LAYOUT_VERSION = "1.0.0"
EPOCH = "1970-01-01T00:00:00Z"

# A reference as containerd names images: registry host, path, then a tag.
_REFERENCE = re.compile(
    r"^(?P<repo>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+)"
    r":(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})$"
)


class ImageError(ValueError):
    """An image description is invalid; the message names the field."""


@dataclass(frozen=True)
class ImageFile:
    """A regular file in the image's only layer."""

    path: str  # absolute path inside the image, e.g. "/pause"
    data: bytes
    mode: int = 0o755


@dataclass(frozen=True)
class Layer:
    """A prebuilt gzip-compressed layer on disk (written by :func:`.layers.tree_layer`)."""

    path: Path
    digest: str  # sha256 of the gzip blob: "sha256:<hex>"
    diff_id: str  # sha256 of the uncompressed tar
    size: int  # bytes of the gzip blob


@dataclass(frozen=True)
class ImageSpec:
    name: str  # full reference with a tag: "numalign.local/pause:dev"
    files: Sequence[ImageFile]
    entrypoint: Sequence[str] = ()
    cmd: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/",)
    architecture: str = "amd64"
    os: str = "linux"
    labels: Mapping[str, str] = field(default_factory=dict)
    layers: Sequence[Layer] = ()  # below the files' layer, lowest first
    user: str = ""  # "UID:GID"; empty: root
    working_dir: str = "/"
    exposed_ports: Sequence[str] = ()  # "8080/tcp"


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str  # "sha256:<hex>"
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


def split_reference(name: str) -> tuple[str, str]:
    """``"numalign.local/pause:dev"`` -> ``("numalign.local/pause", "dev")``."""
    m = _REFERENCE.match(name)
    if m is None:
        raise ImageError(
            f"image name: {name!r} is not a full reference with a tag "
            "like 'numalign.local/pause:dev' (lower-case host/path, then :tag)"
        )
    return m.group("repo"), m.group("tag")


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json_bytes(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _tar_entry(tar: tarfile.TarFile, name: str, data: bytes | None, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if data is None:
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def _parents(path: PurePosixPath) -> list[str]:
    return [str(p) for p in reversed(path.parents) if str(p) != "."]


def layer_tar(files: Iterable[ImageFile]) -> bytes:
    """The uncompressed layer: the files with their parent directories, root-owned."""
    buf = io.BytesIO()
    seen_dirs: set[str] = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i, f in enumerate(sorted(files, key=lambda f: f.path)):
            if not f.path.startswith("/") or f.path.endswith("/") or ".." in f.path.split("/"):
                raise ImageError(f"files[{i}].path: {f.path!r} must be an absolute file path")
            rel = PurePosixPath(f.path.lstrip("/"))
            for d in _parents(rel):
                if d not in seen_dirs:
                    seen_dirs.add(d)
                    _tar_entry(tar, d + "/", None, 0o755)
            _tar_entry(tar, str(rel), f.data, f.mode)
    return buf.getvalue()


def _gzip(data: bytes) -> bytes:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=6) as gz:
        gz.write(data)
    return buf.getvalue()


def _check(spec: ImageSpec) -> None:
    if not spec.files and not spec.layers:
        raise ImageError("files: an image needs at least one file or layer")
    if not spec.entrypoint and not spec.cmd:
        raise ImageError("entrypoint: an image needs an entrypoint or a cmd")
    if not spec.working_dir.startswith("/"):
        raise ImageError(f"working_dir: {spec.working_dir!r} must be an absolute path")
    for i, port in enumerate(spec.exposed_ports):
        if not re.fullmatch(r"[0-9]{1,5}/(tcp|udp|sctp)", port):
            raise ImageError(f"exposed_ports[{i}]: {port!r} is not like '8080/tcp'")
    split_reference(spec.name)


def image_blobs(spec: ImageSpec) -> tuple[Descriptor, dict[str, bytes]]:
    """The manifest's descriptor and the blobs held in memory (digest -> bytes): config,
    manifest and the files' layer. Prebuilt layers (``spec.layers``) stay on disk."""
    _check(spec)
    layers = list(spec.layers)
    blobs: dict[str, bytes] = {}
    if spec.files:
        raw = layer_tar(spec.files)
        gz = _gzip(raw)
        blobs[_digest(gz)] = gz
        layers.append(Layer(Path(), _digest(gz), _digest(raw), len(gz)))
    run_config: dict[str, Any] = {"Env": list(spec.env), "WorkingDir": spec.working_dir}
    if spec.entrypoint:
        run_config["Entrypoint"] = list(spec.entrypoint)
    if spec.cmd:
        run_config["Cmd"] = list(spec.cmd)
    if spec.user:
        run_config["User"] = spec.user
    if spec.exposed_ports:
        run_config["ExposedPorts"] = {p: {} for p in spec.exposed_ports}
    if spec.labels:
        run_config["Labels"] = dict(spec.labels)
    config = _json_bytes({
        "created": EPOCH,
        "architecture": spec.architecture,
        "os": spec.os,
        "config": run_config,
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": EPOCH, "created_by": "numalign.devcluster.images"}
                    for _ in layers],
    })
    config_desc = Descriptor(MEDIA_CONFIG, _digest(config), len(config))
    manifest = _json_bytes({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": config_desc.to_json(),
        "layers": [Descriptor(MEDIA_LAYER_GZIP, layer.digest, layer.size).to_json()
                   for layer in layers],
    })
    manifest_desc = Descriptor(MEDIA_MANIFEST, _digest(manifest), len(manifest))
    blobs[config_desc.digest] = config
    blobs[manifest_desc.digest] = manifest
    return manifest_desc, blobs


def index_json(spec: ImageSpec, manifest: Descriptor) -> bytes:
    _repo, tag = split_reference(spec.name)
    entry = manifest.to_json()
    entry["platform"] = {"architecture": spec.architecture, "os": spec.os}
    entry["annotations"] = {ANNOTATION_CONTAINERD_NAME: spec.name, ANNOTATION_REF_NAME: tag}
    return _json_bytes({"schemaVersion": 2, "mediaType": MEDIA_INDEX, "manifests": [entry]})


def _blob_entry(tar: tarfile.TarFile, layer: Layer) -> None:
    info = tarfile.TarInfo("blobs/sha256/" + layer.digest.split(":", 1)[1])
    info.mode, info.mtime, info.uid, info.gid = 0o644, 0, 0, 0
    info.size = layer.path.stat().st_size
    if info.size != layer.size:
        raise ImageError(f"layers: {layer.path} has {info.size} bytes, its descriptor says "
                         f"{layer.size}: the layer cache is damaged (remove the file)")
    with layer.path.open("rb") as f:
        tar.addfile(info, f)


def write_oci_archive(spec: ImageSpec, out: Path) -> Descriptor:
    """Write ``spec`` as an OCI image-layout tar at ``out`` (atomically); return the
    manifest's descriptor (its digest is the image's id in containerd). Prebuilt layers
    are streamed from their files, never held in memory whole."""
    manifest, blobs = image_blobs(spec)
    on_disk = {layer.digest: layer for layer in spec.layers if layer.digest not in blobs}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        _tar_entry(tar, "oci-layout", _json_bytes({"imageLayoutVersion": LAYOUT_VERSION}),
                   0o644)
        _tar_entry(tar, "index.json", index_json(spec, manifest), 0o644)
        _tar_entry(tar, "blobs/", None, 0o755)
        _tar_entry(tar, "blobs/sha256/", None, 0o755)
        for dgst in sorted({*blobs, *on_disk}):
            if dgst in blobs:
                _tar_entry(tar, "blobs/sha256/" + dgst.split(":", 1)[1], blobs[dgst], 0o644)
            else:
                _blob_entry(tar, on_disk[dgst])
    tmp.replace(out)
    return manifest
