"""``numalign merge``: JSON lines in, JSON lines out."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from typing import Any

import pytest

from numalign.commands.merge import main, run


def lines_of(*docs: Any) -> list[str]:
    return [d if isinstance(d, str) else json.dumps(d) for d in docs]


def run_lines(*docs: Any) -> tuple[int, list[dict[str, Any]]]:
    out = io.StringIO()
    status = run(lines_of(*docs), out)
    return status, [json.loads(line) for line in out.getvalue().splitlines()]


def hint(ids: list[int] | None, preferred: bool) -> dict[str, Any]:
    return {"numaNodes": ids, "preferred": preferred}


GOOD = {
    "policy": "restricted",
    "numaNodes": [0, 1],
    "providers": [
        {"cpu": [hint([0], True), hint([0, 1], False)]},
        {"gpu": [hint([1], True)]},
    ],
}


def test_decisions() -> None:
    status, out = run_lines(
        GOOD,
        "",
        "   ",
        {"policy": "best-effort", "numaNodes": [0, 1], "providers": []},
        {"policy": "single-numa-node", "numaNodes": [0, 1], "providers": [None, {}]},
        {"policy": "best-effort", "numaNodes": [0, 1], "providers": [{"cpu": []}]},
        {"policy": "none", "options": {"bogus": "x"}, "numaNodes": [0], "providers": []},
        {
            "policy": "best-effort",
            "options": {"prefer-closest-numa-nodes": "true"},
            "numaNodes": [0, 2, 4],
            "distances": {"0": [10, 30, 12], "2": [30, 10, 30], "4": [12, 30, 10]},
            "providers": [{"cpu": [hint([0, 2], True), hint([0, 4], True)]}],
        },
    )
    assert status == 0
    assert out == [
        {"hint": hint([1], False), "admit": False},
        {"hint": hint([0, 1], True), "admit": True},
        {"hint": hint(None, True), "admit": True},
        {"hint": hint([0, 1], False), "admit": True},
        {"hint": hint(None, False), "admit": True},
        {"hint": hint([0, 4], True), "admit": True},
    ]


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        ({**GOOD, "providers": [None, {"gpu": [hint([9], True)]}]},
         "providers[1].gpu[0].numaNodes: NUMA node 9 is not in numaNodes [0, 1]"),
        ({**GOOD, "policy": "strict"}, 'policy: unknown policy: "strict"'),
        ({**GOOD, "options": {"max-allowable-numa-nodes": "4"}},
         'options.max-allowable-numa-nodes: the minimum value of "max-allowable-numa-nodes" '
         "should not be less than 8"),
        ({**GOOD, "options": {"prefer-closest-numa-nodes": "true"}}, "distances:"),
        ({**GOOD, "numaNodes": []}, "numaNodes: must name at least one NUMA node"),
        ({**GOOD, "numaNodes": [0, 0]}, "numaNodes[1]: NUMA node 0 is listed twice"),
        ({**GOOD, "numaNodes": list(range(65))},
         "numaNodes: unsupported on machines with more than 64 NUMA Nodes"),
        ({**GOOD, "providers": [{"cpu": [{"numaNodes": [0]}]}]},
         "providers[0].cpu[0].preferred: must be true or false"),
        ({**GOOD, "providers": [{"cpu": "x"}]}, "providers[0].cpu: must be a list"),
        ({**GOOD, "distances": {"0": [10]}}, "distances.0: must be a list of 2"),
        ({k: v for k, v in GOOD.items() if k != "providers"}, "providers: is missing"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "each line must be a JSON object"),
    ],
)
def test_bad_lines(doc: Any, error: str) -> None:
    status, out = run_lines(doc, GOOD)
    assert status == 1
    assert len(out) == 2
    assert error in out[0]["error"]
    assert "Traceback" not in out[0]["error"]
    assert out[1] == {"hint": hint([1], False), "admit": False}  # processing goes on


def test_main_reads_stdin(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = ("\n".join(lines_of(GOOD, "nope")) + "\n\xff\n").encode("latin-1")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main([]) == 1
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert out[0]["admit"] is False
    assert "error" in out[1] and "error" in out[2]


def test_subprocess() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "numalign.cli", "merge"],
        input="\n".join(lines_of(GOOD, {**GOOD, "policy": "best-effort"})) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [
        {"hint": hint([1], False), "admit": False},
        {"hint": hint([1], False), "admit": True},
    ]
    assert proc.stderr == ""
