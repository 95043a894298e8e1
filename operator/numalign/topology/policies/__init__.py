"""Topology Manager policies as objects behind one interface
(:class:`~numalign.topology.policies.base.AlignmentPolicy`), one small module each, and
the registry the engine looks them up in by name. A new policy is one module and one
entry in :data:`BUILTIN` (the API's list of policy names, ``numalign.api.common.Policy``,
is checked against it by a test)."""

from __future__ import annotations

from numalign.topology.errors import TopologyError
from numalign.topology.policy import go_quote

from .base import AlignmentPolicy
from .best_effort import BestEffortPolicy
from .none import NonePolicy
from .restricted import RestrictedPolicy
from .single_numa_node import SingleNumaNodePolicy

BUILTIN: tuple[AlignmentPolicy, ...] = (
    NonePolicy(), BestEffortPolicy(), RestrictedPolicy(), SingleNumaNodePolicy())

_REGISTRY: dict[str, AlignmentPolicy] = {p.name: p for p in BUILTIN}


def get_policy(name: str, field: str = "policy") -> AlignmentPolicy:
    """The policy called ``name``; TopologyError (the kubelet's wording) when none is."""
    policy = _REGISTRY.get(name) if isinstance(name, str) else None
    if policy is None:
        raise TopologyError(field, f"unknown policy: {go_quote(str(name))}")
    return policy


def register(policy: AlignmentPolicy) -> None:
    """Add a policy to the registry (a name taken already is an error)."""
    if not policy.name or policy.name in _REGISTRY:
        raise ValueError(f"policy name {policy.name!r} is empty or taken")
    _REGISTRY[policy.name] = policy


def unregister(name: str) -> None:
    """Remove a registered policy (never a built-in one)."""
    if any(p.name == name for p in BUILTIN):
        raise ValueError(f"{name!r} is a built-in policy")
    _REGISTRY.pop(name, None)


def names() -> tuple[str, ...]:
    return tuple(_REGISTRY)


__all__ = ["BUILTIN", "AlignmentPolicy", "get_policy", "names", "register", "unregister"]
