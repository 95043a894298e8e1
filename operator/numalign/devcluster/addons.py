"""Extension hooks: Python processes ``DevCluster.up`` starts once the control plane is
ready and the CRDs are established, and ``down`` stops with the rest.

An addon is started only when its module can be imported, so a hook may name code that
does not exist yet. Each runs as ``python -m ...`` with ``KUBECONFIG`` set, logs to
``<state>/logs/<name>.log``, must run until SIGTERM, and is stopped before the control
plane. The built-in hooks:

* ``agent`` -- emulated nodes, when machines were asked for (``numalign dev up
  --machine FILE[=COUNT]``) and ``numalign.agent.emulate`` exists; run as
  ``python -m numalign.cli agent --kubeconfig KC --machine FILE=COUNT ... --metrics-addr
  127.0.0.1 --metrics-port P``.
  Without it, no Node objects exist and pods stay Pending: nodes need the agent.
* ``operator`` -- when asked for (``DevCluster.up(operator=True)``, the default of
  ``numalign dev up``) and ``numalign.commands.operator`` exists; run as
  ``python -m numalign.cli operator --kubeconfig KC --webhook-port P --metrics-port P
  --metrics-addr 127.0.0.1 --cert-dir STATE/operator`` (free ports, recorded with every
  addon's command line in ``state.json``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .crds import NRT_CRD
from .processes import free_ports


class MachineSpecError(ValueError):
    """A ``--machine FILE[=COUNT]`` argument is wrong; the message says how."""


@dataclass(frozen=True)
class MachineSpec:
    """``COUNT`` emulated nodes with the hardware of machine file ``PATH``."""

    path: Path
    count: int = 1

    @classmethod
    def parse(cls, text: str) -> MachineSpec:
        path_text, sep, count_text = text.rpartition("=")
        if not sep or not count_text.isdigit():
            path_text, count = text, 1
        else:
            count = int(count_text)
        if not path_text:
            raise MachineSpecError(f"--machine {text!r}: expected FILE or FILE=COUNT")
        if count < 1:
            raise MachineSpecError(f"--machine {text!r}: COUNT must be at least 1")
        path = Path(path_text).expanduser()
        if not path.is_file():
            raise MachineSpecError(f"--machine {text!r}: no such machine file {path}")
        return cls(path.resolve(), count)

    def __str__(self) -> str:
        return f"{self.path}={self.count}"


@dataclass(frozen=True)
class ClusterInfo:
    """What a hook gets to build its command line."""

    name: str
    state_dir: Path
    kubeconfig: Path
    server: str
    machines: tuple[MachineSpec, ...]
    operator: bool
    dra: bool = False  # dev up --dra: the emulated nodes' devices as DRA ResourceSlices


@dataclass(frozen=True)
class Addon:
    name: str
    """Process name: logs/<name>.log, run/<name>.pid."""
    module: str
    """The addon runs only when this module can be imported."""
    argv: Callable[[ClusterInfo], list[str] | None]
    """Arguments after the Python executable, or None when not wanted this time."""

    def available(self) -> bool:
        try:
            return importlib.util.find_spec(self.module) is not None
        except (ImportError, ValueError):
            return False


def metrics_flags() -> list[str]:
    """``/metrics`` of a numalign process on a free loopback port."""
    (port,) = free_ports(1)
    return ["--metrics-addr", "127.0.0.1", "--metrics-port", str(port)]


def metrics_url(argv: list[str] | None) -> str | None:
    """The ``/metrics`` URL of a numalign process started with ``argv`` (None: none)."""
    argv = list(argv or [])
    if "--metrics-port" not in argv or argv.index("--metrics-port") + 1 >= len(argv):
        return None
    port = argv[argv.index("--metrics-port") + 1]
    addr = argv[argv.index("--metrics-addr") + 1] if "--metrics-addr" in argv[:-1] else (
        "127.0.0.1")
    return f"http://{addr}:{port}/metrics" if port.isdigit() and port != "0" else None


def _agent_argv(info: ClusterInfo) -> list[str] | None:
    if not info.machines:
        return None
    argv = ["-m", "numalign.cli", "agent", "--kubeconfig", str(info.kubeconfig)]
    for m in info.machines:
        argv += ["--machine", str(m)]
    if NRT_CRD.is_file():  # installed with the CRDs: kubectl get noderesourcetopologies
        argv.append("--publish-nrt")
    if info.dra:
        argv.append("--dra")
    return argv + metrics_flags()


def _operator_argv(info: ClusterInfo) -> list[str] | None:
    if not info.operator:
        return None
    webhook_port, metrics_port = free_ports(2)  # several dev clusters may run side by side
    return ["-m", "numalign.cli", "operator", "--kubeconfig", str(info.kubeconfig),
            "--webhook-port", str(webhook_port), "--metrics-addr", "127.0.0.1",
            "--metrics-port", str(metrics_port), "--cert-dir", str(info.state_dir / "operator"),
            "--recreate-bare-pods"]


ADDONS: list[Addon] = [
    Addon("operator", "numalign.commands.operator", _operator_argv),
    Addon("agent", "numalign.agent.emulate", _agent_argv),
]
