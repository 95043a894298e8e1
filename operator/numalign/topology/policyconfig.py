"""Topology Manager policy names (the kubelet's; the registry, ``numalign.topology.policies``,
lists every policy), scopes and policy options, as the kubelet has them.

``parse_policy_options`` mirrors the kubelet's ``NewPolicyOptions``: the same option
names, the same parsing rules (Go's ``strconv.ParseBool`` / ``strconv.Atoi``) and the
same error wording. One deliberate difference: the default NUMA node limit is 64, not
the kubelet's 8, because this engine does not enumerate the cross product. The minimum
accepted value of ``max-allowable-numa-nodes`` stays the kubelet's 8.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from numalign.topology.errors import TopologyError

POLICY_NONE = "none"
POLICY_BEST_EFFORT = "best-effort"
POLICY_RESTRICTED = "restricted"
POLICY_SINGLE_NUMA_NODE = "single-numa-node"
# The list of policies is the registry's (numalign.topology.policies.names()).

SCOPE_CONTAINER = "container"
SCOPE_POD = "pod"
SCOPES: tuple[str, ...] = (SCOPE_CONTAINER, SCOPE_POD)

OPTION_PREFER_CLOSEST_NUMA_NODES = "prefer-closest-numa-nodes"
OPTION_MAX_ALLOWABLE_NUMA_NODES = "max-allowable-numa-nodes"
OPTIONS: tuple[str, ...] = (OPTION_PREFER_CLOSEST_NUMA_NODES, OPTION_MAX_ALLOWABLE_NUMA_NODES)

# The kubelet's defaultMaxAllowableNUMANodes: the smallest value the option accepts.
KUBELET_MIN_MAX_ALLOWABLE_NUMA_NODES = 8
# Our default limit when the option is not given (the kubelet's is 8).
DEFAULT_MAX_ALLOWABLE_NUMA_NODES = 64

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


@dataclass(frozen=True, slots=True)
class PolicyOptions:
    prefer_closest_numa_nodes: bool = False
    max_allowable_numa_nodes: int = DEFAULT_MAX_ALLOWABLE_NUMA_NODES

    def to_json(self) -> dict[str, str]:
        return {
            OPTION_PREFER_CLOSEST_NUMA_NODES: "true" if self.prefer_closest_numa_nodes else "false",
            OPTION_MAX_ALLOWABLE_NUMA_NODES: str(self.max_allowable_numa_nodes),
        }


def go_quote(s: str) -> str:
    """Go's ``%q`` / ``strconv.Quote`` for the strings that appear in messages."""
    out = ['"']
    for ch in s:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\a":
            out.append("\\a")
        elif ch == "\b":
            out.append("\\b")
        elif ch == "\f":
            out.append("\\f")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\v":
            out.append("\\v")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\x{o:02x}")
        elif not ch.isprintable():
            out.append(f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_go_bool(value: str) -> bool:
    """``strconv.ParseBool``; raises ValueError with Go's message."""
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"strconv.ParseBool: parsing {go_quote(value)}: invalid syntax")


def parse_go_int(value: str) -> int:
    """``strconv.Atoi`` on a 64-bit platform; raises ValueError with Go's message."""
    body = value[1:] if value[:1] in ("+", "-") else value
    if not body or not all("0" <= c <= "9" for c in body):
        raise ValueError(f"strconv.Atoi: parsing {go_quote(value)}: invalid syntax")
    n = int(value)
    if n < _INT64_MIN or n > _INT64_MAX:
        raise ValueError(f"strconv.Atoi: parsing {go_quote(value)}: value out of range")
    return n


def check_scope(scope: str, field: str = "scope") -> str:
    if scope not in SCOPES:
        raise TopologyError(field, f"unknown scope: {go_quote(scope)}")
    return scope


def parse_policy_options(
    options: Mapping[str, str] | None, field: str = "options"
) -> PolicyOptions:
    """Parse Topology Manager policy options as the kubelet's ``NewPolicyOptions`` does.

    Errors are ``TopologyError`` naming ``field.OPTION`` (or ``field`` for an unknown
    option) with the kubelet's wording. Options are checked in sorted order so that the
    error is deterministic (the kubelet walks a Go map, in random order).
    """
    prefer_closest = False
    max_nodes = DEFAULT_MAX_ALLOWABLE_NUMA_NODES
    for name in sorted(options or {}):
        value = (options or {})[name]
        if name not in OPTIONS:
            raise TopologyError(field, f"unknown Topology Manager Policy option: {go_quote(name)}")
        if not isinstance(value, str):
            raise TopologyError(f"{field}.{name}", "must be a string")
        if name == OPTION_PREFER_CLOSEST_NUMA_NODES:
            try:
                prefer_closest = parse_go_bool(value)
            except ValueError as e:
                raise TopologyError(
                    f"{field}.{name}", f"bad value for option {go_quote(name)}: {e}"
                ) from None
        else:
            try:
                n = parse_go_int(value)
            except ValueError as e:
                raise TopologyError(
                    f"{field}.{name}",
                    f"unable to convert policy option to integer {go_quote(name)}: {e}",
                ) from None
            if n < KUBELET_MIN_MAX_ALLOWABLE_NUMA_NODES:
                raise TopologyError(
                    f"{field}.{name}",
                    f"the minimum value of {go_quote(name)} should not be less than "
                    f"{KUBELET_MIN_MAX_ALLOWABLE_NUMA_NODES}",
                )
            max_nodes = n
    return PolicyOptions(
        prefer_closest_numa_nodes=prefer_closest, max_allowable_numa_nodes=max_nodes
    )


def check_numa_node_count(
    numa_ids: list[int] | tuple[int, ...], options: PolicyOptions, field: str = "numaNodes",
) -> None:
    """The kubelet refuses to build an aligning policy (any but none) on a machine with
    more NUMA nodes than ``max-allowable-numa-nodes``."""
    if len(numa_ids) > options.max_allowable_numa_nodes:
        raise TopologyError(
            field,
            f"unsupported on machines with more than {options.max_allowable_numa_nodes} "
            "NUMA Nodes",
        )
