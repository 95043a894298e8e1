"""Policy plugins: modules outside numalign that register more policies.

Two ways to name one, both read by :func:`load_plugins`:

- the ``NUMALIGN_POLICY_MODULES`` environment variable, comma-separated entries
  ``module`` or ``module:attribute`` (set it for the operator, the agent, the extender
  and any command that should know the policies);
- the ``numalign.policies`` entry-point group of an installed package, each entry
  ``name = "module:attribute"``.

What an entry names is a policy (an :class:`AlignmentPolicy` instance, or a subclass
with a no-argument constructor) or a sequence of them; a bare module entry takes the
module's ``POLICIES``. A module that cannot be imported, or names no policy, raises
:class:`PolicyPluginError` naming the module and the problem (so does a policy whose
name is taken).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable

from .base import AlignmentPolicy

ENV = "NUMALIGN_POLICY_MODULES"
ENTRY_POINT_GROUP = "numalign.policies"
MODULE_ATTRIBUTE = "POLICIES"


class PolicyPluginError(Exception):
    """A policy plugin could not be loaded; ``str(err)`` names it and the problem."""


def _policies(value: object, where: str) -> list[AlignmentPolicy]:
    if isinstance(value, type) and issubclass(value, AlignmentPolicy):
        cls = value
        try:
            value = cls()
        except Exception as e:  # a plugin's constructor may raise anything
            raise PolicyPluginError(f"policy plugin {where}: cannot create "
                                    f"{cls.__name__}: {e}") from None
    if isinstance(value, AlignmentPolicy):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        out: list[AlignmentPolicy] = []
        for v in value:
            out += _policies(v, where)
        return out
    raise PolicyPluginError(f"policy plugin {where}: {type(value).__name__} is not a "
                            "policy (an AlignmentPolicy, its class or a list of them)")


def load_spec(spec: str) -> list[AlignmentPolicy]:
    """The policies ``module`` or ``module:attribute`` names (imported, not registered)."""
    module_name, _, attribute = spec.strip().partition(":")
    where = repr(spec.strip())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # whatever the module raises, say which one
        raise PolicyPluginError(f"policy plugin {where}: cannot import {module_name!r}: "
                                f"{type(e).__name__}: {e}") from None
    attr = attribute or MODULE_ATTRIBUTE
    if not hasattr(module, attr):
        raise PolicyPluginError(f"policy plugin {where}: module {module_name!r} has no "
                                f"{attr}")
    return _policies(getattr(module, attr), where)


def _entry_point_specs() -> list[str]:
    from importlib.metadata import entry_points

    return [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]


def plugin_policies(env: str | None = None, *,
                    entry_points: bool = True) -> list[tuple[str, AlignmentPolicy]]:
    """The policies ``env`` (default: ``$NUMALIGN_POLICY_MODULES``) and the entry points
    name, each with its entry, imported (the registry's ``load_plugins`` registers them).
    Raises PolicyPluginError."""
    raw = os.environ.get(ENV, "") if env is None else env
    specs = [s.strip() for s in raw.split(",") if s.strip()]
    if entry_points:
        specs += _entry_point_specs()
    return [(spec, policy) for spec in specs for policy in load_spec(spec)]
