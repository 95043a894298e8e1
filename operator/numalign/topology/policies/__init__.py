"""Topology Manager policies as objects behind one interface
(:class:`~numalign.topology.policies.base.AlignmentPolicy`), one small module each, and
the registry: the only list of policy names. The CRD enums (``numalign.api.common``), the
wire's validation, the NodeResourceTopology export and the agent's metrics all read it,
so a policy registered here (:func:`register`, or a plugin module the loader imports:
``numalign.topology.policies.loader``) is known everywhere, with no other edit.

:func:`get_policy` and :func:`known` look a name up; on a miss they load the plugins once
(``NUMALIGN_POLICY_MODULES`` and the ``numalign.policies`` entry points) and look again,
so that a command that names only a built-in policy never pays for the plugin lookup.
:func:`names` (every policy, the plugins' included) loads them first."""

from __future__ import annotations

from numalign.topology.errors import TopologyError
from numalign.topology.policyconfig import go_quote

from .base import AlignmentPolicy
from .best_effort import BestEffortPolicy
from .none import NonePolicy
from .restricted import RestrictedPolicy
from .single_numa_node import SingleNumaNodePolicy

BUILTIN: tuple[AlignmentPolicy, ...] = (
    NonePolicy(), BestEffortPolicy(), RestrictedPolicy(), SingleNumaNodePolicy())

_REGISTRY: dict[str, AlignmentPolicy] = {p.name: p for p in BUILTIN}
_plugins_loaded = False


def _load_plugins() -> None:
    """Import the plugin policy modules once (a bad one raises PolicyPluginError)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    load_plugins()
    _plugins_loaded = True


def load_plugins(env: str | None = None, *, entry_points: bool = True) -> list[str]:
    """Register the policies of the plugins ``env`` (default:
    ``$NUMALIGN_POLICY_MODULES``) and the ``numalign.policies`` entry points name; the
    names registered. Raises PolicyPluginError (a module that cannot be loaded, or a
    policy whose name another one has)."""
    from .loader import PolicyPluginError, plugin_policies

    added: list[str] = []
    for spec, policy in plugin_policies(env, entry_points=entry_points):
        try:
            register(policy)
        except ValueError as e:
            raise PolicyPluginError(f"policy plugin {spec!r}: {e}") from None
        added.append(policy.name)
    return added


def _lookup(name: object) -> AlignmentPolicy | None:
    if not isinstance(name, str):
        return None
    policy = _REGISTRY.get(name)
    if policy is None and not _plugins_loaded:
        _load_plugins()
        policy = _REGISTRY.get(name)
    return policy


def get_policy(name: str, field: str = "policy") -> AlignmentPolicy:
    """The policy called ``name``; TopologyError (the kubelet's wording, then the known
    names) when none is."""
    policy = _lookup(name)
    if policy is None:
        raise TopologyError(field, f"unknown policy: {go_quote(str(name))} "
                                   f"(known: {', '.join(names())})")
    return policy


def check_policy(name: str, field: str = "policy", *, kubelet: bool = False) -> str:
    """``name`` when it is a registered policy (with ``kubelet``: one of the kubelet's
    own, as a real kubelet's configuration must name); the TopologyError of
    :func:`get_policy` otherwise."""
    if kubelet and name not in kubelet_names():
        raise TopologyError(field, f"unknown policy: {go_quote(str(name))} "
                                   f"(known: {', '.join(kubelet_names())})")
    return get_policy(name, field).name


def known(name: object) -> bool:
    """Whether ``name`` is a registered policy (any value: a non-string is not)."""
    return _lookup(name) is not None


def names() -> tuple[str, ...]:
    """Every registered policy's name: the kubelet's four first, then the others in the
    order they were registered."""
    _load_plugins()
    return tuple(_REGISTRY)


def kubelet_names() -> tuple[str, ...]:
    """The kubelet's own policies (what a real kubelet's configuration can name)."""
    return tuple(p.name for p in BUILTIN)


def register(policy: AlignmentPolicy) -> None:
    """Add a policy to the registry (a name taken already is an error, unless by this
    very policy: loading a plugin twice is harmless)."""
    taken = _REGISTRY.get(policy.name)
    if taken is not None and type(taken) is type(policy):
        return
    if not policy.name or taken is not None:
        raise ValueError(f"policy name {policy.name!r} is empty or taken")
    _REGISTRY[policy.name] = policy


def unregister(name: str) -> None:
    """Remove a registered policy (never a built-in one)."""
    if name in kubelet_names():
        raise ValueError(f"{name!r} is a built-in policy")
    _REGISTRY.pop(name, None)


__all__ = ["BUILTIN", "AlignmentPolicy", "check_policy", "get_policy", "known",
           "kubelet_names", "load_plugins", "names", "register", "unregister"]
