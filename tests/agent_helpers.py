"""``numalign agent --emulate`` as a subprocess, for tests against the real API server
(the ``start_agent`` fixture of tests/cluster/conftest.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from numalign.api.effective import EffectivePolicy, NodeKind, Origin
from numalign.api.resolved import Resolved


class Agent:
    """``numalign agent --emulate`` as a subprocess, for one emulated node."""

    def __init__(self, kubeconfig: Path, machine: Path, index: int, log: Path,
                 extra: tuple[str, ...] = ()) -> None:
        self.kubeconfig = kubeconfig
        self.machine = machine
        self.index = index
        self.log = log
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.node = f"{machine.stem}-{index}"

    def start(self) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "numalign.cli", "agent", "--kubeconfig",
             str(self.kubeconfig), "--emulate", f"{self.machine}=1", "--start", str(self.index),
             "--publish-interval", "0.3", "--log-level", "DEBUG", *self.extra],
            stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ))

    def kill(self) -> None:
        """SIGKILL: no chance to flush anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc = None


StartAgent = Callable[..., Agent]


def given(resolved: Resolved) -> EffectivePolicy:
    """``resolved`` as the policy a pod gets on an emulated node (its own, as
    ``effective_policy`` gives it): what ``NodeState.decide`` takes."""
    return EffectivePolicy.of(resolved, Origin.POD, NodeKind.EMULATED)
