"""Reading OCI image-layout archives the way an importer does (tests of the images)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"



def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def read_archive(path: Path) -> dict[str, Any]:
    """Open an OCI layout archive the way an importer does, checking every digest and size
    on the way; return the image name, config and layer files."""
    members: dict[str, bytes] = {}
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            if m.isfile():
                f = tar.extractfile(m)
                assert f is not None
                members[m.name] = f.read()
            else:
                assert m.isdir(), f"unexpected member type {m.name}"
    assert json.loads(members["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    index = json.loads(members["index.json"])
    assert index["schemaVersion"] == 2
    assert index["mediaType"] == OCI_INDEX
    assert len(index["manifests"]) == 1

    def blob(desc: dict[str, Any]) -> bytes:
        algo, hexd = desc["digest"].split(":")
        assert algo == "sha256"
        data = members[f"blobs/sha256/{hexd}"]
        assert _sha(data) == desc["digest"], "blob content does not match its digest"
        assert len(data) == desc["size"], "descriptor size is wrong"
        return data

    entry = index["manifests"][0]
    assert entry["mediaType"] == OCI_MANIFEST
    manifest = json.loads(blob(entry))
    assert manifest["schemaVersion"] == 2
    assert manifest["mediaType"] == OCI_MANIFEST
    assert manifest["config"]["mediaType"] == OCI_CONFIG
    config = json.loads(blob(manifest["config"]))
    assert entry["platform"] == {"architecture": config["architecture"], "os": config["os"]}
    files: dict[str, tarfile.TarInfo] = {}
    contents: dict[str, bytes] = {}
    diff_ids = []
    for layer_desc in manifest["layers"]:
        assert layer_desc["mediaType"] == OCI_LAYER_GZIP
        raw = gzip.decompress(blob(layer_desc))
        diff_ids.append(_sha(raw))
        with tarfile.open(fileobj=io.BytesIO(raw)) as layer:
            for m in layer.getmembers():
                files["/" + m.name.rstrip("/")] = m
                if m.isfile():
                    f = layer.extractfile(m)
                    assert f is not None
                    contents["/" + m.name] = f.read()
    assert config["rootfs"] == {"type": "layers", "diff_ids": diff_ids}
    referenced = {entry["digest"], manifest["config"]["digest"],
                  *(d["digest"] for d in manifest["layers"])}
    blobs = {"sha256:" + n.rsplit("/", 1)[1] for n in members if n.startswith("blobs/")}
    assert blobs == referenced, "the archive holds blobs nobody references (or misses some)"
    return {"annotations": entry["annotations"], "config": config, "files": files,
            "contents": contents, "manifest_digest": entry["digest"]}
