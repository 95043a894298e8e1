"""The resolved policy (``numalign.io/resolved``): :class:`Resolved`, with its typed
:class:`Options`, and their one encoder and one decoder; what a node's default gives a pod
(:func:`node_default`)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from numalign.topology import jsontext
from numalign.topology.errors import TopologyError
from numalign.topology.machine import MAX_NUMA_NODES
from numalign.topology.policies import known as known_policy
from numalign.topology.policies import names as policy_names
from numalign.topology.policyconfig import (
    KUBELET_MIN_MAX_ALLOWABLE_NUMA_NODES,
    OPTION_MAX_ALLOWABLE_NUMA_NODES,
    OPTION_PREFER_CLOSEST_NUMA_NODES,
    SCOPE_CONTAINER,
    SCOPES,
    PolicyOptions,
    parse_go_bool,
    parse_policy_options,
)
from numalign.topology.text import quote

from .errors import WireError
from .names import (
    ANN_RESOLVED,
    SOURCE_NODE_DEFAULT,
    SOURCE_NONE,
    SOURCE_POD,
    SOURCE_POLICY_PREFIX,
)

JSON = dict[str, Any]

DEFAULT_SCOPE = SCOPE_CONTAINER

# maxAllowableNumaNodes: at least the kubelet's minimum (the engine's constant), at most
# the engine's limit per machine.
MIN_MAX_ALLOWABLE_NUMA_NODES = KUBELET_MIN_MAX_ALLOWABLE_NUMA_NODES
MAX_MAX_ALLOWABLE_NUMA_NODES = MAX_NUMA_NODES

# A TopologyPolicy's option name -> the kubelet's (what the engine takes).
KUBELET_OPTION_NAMES: dict[str, str] = {
    "preferClosestNumaNodes": OPTION_PREFER_CLOSEST_NUMA_NODES,
    "maxAllowableNumaNodes": OPTION_MAX_ALLOWABLE_NUMA_NODES,
}
OPTION_KEYS: tuple[str, ...] = tuple(KUBELET_OPTION_NAMES)
# Either spelling -> the kubelet's.
_OPTION_NAMES = {**KUBELET_OPTION_NAMES, **{k: k for k in KUBELET_OPTION_NAMES.values()}}


# A resolution is ~200 bytes; anything much larger is not one (an allocation is bounded
# by jsontext's default, 64 KiB).
MAX_RESOLVED_BYTES = 4096


# ---------------------------------------------------------------- policy options


@dataclass(frozen=True)
class Options:
    """Topology Manager policy options as they cross: the ones given (the kubelet's
    names, string values) and the engine's parsed value (:attr:`engine`), parsed once
    by :func:`parse_options`."""

    given: Mapping[str, str] = field(default_factory=dict)
    engine: PolicyOptions = field(default_factory=PolicyOptions, compare=False)

    def to_json(self) -> JSON:
        """As a TopologyPolicy writes them: ``{"preferClosestNumaNodes": true,
        "maxAllowableNumaNodes": 16}``, only the ones given."""
        out: JSON = {}
        for name, kubelet_name in KUBELET_OPTION_NAMES.items():
            value = self.given.get(kubelet_name)
            if value is None:
                continue
            if kubelet_name == OPTION_PREFER_CLOSEST_NUMA_NODES:
                out[name] = parse_go_bool(value)
            else:
                out[name] = int(value)
        return out

    def __bool__(self) -> bool:
        return bool(self.given)


NO_OPTIONS = Options()


def parse_options(raw: Any, where: str = "options") -> Options:
    """Options in either spelling (``preferClosestNumaNodes`` or the kubelet's
    ``prefer-closest-numa-nodes``), values booleans, integers or strings; checked by the
    engine's parser (the kubelet's rules and wording). Raises WireError naming ``where``."""
    if raw is None:
        return NO_OPTIONS
    if isinstance(raw, Options):
        return raw
    if not isinstance(raw, Mapping):
        raise WireError(f"{where}: options must be an object, got {type(raw).__name__}")
    given: dict[str, str] = {}
    for k, v in raw.items():
        name = _OPTION_NAMES.get(str(k))
        if name is None:
            raise WireError(f"{where}: unknown option {quote(k)}")
        if v is None:
            continue
        if isinstance(v, bool):
            given[name] = "true" if v else "false"
        elif isinstance(v, int | str):
            given[name] = str(v).lower() if isinstance(v, str) else str(v)
        else:
            raise WireError(f"{where}: option {quote(k)} must be a boolean, integer or string")
    if OPTION_MAX_ALLOWABLE_NUMA_NODES in given:
        try:
            n = int(given[OPTION_MAX_ALLOWABLE_NUMA_NODES])
        except ValueError:
            raise WireError(f"{where}: option maxAllowableNumaNodes must be an integer") \
                from None
        if n < MIN_MAX_ALLOWABLE_NUMA_NODES:
            raise WireError(f"{where}: option maxAllowableNumaNodes must be >= "
                            f"{MIN_MAX_ALLOWABLE_NUMA_NODES}, got {n}")
    try:
        engine = parse_policy_options(given, where)
    except TopologyError as e:
        raise WireError(str(e)) from None
    return Options(given, engine)


# ---------------------------------------------------------------- the resolved policy


@dataclass(frozen=True)
class Resolved:
    """The policy a pod gets and where it came from (``numalign.io/resolved``).

    ``policy``/``scope`` are None only when deferred: the operator resolved the pod
    before it was bound and no policy matched, so the node's default applies
    (:func:`node_default`). ``governing`` is the TopologyPolicy whose settings
    (redeploy, overrides) apply; ``problems`` what is wrong with the pod's override
    annotations; ``conflicting`` equally-ranked matching policies (operator only: not
    in the annotation)."""

    policy: str | None = "none"
    scope: str | None = DEFAULT_SCOPE
    options: Options = NO_OPTIONS
    source: str = SOURCE_NONE
    governing: str | None = None
    problems: tuple[str, ...] = ()
    conflicting: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.options, Options):  # a plain mapping: parse it once
            object.__setattr__(self, "options", parse_options(self.options))

    @property
    def deferred(self) -> bool:
        return self.policy is None

    def to_json(self) -> JSON:
        return {"policy": self.policy, "scope": self.scope,
                "options": self.options.to_json(), "source": self.source}

    def annotation(self) -> str:
        """The value of ``numalign.io/resolved``: compact JSON with sorted keys."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


