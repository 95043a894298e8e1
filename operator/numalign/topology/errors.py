"""Errors raised by the alignment engine for bad input."""

from __future__ import annotations


class TopologyError(ValueError):
    """Bad input to the engine. ``str(err)`` is one line naming the field and the problem."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


class MachineError(TopologyError):
    """A machine description (file or discovered) is malformed."""


class InvalidPodRequest(TopologyError):
    """A pod's own request for a kind of resource (an annotation such as
    ``numalign.io/gpus``) cannot be read or asks what the machine cannot name."""
