"""Where the tests' own data lives (``tests/fixtures/``): nothing outside the checkout."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MACHINES = FIXTURES / "machines"
SYSFS = FIXTURES / "sysfs"
PODS = FIXTURES / "pods"
NVIDIA_SMI = FIXTURES / "nvidia-smi"
