"""The README's commands run as written: every line of its fenced ``sh`` blocks is either
run here (from the repository root, with this environment's ``numalign`` on PATH) and
its key output checked, or listed in SKIPPED with the reason.

The demo runs in a temporary state dir (``numalign dev up --demo --state-dir DIR``, the
documented equivalent of ``make demo`` that leaves the user's own cluster alone), twice
(the second run reuses the cluster), then the README's cluster commands run against it,
then ``numalign dev down --state-dir DIR`` (the equivalent of ``make down``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


@dataclass(frozen=True)
class Check:
    pattern: str
    """Regular expression a README command line must match (whole line)."""
    expect: tuple[str, ...]
    """Substrings its output must contain."""
    live: bool = False
    """Runs against the demo cluster (KUBECONFIG set)."""


SKIPPED: dict[str, str] = {
    r"make demo\b.*": "runs as its documented equivalent 'numalign dev up --demo' in a "
                      "temporary state dir (test_readme_demo_and_cluster_commands)",
    r"make test\b.*": "the whole test suite, this test included",
    r"numalign dev image( --update-lock)?": "builds the image (minutes cold) or re-resolves "
        "the lock against the package index: tests/unit/test_numalign_image.py and "
        "tests/runtime/test_image_in_containerd.py build and run it, tests/e2e/"
        "test_installed_e2e.py installs it",
    r"kubectl (create|label) namespace numalign-system.*|helm (install|upgrade) numalign "
    r"charts/numalign .*|helm uninstall numalign .*|--set image\.repository=REGISTRY/.*":
        "installs numalign into the user's cluster: tests/cluster/test_helm.py runs the "
        "chart's install, upgrade and uninstall on the real API server, tests/e2e/"
        "test_installed_e2e.py with its pods running (dev up --install helm)",
}

CHECKS: tuple[Check, ...] = (
    Check(r"echo '.*' \| numalign merge", ('{"hint": {"numaNodes": [1], "preferred": false}, '
                                           '"admit": false}',)),
    Check(r"numalign admit --machine config/samples/machines/seed-figure1\.yaml .*",
          ('"pod": "seed-a", "admit": true', '"pod": "seed-b", "admit": true',
           '"numaNodes": [0]', '"numaNodes": [1]')),
    Check(r"numalign explain --machine config/samples/machines/group4-gpu\.yaml .*",
          ("Result:   ADMITTED", "nvidia.com/gpu: gpu0,gpu1")),
    Check(r"numalign discover --machine-yaml .*", ("name: this-node", "numaNodes:")),
    Check(r"kubectl get nt", ("group4-gpu-0", "group4-gpu-1", "dgx-a100-like-0",
                              "fragmented-8numa-0", "dual-16core-0", "seed-figure1-0",
                              "single-numa-node"), live=True),
    Check(r"kubectl get tp", ("ml-training", "batch", "low-latency", "True"), live=True),
    Check(r"kubectl get nt group4-gpu-0 -o yaml.*", ("admitted:", "nvlink", "distances:"),
          live=True),
    Check(r"kubectl get events -n rt.*", ("TopologyAffinityError", "Redeploy"), live=True),
    Check(r'numalign explain "\$\(kubectl get pods -n ml .*\)" -n ml',
          ("Policy:   single-numa-node, scope pod  (from TopologyPolicy/ml-training)",
           "Result:   ADMITTED"), live=True),
    Check(r"kubectl numalign nodes", ("NODE", "POLICY", "NUMA", "CPU", "group4-gpu-0",
                                      "fragmented-8numa-0", "single-numa-node"), live=True),
    Check(r'kubectl numalign explain "\$\(kubectl get pods -n ml .*\)" -n ml',
          ("Policy:   single-numa-node, scope pod  (from TopologyPolicy/ml-training)",
           "Result:   ADMITTED"), live=True),
)


def readme_commands() -> list[str]:
    """Every command line of the README's ```sh blocks (comment-only lines dropped)."""
    lines: list[str] = []
    for block in re.findall(r"^```sh\n(.*?)^```", README.read_text(), re.M | re.S):
        for line in block.splitlines():
            text = line.strip()
            if text and not text.startswith("#"):
                lines.append(text)
    return lines


