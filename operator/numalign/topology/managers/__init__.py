"""The registry of resource kinds: every kind of resource the admission aligns is one
hint provider (:class:`~numalign.topology.managers.base.HintProvider`), made for each pod
by its kind (:class:`~numalign.topology.managers.base.ProviderKind`). The admission
(:func:`numalign.topology.admit.admit_pod`) walks :func:`providers_for`; nothing else
names the kinds.

Built in, in hint order: CPUs (``cpu``, 10), memory and hugepages (``memory``, 20), the
device manager's devices (``devices``, 30), GPU groups from ``numalign.io/gpus``
(``gpu-groups``, 50: :mod:`.gpu_groups`). A caller with kinds of its own for one
admission passes them to ``admit_pod(providers=...)`` (the NRI agent's devices the
kubelet assigned, 40: ``numalign.agent.nri.devices``; the devices kube-scheduler
allocated to a pod's ResourceClaims, 45: :mod:`.dra`).

To add a resource kind, write one provider and :func:`register` its kind (a toy one:
``tests/unit/test_resource_kinds.py``). The provider declares

- ``name`` (explain labels its hints with it; ``AdmitResult.reports`` keys), ``manager``
  (the kubelet hint provider it is part of: "cpu", "memory" or "devices"; a device-plugin
  resource is "devices"), ``allocation_order`` (the kubelet allocates devices 0, CPUs 1,
  memory 2),
- ``claims``: the device resources it takes from the plain device provider,
- ``room_by_counts``: whether as many free devices on the same NUMA nodes always admit
  the pod the same way (the scheduler extender's shortcut; False decides afresh),

and answers ``ask`` (demands for the hint generator, or hint lists as they are, for one
decision), ``hints`` (its map for the merge), ``allocate`` (one container inside the
merged hint, raising ``AllocationFailed`` with the kubelet's message) and ``report``.
What it allocates into a container's ``devices`` is recorded in the ledger and goes, with
no change elsewhere, to the node's wire record (``api/allocation.py``), its NodeTopology status
(``api/nodestatus.py``, ``agent/topostatus.py``) and the extender's room check; ``report``
reaches ``AdmitResult.reports`` (GPU groups' also the wire record's ``gpus``).
"""

from __future__ import annotations

from collections.abc import Sequence

from .base import Admission, HintProvider, Kind, ProviderKind
from .cpu import CpuProvider
from .devices import DeviceProvider
from .gpu_groups import GpuGroups
from .memory import MemoryProvider

BUILTIN: tuple[ProviderKind, ...] = (
    Kind("cpu", 10, CpuProvider),
    Kind("memory", 20, MemoryProvider),
    Kind("devices", 30, DeviceProvider),
    GpuGroups(),
)

_KINDS: dict[str, ProviderKind] = {k.name: k for k in BUILTIN}
_ORDER: list[ProviderKind] = list(BUILTIN)  # _KINDS in hint order


def register(kind: ProviderKind) -> None:
    """Add a kind of resource to every admission; raises ValueError if its name is taken."""
    if kind.name in _KINDS:
        raise ValueError(f"resource kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    _ORDER[:] = _ordered(())


def unregister(name: str) -> None:
    """Remove a registered kind (a built-in one cannot be removed)."""
    if any(k.name == name for k in BUILTIN):
        raise ValueError(f"resource kind {name!r} is built in")
    _KINDS.pop(name, None)
    _ORDER[:] = _ordered(())


def names() -> list[str]:
    """The registered kinds' names, in hint order."""
    return [k.name for k in _ORDER]


def _ordered(extra: Sequence[ProviderKind]) -> list[ProviderKind]:
    return sorted([*_KINDS.values(), *extra], key=lambda k: k.hint_order)


def providers_for(admission: Admission,
                  extra: Sequence[ProviderKind] = ()) -> list[HintProvider]:
    """The pod's providers in hint order: every registered kind's and ``extra``'s that
    take part. A device resource two providers claim belongs to the later; a provider
    left with none of its claims takes no part. Sets ``admission.claimed``."""
    made = [p for k in (_ordered(extra) if extra else _ORDER)
            if (p := k.for_pod(admission)) is not None]
    if not any(p.claims for p in made):
        return made
    owner: dict[str, int] = {}
    for i, p in enumerate(made):
        owner.update(dict.fromkeys(p.claims, i))
    kept = [p for i, p in enumerate(made)
            if not p.claims or any(owner[r] == i for r in p.claims)]
    admission.claimed = frozenset(owner)
    return kept


__all__ = ["BUILTIN", "Admission", "HintProvider", "Kind", "ProviderKind", "names",
           "providers_for", "register", "unregister"]
