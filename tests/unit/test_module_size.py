"""Every hand-written Python module of the project (operator/, tests/, bench/, plugins/)
stays under 600 lines: a module past that is split by job before it merges. Generated
protobuf and gRPC modules (``*_pb2.py``, ``*_pb2_grpc.py``) are protoc's output and exempt."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("operator", "tests", "bench", "plugins")
LIMIT = 600


def _hand_written() -> list[Path]:
    return sorted(p for root in ROOTS for p in (REPO / root).rglob("*.py")
                  if "_pb2" not in p.name)


def test_the_walk_sees_the_project() -> None:
    files = {p.relative_to(REPO).as_posix() for p in _hand_written()}
    assert {"operator/numalign/cli.py", "tests/unit/test_module_size.py"} <= files
    assert not any("_pb2" in f for f in files)


def test_every_hand_written_module_is_under_the_limit() -> None:
    long = {}
    for path in _hand_written():
        with path.open("rb") as f:
            lines = sum(1 for _ in f)
        if lines >= LIMIT:
            long[path.relative_to(REPO).as_posix()] = lines
    assert not long, (f"modules of {LIMIT} lines or more (split them by job): "
                      + ", ".join(f"{p} ({n})" for p, n in sorted(long.items())))