def _strip_comment(line: str) -> str:
    """The command without a trailing ``# comment`` (outside quotes)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
        continue
    return line


def classify(line: str) -> Check | str:
    """The Check that runs this line, or the reason it is skipped."""
    cmd = _strip_comment(line)
    for pattern, reason in SKIPPED.items():
        if re.fullmatch(pattern, cmd):
            return reason
    matches = [c for c in CHECKS if re.fullmatch(c.pattern, cmd)]
    if len(matches) != 1:
        raise AssertionError(f"README command {cmd!r} matches {len(matches)} checks in "
                             f"{__file__}: add one (or a SKIPPED entry with the reason)")
    return matches[0]


def _env(kubeconfig: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    else:
        env.pop("KUBECONFIG", None)
    return env


def run(command: str, env: dict[str, str], timeout: float = 120.0,
        ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, (f"{command!r} failed ({proc.returncode}):\n"
                                  f"{proc.stderr[-3000:]}\n{proc.stdout[-3000:]}")
    return proc


def check(line: str, env: dict[str, str]) -> None:
    spec = classify(line)
    assert isinstance(spec, Check)
    out = run(_strip_comment(line), env).stdout
    for text in spec.expect:
        assert text in out, f"{line!r}: {text!r} not in its output:\n{out[-3000:]}"


def test_every_readme_command_is_covered() -> None:
    lines = readme_commands()
    assert any(line.startswith("make demo") for line in lines)
    assert any(line.startswith("make test") for line in lines)
    covered = [classify(line) for line in lines]
    used = {c.pattern for c in covered if isinstance(c, Check)}
    assert used == {c.pattern for c in CHECKS}, "a Check matches no README command"
    numalign_lines = [line for line in lines if "numalign " in line]
    assert len(numalign_lines) >= 5


def test_readme_offline_commands() -> None:
    env = _env()
    for line in readme_commands():
        spec = classify(line)
        if isinstance(spec, Check) and not spec.live:
            check(line, env)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """``numalign dev up --demo`` in a temporary state dir; (kubeconfig, stdout, stderr)."""
    state = tmp_path_factory.mktemp("readme-demo")
    env = _env()
    try:
        t0 = time.monotonic()
        proc = run(f"numalign dev up --demo --state-dir {state}", env, timeout=400)
        print(f"numalign dev up --demo: {time.monotonic() - t0:.1f}s", file=sys.stderr)
        yield state / "kubeconfig", proc.stdout, proc.stderr
    finally:
        subprocess.run(["bash", "-c", f"numalign dev down --state-dir {state}"], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_readme_demo_and_cluster_commands(demo: tuple[Path, str, str]) -> None:
    kubeconfig, out, err = demo
    assert "demo: workloads settled" in err
    for step in ("binaries ready", "6 emulated nodes Ready", "TopologyPolicies applied",
                 "sample workloads applied"):
        assert step in err, f"no progress line {step!r}:\n{err}"
    for text in ("$ kubectl get nt", "$ kubectl get tp", "What to try next:",
                 f"export KUBECONFIG={kubeconfig}", "numalign explain trainer-",
                 "numalign dev down --state-dir", "TopologyAffinityError on fragmented-8numa-0"):
        assert text in out, f"{text!r} not in the demo's output:\n{out}"

    table = out.split("$ kubectl get nt", 1)[1].split("$ kubectl get tp", 1)[0]
    if "demo: real node 'localhost' ready" in err:
        # the real node is listed, with its kubelet's policy and scope
        m = re.search(r"Topology Manager policy (\S+), scope (\S+) ", err)
        assert m, err
        row = next((line.split() for line in table.splitlines()
                    if line.startswith("localhost ")), None)
        assert row is not None and row[1:3] == [m[1], m[2]], table
    for leak in ("Unclosed client session", "Unclosed connector"):
        assert leak not in err + out, f"{leak} at the end of the demo:\n{err[-2000:]}"

    # Again: reuses the running cluster, re-applies the samples harmlessly.
    state = kubeconfig.parent
    again = run(f"numalign dev up --demo --state-dir {state}", _env(), timeout=200)
    assert "control plane already running" in again.stderr
    assert "demo: workloads settled" in again.stderr
    assert "Unclosed" not in again.stderr

    env = _env(kubeconfig)
    for line in readme_commands():
        spec = classify(line)
        if isinstance(spec, Check) and spec.live:
            check(line, env)

    # `make down` is `numalign dev down`: here with the demo's state dir.
    down = run(f"numalign dev down --state-dir {state}", _env())
    assert "control plane stopped" in down.stderr
    assert not kubeconfig.exists()
