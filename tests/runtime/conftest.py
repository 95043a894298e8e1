"""Fixtures of the runtime tests: a private containerd v2 (see containerd_helpers)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from containerd_helpers import Containerd, node_bin_dir
from numalign.devcluster.images import build_images


@pytest.fixture
def containerd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Containerd]:
    if os.geteuid() != 0:
        pytest.skip("running containers needs root")
    if not Path("/sys/fs/cgroup/cpuset").is_dir() and \
            not Path("/sys/fs/cgroup/cgroup.controllers").is_file():
        pytest.skip("no cgroup cpuset controller on this machine")
    bins = node_bin_dir()
    # short folder: unix socket paths are limited to 107 bytes
    d = Path(tmp_path_factory.mktemp("ctrd"))
    c = Containerd(bins, d)
    c.write_config()
    c.start()
    try:
        for archive in build_images(d / "images"):
            out = c.ctr("images", "import", "--no-unpack=false", str(archive), timeout=300)
            assert out.returncode == 0, out.stderr
        yield c
    finally:
        c.cleanup()
