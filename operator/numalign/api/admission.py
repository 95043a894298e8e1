"""The engine's admission of a pod under its resolved policy, as every numalign decider
runs it: the agent on emulated and numalign-managed nodes, and the scheduler extender
deciding as those nodes will (one place, so they cannot drift apart)."""

from __future__ import annotations

from collections.abc import Sequence

from numalign.topology.admit import AdmitResult, ProviderKind, admit_pod
from numalign.topology.errors import InvalidPodRequest, TopologyError
from numalign.topology.ledger import Ledger
from numalign.topology.machine import Machine
from numalign.topology.pod import Pod
from numalign.topology.text import printable

from .effective import EffectivePolicy
from .names import EVENT_INVALID_GPU
from .resolved import Resolved

# A pod whose numalign.io/gpus cannot be read (or asks what the machine cannot name) is
# refused with this reason: Failed, with a Warning event, no allocation.
INVALID_GPU_REASON = EVENT_INVALID_GPU


class InvalidGpuRequest(TopologyError):
    """The pod's ``numalign.io/gpus`` cannot be placed on this machine (the user's
    mistake: the pod is refused rather than run without the GPU placement it asked for)."""


def admit_resolved(machine: Machine, ledger: Ledger, model: Pod,
                   resolved: EffectivePolicy | Resolved, *,
                   devices: Sequence[ProviderKind] = (), commit: bool = True
                   ) -> AdmitResult:
    """Admit ``model`` under ``resolved`` (the effective policy, or a resolution as the
    agent records it) with the registry's providers (GPU groups included); ``devices``:
    providers of device resources someone else already assigned (a real node's device
    manager), which the registry's GPU groups override. Raises :class:`InvalidGpuRequest`
    for a bad GPU request and TopologyError for an unknown policy or scope, or options
    this machine refuses."""
    try:
        if isinstance(resolved, EffectivePolicy):
            return admit_pod(machine, ledger, model, resolved.policy, resolved.scope,
                             resolved.options.engine, providers=devices, commit=commit)
        return admit_pod(machine, ledger, model, resolved.policy or "none",
                         resolved.scope or "container", resolved.options.engine,
                         providers=devices, commit=commit)
    except InvalidPodRequest as e:  # the refusal's message: escaped, whoever raised it
        raise InvalidGpuRequest(printable(e.field), printable(e.problem)) from None
