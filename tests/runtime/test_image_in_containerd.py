"""``numalign.local/numalign:dev`` as built by ``numalign dev image`` runs in a real
containerd: imported from its OCI archive, its entry point answers, the agent's discovery
reads a sysfs tree mounted into it, it runs as the non-root user with a name (Kopf's
peering looks it up), every numalign module imports with the image's Python and the
pinned dependencies, and it carries the kube-scheduler of the cluster's version (the
second scheduler, config/scheduler). Needs root, the real node's containerd build, apt
and the package index (the image's layers are cached after the first build)."""

from __future__ import annotations

import json
import shutil
import tarfile
import uuid
from pathlib import Path

import pytest

from containerd_helpers import Containerd
from numalign.agent.discovery import discover
from numalign.devcluster.build import KUBERNETES_VERSION
from numalign.devcluster.images.numalign_image import (
    IMAGE,
    KUBE_SCHEDULER,
    SITE_PACKAGES,
    VENV,
    build_image,
)

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs" / "16amd64-8n2c"


@pytest.fixture
def numalign_image(containerd: Containerd, tmp_path: Path) -> Containerd:
    if shutil.which("apt-get") is None:
        pytest.skip("the image's runtime comes from Debian packages: no apt-get here")
    archive, _manifest = build_image(tmp_path / "image")
    out = containerd.ctr("images", "import", "--no-unpack=false", str(archive), timeout=300)
    assert out.returncode == 0, out.stderr
    return containerd


def _run(c: Containerd, *args: str, mounts: tuple[str, ...] = ()) -> tuple[int, str, str]:
    cid = f"numalign-image-{uuid.uuid4().hex[:8]}"
    cmd = ["run", "--rm", "--cgroup", f"{c.cgroup_parent}/{cid}"]
    for m in mounts:
        cmd += ["--mount", m]
    proc = c.ctr(*cmd, IMAGE, cid, *args, timeout=120)
    return proc.returncode, proc.stdout, proc.stderr


def test_entrypoint_and_discovery_in_a_container(numalign_image: Containerd,
                                                 tmp_path: Path) -> None:
    c = numalign_image
    rc, out, err = _run(c, "numalign", "--help")
    assert rc == 0, err
    assert "operator" in out and "agent" in out

    host = tmp_path / "host"
    host.mkdir(mode=0o755)
    with tarfile.open(FIXTURE.with_name(FIXTURE.name + ".tar.bz2")) as tf:
        tf.extractall(host, filter="data")
    rc, out, err = _run(c, "numalign", "discover", "--root", f"/host/{FIXTURE.name}",
                        "--no-gpus", "--quiet",
                        mounts=(f"type=bind,src={host},dst=/host,options=rbind:ro",))
    assert rc == 0, err
    got = json.loads(out)
    expected = json.loads(FIXTURE.with_name(FIXTURE.name + ".expected.json").read_text())
    assert {key: got[key] for key in expected} == expected
    # all of it as this checkout's discovery reads the same tree
    here = discover(str(host / FIXTURE.name), gpus=False).to_json()
    assert got == json.loads(json.dumps(here))


def test_runs_as_named_non_root_with_every_module_importable(
        numalign_image: Containerd) -> None:
    script = (
        "import getpass, importlib, json, os, pkgutil, sys\n"
        "import numalign\n"
        "failed = {}\n"
        "for m in pkgutil.walk_packages(numalign.__path__, 'numalign.'):\n"
        "    try:\n"
        "        importlib.import_module(m.name)\n"
        "    except Exception as e:\n"
        "        failed[m.name] = repr(e)\n"
        "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'user': getpass.getuser(),"
        " 'prefix': sys.prefix, 'file': numalign.__file__, 'failed': failed}))\n"
    )
    rc, out, err = _run(numalign_image, "python3", "-c", script)
    assert rc == 0, err
    got = json.loads(out)
    assert (got["uid"], got["gid"], got["user"]) == (65532, 65532, "nonroot")
    assert got["prefix"] == VENV
    assert got["file"] == f"{SITE_PACKAGES}/numalign/__init__.py"
    assert got["failed"] == {}


def test_kube_scheduler_of_the_clusters_version_runs(numalign_image: Containerd) -> None:
    rc, out, err = _run(numalign_image, KUBE_SCHEDULER, "--version")
    assert rc == 0, err
    assert out.split() == ["Kubernetes", KUBERNETES_VERSION]
