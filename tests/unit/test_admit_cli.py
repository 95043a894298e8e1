"""`numalign admit`: JSON lines out, one-line errors, exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import testdata
from numalign.commands.admit import main

MACHINES = testdata.MACHINES
PODS = Path(__file__).resolve().parents[1] / "fixtures" / "pods"

POD = """apiVersion: v1
kind: Pod
metadata: {{name: {name}}}
spec:
  containers:
  - name: app
    resources:
      limits: {{cpu: "{cpu}", memory: 200Mi}}
"""


@pytest.fixture
def seed() -> str:
    path = MACHINES / "seed-figure1.yaml"
    return str(path)


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, list[str], str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, [line for line in out.splitlines() if line], err


def test_two_pods_evolving_state(capsys: pytest.CaptureFixture[str], seed: str) -> None:
    code, lines, err = _run(capsys, ["--machine", seed, "--policy", "single-numa-node",
                                     str(PODS / "seed-two-pods.yaml")])
    assert code == 0 and err == ""
    a, b = (json.loads(x) for x in lines)
    assert a == {"pod": "seed-a", "admit": True, "reason": None,
                 "hint": {"numaNodes": [0], "preferred": True},
                 "containers": {"app": {"numaNodes": [0], "cpus": [0, 1],
                                        "memory": {"0": 209715200},
                                        "memoryNumaNodes": [0],
                                        "devices": {"gpu-vendor.com/gpu": ["gpu0"],
                                                    "nic-vendor.com/nic": ["nic0"]}}},
                 "gpus": {}}
    assert b["containers"]["app"]["cpus"] == [4, 5]
    assert b["containers"]["app"]["devices"] == {"gpu-vendor.com/gpu": ["gpu1"],
                                                 "nic-vendor.com/nic": ["nic1"]}


def test_rejection_line(capsys: pytest.CaptureFixture[str], seed: str, tmp_path: Path) -> None:
    f = tmp_path / "pods.yaml"
    f.write_text(POD.format(name="big", cpu=3) + "---\n" + POD.format(name="big2", cpu=3)
                 + "---\n" + POD.format(name="third", cpu=3))
    code, lines, _ = _run(capsys, ["--machine", seed, "--policy=restricted", "--scope", "pod",
                                   "--option", "prefer-closest-numa-nodes=true", str(f)])
    assert code == 0
    got = [json.loads(x) for x in lines]
    assert [g["admit"] for g in got] == [True, True, False]
    assert got[2]["reason"] == "TopologyAffinityError" and got[2]["containers"] == {}


def test_impossible_pod_is_a_rejection_line(capsys: pytest.CaptureFixture[str], seed: str,
                                            tmp_path: Path) -> None:
    """A pod asking more CPUs than the machine has is a decision like any other (the
    kubelet rejects it), not an input error: one JSON line, exit status 0."""
    f = tmp_path / "pods.yaml"
    f.write_text(POD.format(name="huge", cpu=64) + "---\n" + POD.format(name="small", cpu=1))
    code, lines, err = _run(capsys, ["--machine", seed, "--policy", "best-effort", str(f)])
    assert code == 0 and err == ""
    huge, small = (json.loads(x) for x in lines)
    assert huge["pod"] == "huge" and huge["admit"] is False
    assert huge["reason"] == "UnexpectedAdmissionError" and huge["containers"] == {}
    assert small["admit"] is True and small["containers"]["app"]["cpus"] == [0]


def test_resource_fit_rejection_line(capsys: pytest.CaptureFixture[str], seed: str,
                                     tmp_path: Path) -> None:
    f = tmp_path / "pods.yaml"
    f.write_text(POD.format(name="a", cpu="3500m") + "---\n" + POD.format(name="b", cpu="3500m")
                 + "---\n" + POD.format(name="c", cpu=2))
    code, lines, _ = _run(capsys, ["--machine", seed, "--policy", "single-numa-node", str(f)])
    assert code == 0
    got = [json.loads(x) for x in lines]
    assert [g["admit"] for g in got] == [True, True, False]
    assert got[2]["reason"] == "OutOfcpu" and got[2]["containers"] == {}


@pytest.mark.parametrize(("args", "content", "expected"), [
    (["--policy", "restricted"], POD.format(name="p", cpu="abc"),
     "{file}: spec.containers[0].resources.limits.cpu: 'abc' is not a quantity"),
    (["--policy", "restricted"], "a: [unclosed\n", "{file}: is not valid YAML or JSON"),
    (["--policy", "strict"], POD.format(name="p", cpu=1), '--policy: unknown policy: "strict"'),
    (["--policy", "restricted", "--scope", "node"], POD.format(name="p", cpu=1),
     '--scope: unknown scope: "node"'),
    (["--policy", "restricted", "--option", "prefer-closest-numa-nodes=maybe"],
     POD.format(name="p", cpu=1), "--option.prefer-closest-numa-nodes: bad value"),
    (["--policy", "restricted", "--option", "colour=blue"], POD.format(name="p", cpu=1),
     "--option: unknown Topology Manager Policy option"),
])
def test_bad_input(capsys: pytest.CaptureFixture[str], seed: str, tmp_path: Path,
                   args: list[str], content: str, expected: str) -> None:
    f = tmp_path / "pod.yaml"
    f.write_text(content)
    code, lines, err = _run(capsys, ["--machine", seed, *args, str(f)])
    assert code == 1 and lines == []
    err_lines = err.strip().splitlines()
    assert len(err_lines) == 1 and "Traceback" not in err
    assert err_lines[0].startswith("numalign admit: " + expected.format(file=f)), err


def test_bad_machine_and_missing_args(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = _run(capsys, ["--machine", str(tmp_path / "nope.yaml"), "--policy",
                                 "restricted", str(PODS / "seed-two-pods.yaml")])
    assert code == 1 and err.startswith("numalign admit: ") and "cannot read" in err
    code, _, err = _run(capsys, ["--policy", "restricted", "x.yaml"])
    assert code == 1 and "--machine: is required" in err


def test_error_in_one_document_does_not_stop_the_others(
        capsys: pytest.CaptureFixture[str], seed: str, tmp_path: Path) -> None:
    f = tmp_path / "pods.yaml"
    f.write_text(POD.format(name="ok", cpu=1) + "---\n" + POD.format(name="bad", cpu="x"))
    code, lines, err = _run(capsys, ["--machine", seed, "--policy", "best-effort", str(f)])
    assert code == 1 and len(lines) == 1 and json.loads(lines[0])["pod"] == "ok"
    assert err.startswith(f"numalign admit: {f}: document 2: spec.containers[0]")
