"""The chart's tests run the helm binary, which they build the way ``numalign dev build``
does (:func:`numalign.devcluster.helmbuild.ensure_helm_built`: from its Go module with
the local Go toolchain, cached under ~/.cache/numalign; instant once built, and ``make
test`` builds it before pytest runs). When it cannot be built the session errors loudly:
a missing helm is a broken setup, not a reason to skip. tests/unit needs nothing built."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from numalign.devcluster.helmbuild import ensure_helm_built


def _log(message: str) -> None:
    print(f"[helm] {message}", file=sys.stderr, flush=True)


@pytest.fixture(scope="session", autouse=True)
def helm_binary() -> Path:
    """The helm binary, built (or found cached) before the first test here."""
    return ensure_helm_built(log=_log)
