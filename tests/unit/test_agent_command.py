"""``numalign agent`` argument handling (no cluster needed)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

import testdata
from numalign.agent.emulate import expand
from numalign.commands.agent import main, parse_emulate

MACHINES = testdata.MACHINES


def test_emulate_counts_and_names() -> None:
    machines = parse_emulate([f"{MACHINES / 'seed-figure1.yaml'}=3",
                              str(MACHINES / "dual-16core.yaml")])
    assert [(m.name, c) for m, c in machines] == [("seed-figure1", 3), ("dual-16core", 1)]
    names = [n.name for n in expand(machines, start=5)]
    assert names == ["seed-figure1-5", "seed-figure1-6", "seed-figure1-7", "dual-16core-5"]


def test_bad_machine_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnumaNodes:\n  - {id: 0, cpus: '0-3'}\n")
    assert main(["--emulate", f"{bad}=2", "--kubeconfig", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert str(bad) in err and "numaNodes[0].memory" in err


def test_missing_machine_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--emulate", str(tmp_path / "nope.yaml")]) == 1
    err = capsys.readouterr().err.strip()
    assert "nope.yaml" in err and "cannot read" in err


def test_zero_count_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--emulate", f"{MACHINES / 'seed-figure1.yaml'}=0"]) == 1
    assert "COUNT" in capsys.readouterr().err


def test_kubelet_flags_are_for_real_nodes(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    assert main(["--emulate", str(MACHINES / "seed-figure1.yaml"), "--pod-resources",
                 str(tmp_path / "kubelet.sock")]) == 2
    assert "--pod-resources, --kubelet-config and --nri-socket are for --node" in \
        capsys.readouterr().err
    assert main(["--emulate", str(MACHINES / "seed-figure1.yaml"), "--nri-socket",
                 str(tmp_path / "nri.sock")]) == 2
    assert "--nri-socket are for --node" in capsys.readouterr().err


def test_bad_kubelet_config_is_one_line_naming_the_field(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with tarfile.open(testdata.SYSFS / "16amd64-8n2c.tar.bz2") as tar:
        tar.extractall(tmp_path / "root", filter="data")
    root = next(p.parent.parent for p in (tmp_path / "root").rglob("sys/devices"))
    config = tmp_path / "kubelet.yaml"
    config.write_text("kind: KubeletConfiguration\ntopologyManagerScope: node\n")
    assert main(["--node", "n1", "--root", str(root), "--kubelet-config", str(config),
                 "--kubeconfig", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"{config}: topologyManagerScope" in err