NONE = Resolved()
DEFERRED = Resolved(None, None, NO_OPTIONS, SOURCE_NODE_DEFAULT)


# a TopologyPolicy's name: a DNS-1123 subdomain, as the API server requires
_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def _known_source(source: str) -> bool:
    return source in (SOURCE_POD, SOURCE_NODE_DEFAULT, SOURCE_NONE) or (
        source.startswith(SOURCE_POLICY_PREFIX)
        and _OBJECT_NAME.fullmatch(source[len(SOURCE_POLICY_PREFIX):]) is not None)


@functools.lru_cache(maxsize=256)
def parse_resolved(value: str) -> Resolved:
    """Parse ``numalign.io/resolved`` (scope defaults to container, source to pod); the
    deferred value is ``{"policy": null, "scope": null, "source": "node-default"}``.
    Raises WireError naming the annotation and what is wrong. (Kept by value: a
    scheduler extender reads one pod's annotation for every node.)"""
    where = f"annotation {ANN_RESOLVED}"
    try:
        doc = jsontext.loads(value, where, max_bytes=MAX_RESOLVED_BYTES)
    except ValueError as e:
        raise WireError(str(e)) from None
    if not isinstance(doc, Mapping):
        raise WireError(f"{where} must be a JSON object")
    policy, scope, source = doc.get("policy"), doc.get("scope"), doc.get("source", SOURCE_POD)
    if not isinstance(source, str) or not _known_source(source):
        raise WireError(f"{where}: source must be pod, node-default, none or "
                        f"TopologyPolicy/NAME, got {quote(source)}")
    if policy is None and scope is None and source == SOURCE_NODE_DEFAULT:
        return DEFERRED
    if not known_policy(policy):
        raise WireError(f"{where}: policy must be one of {', '.join(policy_names())}, "
                        f"got {quote(policy)}")
    scope = DEFAULT_SCOPE if scope is None else scope
    if scope not in SCOPES:
        raise WireError(f"{where}: scope must be container or pod, got {quote(scope)}")
    options = parse_options(doc.get("options"), where)
    return Resolved(str(policy), str(scope), options, source)


def resolved_or_none(value: str | None) -> Resolved | None:
    """:func:`parse_resolved`, None when absent or malformed (the operator rewrites it)."""
    if not value:
        return None
    try:
        return parse_resolved(value)
    except WireError:
        return None


def node_default(spec: Mapping[str, Any] | None) -> Resolved:
    """What a node's ``NodeTopology.spec`` (its default, pushed by the operator) gives a
    pod: that policy, source node-default; ``none`` when it has none. Never raises:
    a bad scope is the default scope, bad options are none."""
    if not isinstance(spec, Mapping) or not known_policy(spec.get("policy")):
        return NONE
    scope = spec.get("scope")
    try:
        options = parse_options(spec.get("options"), "NodeTopology.spec.options")
    except WireError:
        options = NO_OPTIONS
    return Resolved(str(spec["policy"]), scope if scope in SCOPES else DEFAULT_SCOPE,
                    options, SOURCE_NODE_DEFAULT)

