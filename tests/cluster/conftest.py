"""The control-plane fixtures (``dev_cluster``, ``kubeconfig``, ``kubectl``, ``k8s_client``,
``namespace``, ``wait``) live in ``tests/conftest.py``, shared with ``tests/e2e`` so that
one test session starts one control plane; ``tests/operator_helpers.py`` runs the
operator as a subprocess for both. ``start_agent`` runs emulated nodes
(``tests/agent_helpers.py``)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import testdata
from agent_helpers import Agent, StartAgent

SEED = testdata.MACHINES / "seed-figure1.yaml"

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def start_agent(kubeconfig: Path, kubectl: Kubectl, tmp_path: Path) -> Iterator[StartAgent]:
    """``start_agent(machine=SEED, *extra_args)``: one emulated node, cleaned up after."""
    started: list[Agent] = []

    def start(machine: Path = SEED, *extra: str) -> Agent:
        a = Agent(kubeconfig, machine, 100 + uuid.uuid4().int % 9000,
                  tmp_path / f"agent-{len(started)}.log", tuple(extra))
        started.append(a)
        a.start()
        return a

    try:
        yield start
    finally:
        for a in started:
            a.stop()
            kubectl("delete", "node", a.node, "--ignore-not-found", "--wait=false",
                    check=False)
            kubectl("delete", "nodetopology", a.node, "--ignore-not-found", "--wait=false",
                    check=False)
            kubectl("-n", "kube-node-lease", "delete", "lease", a.node, "--ignore-not-found",
                    check=False)
            if a.log.exists():
                sys.stderr.write(a.log.read_text()[-4000:])
