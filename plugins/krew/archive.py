"""Build the krew archive of ``kubectl numalign`` (``kubectl-numalign.tar.gz``: its
launcher), byte for byte the same on every run, so that the sha256 in
``numalign.yaml`` names it. Usage: ``python plugins/krew/archive.py [OUT]``; prints the
archive's sha256."""

from __future__ import annotations

import gzip
import hashlib
import io
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# (path in the archive, file here, mode)
MEMBERS = (("kubectl-numalign", HERE / "kubectl-numalign", 0o755),)


def archive_bytes() -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, path, mode in MEMBERS:
            data = path.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), compresslevel=9, mtime=0)


def main(argv: list[str]) -> int:
    data = archive_bytes()
    out = Path(argv[0]) if argv else Path("kubectl-numalign.tar.gz")
    out.write_bytes(data)
    print(hashlib.sha256(data).hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
