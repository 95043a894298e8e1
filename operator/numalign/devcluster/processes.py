"""Background processes of the dev cluster: start with a log and a pid file, find out
whether one still runs (surviving the Python process that started it), stop it."""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

LOCAL_PORT_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PORT = 10000


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (32768 by default)."""
    try:
        return max(LOWEST_PORT + 1000, int(LOCAL_PORT_RANGE.read_text().split()[0]))
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free on 127.0.0.1 right now, below the kernel's
    ephemeral range: a port a component binds seconds later cannot have been taken
    meanwhile by some client's outgoing connection (the ports bind(0) gives can)."""
    rng = random.SystemRandom()
    high = _ephemeral_low()
    socks: list[socket.socket] = []
    try:
        tries = 200 * count
        while len(socks) < count:
            if tries == 0:
                raise OSError(f"no {count} free TCP ports on 127.0.0.1 in "
                              f"{LOWEST_PORT}-{high}")
            tries -= 1
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", rng.randrange(LOWEST_PORT, high)))
            except OSError:
                s.close()
                continue
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: SIGTERM this process when the process that started it exits."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _proc_state(pid: int) -> str | None:
    """The process's state letter from /proc (None where /proc is not available)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()[0]


def _leads_own_session(pid: int) -> bool:
    """Whether ``pid`` leads its own session, as every process :meth:`Process.start` starts
    does (``start_new_session``): a pid file naming init, a shell's child or any process
    started otherwise is not ours to signal."""
    if pid <= 1:
        return False
    try:
        return os.getsid(pid) == pid
    except OSError:
        return False


CMDLINE_SETTLE_S = 1.0


def _read_cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _proc_exe_matches(pid: int, program: str) -> bool:
    """Whether the process runs ``program`` (guards against a recycled pid).

    A process just started reads an empty command line for a moment: Popen returns when
    the child's exec closes its error pipe, before the kernel has set the new program's
    arguments. An empty command line is read again until it settles (bounded)."""
    if not program:
        return False
    deadline = time.monotonic() + CMDLINE_SETTLE_S
    while True:
        raw = _read_cmdline(pid)
        if raw is None:
            return True  # no /proc: trust the pid
        if raw or time.monotonic() >= deadline or _proc_state(pid) in ("Z", "X", None):
            break
        time.sleep(0.01)
    args = raw.split(b"\0")
    return bool(args) and any(a.decode(errors="replace").endswith(program) for a in args[:3])


class Process:
    """One named component: its command, log file and pid file under the state dir."""

    def __init__(self, name: str, run_dir: Path, log_dir: Path,
                 die_with_parent: bool = False) -> None:
        self.name = name
        self.die_with_parent = die_with_parent
        self.pid_file = run_dir / f"{name}.pid"
        self.log_file = log_dir / f"{name}.log"
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        try:
            pid_text, _, _program = self.pid_file.read_text().partition("\n")
            return int(pid_text)
        except (OSError, ValueError):
            return None

    @property
    def program(self) -> str:
        try:
            return self.pid_file.read_text().partition("\n")[2].strip()
        except OSError:
            return ""

    def start(self, argv: Sequence[str], env: Mapping[str, str] | None = None,
              cwd: Path | None = None, program: str | None = None,
              die_with_parent: bool | None = None) -> None:
        """Start ``argv``; ``program`` (default: the executable's name) is what a later
        is_running() looks for in the process's command line. ``die_with_parent``
        (Linux; default: as constructed): the process gets SIGTERM when the caller
        exits, e.g. a killed test run."""
        if die_with_parent is None:
            die_with_parent = self.die_with_parent
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            self._popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                start_new_session=True,  # own process group; survives the caller's Ctrl-C
                preexec_fn=_die_with_parent if die_with_parent and sys.platform == "linux"
                else None,
            )
        self.pid_file.write_text(f"{self._popen.pid}\n{program or Path(argv[0]).name}\n")

    def is_running(self) -> bool:
        if self._popen is not None:
            return self._popen.poll() is None
        pid = self.pid
        if pid is None:
            return False
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False
        if _proc_state(pid) in ("Z", "X"):
            return False
        return _leads_own_session(pid) and _proc_exe_matches(pid, self.program)

    def exit_code(self) -> int | None:
        return self._popen.poll() if self._popen is not None else None

    def terminate(self) -> None:
        """Send SIGTERM without waiting (stop() then waits); lets several stop at once."""
        pid = self.pid
        if pid is not None and self.is_running():
            self._signal(pid, signal.SIGTERM)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL after ``timeout``; forget the pid file."""
        pid = self.pid
        if pid is not None and self.is_running():
            self._signal(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self.is_running() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self.is_running():
                self._signal(pid, signal.SIGKILL)
                deadline = time.monotonic() + 5
                while self.is_running() and time.monotonic() < deadline:
                    time.sleep(0.05)
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=1)
            self._popen = None
        self.pid_file.unlink(missing_ok=True)

    @staticmethod
    def _signal(pid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pid, sig)  # started with start_new_session: pgid == pid
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.rstrip().splitlines()[-lines:])
