"""Hostile input to the engine: every bad value gets a one-line error naming the file or
field, within a second and in bounded memory (quantities, cpulists, machine files,
``numalign merge``)."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

import testdata
from numalign.commands.merge import MAX_LINE_BYTES, bounded_lines, run
from numalign.topology.errors import MachineError, TopologyError
from numalign.topology.gpu import parse_gpu_requests
from numalign.topology.machine import load_machine, machine_from_dict
from numalign.topology.pod import pod_from_dict
from numalign.topology.quantity import parse_cpulist, parse_quantity, quantity_bytes

# Generous for a loaded 2-core CI machine; the unfixed code took minutes or forever.
FAST = 1.0


@contextmanager
def within(seconds: float = FAST) -> Iterator[None]:
    start = time.process_time()
    yield
    spent = time.process_time() - start
    assert spent < seconds, f"took {spent:.2f}s of CPU, more than {seconds}s"


HOSTILE_QUANTITIES: list[Any] = ["1e999999", "1e99999999", "1E-99999999", "NaN", "Infinity",
                                 "-Infinity", float("nan"), float("inf"), float("-inf"),
                                 1e300, 10**400, "9" * 41, "1" * 5000 + "Gi", "1e31",
                                 "99999999999999999999E"]


@pytest.mark.parametrize("value", HOSTILE_QUANTITIES, ids=lambda v: repr(v)[:24])
def test_hostile_quantities_are_value_errors_at_once(value: Any) -> None:
    with within(), pytest.raises(ValueError) as err:
        parse_quantity(value)
    message = str(err.value)
    assert "\n" not in message and len(message) < 200, message


@pytest.mark.parametrize(("value", "want"), [
    ("1e29", 10**29), ("123456789012345678901234567890e-10", 12345678901234567891),
    ("0.5Ki", 512), ("1.5", 2), (3.0, 3), ("7E", 7 * 10**18)])
def test_in_range_quantities_stay_exact(value: Any, want: int) -> None:
    assert quantity_bytes(value) == want


@pytest.mark.parametrize("value", ["1e999999", "NaN", float("nan"), float("inf"),
                                   "1e99999999"], ids=repr)
def test_gpu_min_memory_names_the_field(value: Any) -> None:
    m = load_machine(testdata.MACHINES / "dgx-a100-like.yaml")
    with within(), pytest.raises(TopologyError) as err:
        parse_gpu_requests(json.dumps([{"count": 1, "minMemory": value}]), m)
    assert str(err.value).startswith("[0].minMemory: "), str(err.value)


@pytest.mark.parametrize("value", ["1e999999", float("nan"), float("-inf")], ids=repr)
def test_pod_resources_name_the_field(value: Any) -> None:
    doc = {"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": {"memory": value}}}]}}
    with within(), pytest.raises(TopologyError) as err:
        pod_from_dict(doc)
    assert str(err.value).startswith("spec.containers[0].resources.limits.memory: "), (
        str(err.value))


def _machine(cpus: str, memory: Any = "1Gi") -> dict[str, Any]:
    return {"name": "m", "numaNodes": [{"id": 0, "cpus": cpus, "memory": memory}]}


@pytest.mark.parametrize("cpus", ["0-999999999", "0-8192", "99999999999999999999999",
                                  "0-3," * 20000, "0-15:0", "0-1:99999999999"],
                         ids=lambda v: v[:16])
def test_machine_cpulists_are_capped(cpus: str) -> None:
    with within(), pytest.raises(MachineError) as err:
        machine_from_dict(_machine(cpus))
    assert str(err.value).startswith("machine: numaNodes[0].cpus: "), str(err.value)
    assert len(str(err.value)) < 200


def test_machine_memory_quantity_names_the_field() -> None:
    with within(), pytest.raises(MachineError, match=r"^machine: numaNodes\[0\]\.memory: "):
        machine_from_dict(_machine("0-3", "1e999999"))


def test_cpulists_at_the_kernel_limit_parse_in_linear_time() -> None:
    assert parse_cpulist("0-8191") == list(range(8192))
    assert parse_cpulist("8191,0-15:4") == [0, 4, 8, 12, 8191]
    # Many overlapping full ranges: bounded by the text, not by ranges x width.
    text = ",".join(["0-8191"] * 6000)
    with within():
        assert len(parse_cpulist(text)) == 8192
    with pytest.raises(ValueError, match="beyond the kernel's limit of 8192 CPUs"):
        parse_cpulist("8192")
    with pytest.raises(ValueError, match="negative cpu"):
        parse_cpulist("-1")


def test_binary_machine_file_is_a_file_error(tmp_path: Path) -> None:
    path = tmp_path / "machine.yaml"
    path.write_bytes(b"name: m\nnumaNodes:\n\xff\xfe\x00garbage")
    with within(), pytest.raises(MachineError) as err:
        load_machine(path)
    assert str(err.value).startswith(f"{path}: is not UTF-8 text"), str(err.value)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_fifo_machine_file_does_not_hang(tmp_path: Path) -> None:
    path = tmp_path / "machine.yaml"
    os.mkfifo(path)
    # In a child process: the unfixed reader blocks forever on a FIFO without a writer.
    code = ("import sys\nfrom numalign.topology.machine import load_machine\n"
            "try:\n    load_machine(sys.argv[1])\nexcept Exception as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.stdout.strip() == f"{path}: is not a regular file", proc.stdout + proc.stderr


def test_huge_machine_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "machine.yaml"
    path.write_text(yaml.safe_dump(_machine("0-3")) + "#" * (5 << 20) + "\n")
    with within(), pytest.raises(MachineError, match=r"is larger than 4 MiB$"):
        load_machine(path)


def _wide_merge_line(resources: int = 8, hints: int = 300, seed: int = 1) -> dict[str, Any]:
    rnd = random.Random(seed)
    ids = list(range(64))
    providers = [{f"r{p}": [{"numaNodes": sorted(rnd.sample(ids, rnd.randint(20, 60))),
                             "preferred": False} for _ in range(hints)]}
                 for p in range(resources)]
    return {"policy": "best-effort", "numaNodes": ids, "providers": providers}


def _merge(lines: list[Any]) -> tuple[int, list[dict[str, Any]]]:
    out = io.StringIO()
    status = run(lines, out)
    return status, [json.loads(line) for line in out.getvalue().splitlines()]


def test_merge_of_many_wide_providers_at_64_nodes_is_refused_quickly() -> None:
    good = {"policy": "restricted", "numaNodes": [0, 1],
            "providers": [{"cpu": [{"numaNodes": [0], "preferred": True}]}]}
    with within(3 * FAST):
        status, replies = _merge([json.dumps(_wide_merge_line()), json.dumps(good)])
    assert status == 1
    assert replies[0]["error"].startswith("providers: too much work: 8 resources"), replies[0]
    assert replies[0]["error"].endswith("; refused")
    # The refusal is for that line only: the next one is decided.
    assert replies[1] == {"hint": {"numaNodes": [0], "preferred": True}, "admit": True}


def test_merge_refuses_an_overlong_line_without_reading_it_whole() -> None:
    big = b'{"policy": "none", "numaNodes": [0], "providers": [' + b" " * MAX_LINE_BYTES + b"]}\n"
    stream = io.BytesIO(big + b'{"policy": "none", "numaNodes": [0], "providers": []}\n')
    got = list(bounded_lines(stream))
    status, replies = _merge(got)
    assert status == 1
    assert replies[0] == {"error": f"line of {len(big)} bytes is longer than {MAX_LINE_BYTES} "
                                   "bytes; refused"}
    assert replies[1]["admit"] is True

