"""Where a pod's policy on a node is decided: this module, for every decider (the agent's
emulator and NRI placer, the redeploy fit check, the scheduler extender, ``numalign
explain``, ``kubectl numalign``, the operator's node defaults and backstop), so that they
never disagree. Each reads the pod and the node's NodeTopology through the same lenient
models (:mod:`.reads`) and asks :func:`effective_policy`; none decides again.

A node is one of three kinds (:meth:`NodeKind.of`, the only classifier):

- **emulated**: numalign's kubelet emulator admits the pod (no ``status.kubelet``);
- **numalign-managed**: numalign's NRI plugin places the pod; the kubelet's managers are
  ``none`` and ``status.kubelet`` says so. The ``NRIPlacement`` condition marks it: True
  while the plugin is registered, False while it starts or the runtime is away (the
  runtime requires the plugin, so nothing starts unplaced meanwhile). Its reasons
  ``NotManaged`` (the Node lacks the label) and ``KubeletManagersOn`` (the agent refused
  to place) leave the node to its kubelet. Before its agent says (no condition yet), a
  Node labelled ``numalign.io/managed=nri`` is numalign-managed where its labels are known;
- **kubelet-managed**: a real node whose kubelet admits with its own Topology Manager
  policy, scope and options (``status.kubelet``), whatever numalign resolved for the pod.

Where the policy comes from (:class:`Origin`): on a kubelet-managed node, its kubelet's;
on the other two the pod's ``numalign.io/resolved`` applies, and a deferred (the pod was
not bound when the operator resolved it), missing or malformed one gives way to the
node's default (``NodeTopology.spec``; :func:`pod_or_node_default`), or, where the node
recorded the default it admitted the pod with, to that one. A malformed one is reported
in :attr:`EffectivePolicy.problem`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from numalign.topology.policies import AlignmentPolicy, get_policy, kubelet_names
from numalign.topology.policyconfig import OPTION_MAX_ALLOWABLE_NUMA_NODES, SCOPES

from .errors import WireError
from .names import SOURCE_KUBELET
from .reads import NodeTopologyRead, PodRead
from .resolved import (
    DEFAULT_SCOPE,
    KUBELET_OPTION_NAMES,
    NONE,
    Options,
    Resolved,
    node_default,
    parse_options,
    parse_resolved,
)


class NodeKind(enum.Enum):
    """Who admits pods on a node (see the module docstring); the value as the extender's
    verdicts and ``explain`` show it."""

    EMULATED = "emulated"
    NUMALIGN_MANAGED = "numalign-managed"
    KUBELET_MANAGED = "kubelet-managed"

    # members are singletons compared by identity: hash them as objects, not through
    # Enum's Python-level __hash__ (the extender hashes a kind per node per filter)
    __hash__ = object.__hash__

    @classmethod
    def of(cls, nt: NodeTopologyRead | Mapping[str, Any] | None) -> NodeKind:
        """The kind of the node of NodeTopology ``nt`` (a read, or the raw object; never
        raises: malformed parts read as absent)."""
        read = NodeTopologyRead.of(nt)
        placing = read.status.nri_placing
        if placing or (placing is None and read.labelled_nri):
            return cls.NUMALIGN_MANAGED
        if read.status.kubelet_policy:
            return cls.KUBELET_MANAGED
        return cls.EMULATED

    @property
    def placed_by(self) -> str:
        """Who admits and places the node's pods, in words."""
        return _PLACED_BY[self]

    @property
    def by_numalign(self) -> bool:
        """numalign's engine admits there (the pod's resolved policy applies)."""
        return self is not NodeKind.KUBELET_MANAGED


_PLACED_BY = {NodeKind.EMULATED: "numalign's kubelet emulator",
              NodeKind.NUMALIGN_MANAGED: "numalign's NRI plugin",
              NodeKind.KUBELET_MANAGED: "the kubelet"}


class Origin(enum.Enum):
    """Which rule gave a pod its policy (the value as the extender's verdicts show it)."""

    POD = "pod"  # the pod's numalign.io/resolved
    NODE_DEFAULT = "node-default"  # deferred, missing or malformed: the node's default
    RECORDED = "recorded"  # the same, as the node recorded admitting it (status.admitted)
    KUBELET = "kubelet"  # a kubelet-managed node: its kubelet's own policy

    __hash__ = object.__hash__  # as NodeKind's


@dataclass(frozen=True)
class NodePolicy:
    """What decides pods on one node, read once from its NodeTopology: its kind, its
    default (``NodeTopology.spec``) and, on a kubelet-managed node, its kubelet's policy."""

    kind: NodeKind = NodeKind.EMULATED
    default: Resolved = NONE
    kubelet: Resolved | None = None

    @classmethod
    def from_nodetopology(cls, nt: NodeTopologyRead | Mapping[str, Any] | None
                          ) -> NodePolicy:
        """From a NodeTopology (a read, or the raw object; never raises)."""
        read = NodeTopologyRead.of(nt)
        kind = NodeKind.of(read)
        kubelet = (kubelet_policy(read.status.kubelet)
                   if kind is NodeKind.KUBELET_MANAGED else None)
        return cls(kind, node_default(read.spec), kubelet)

    @property
    def applied(self) -> Resolved:
        """What the node applies to a pod without a policy of its own."""
        return self.kubelet if self.kubelet is not None else self.default

    @property
    def key(self) -> str:
        """The node's policy as text: nodes alike decide a pod alike."""
        return "|".join((self.kind.value, self.default.annotation(),
                         self.kubelet.annotation() if self.kubelet else "-"))


@dataclass(frozen=True)
class EffectivePolicy:
    """The policy a pod gets on a node: the engine's policy object, scope and options,
    where it came from (:attr:`origin`, :attr:`source`: as ``numalign.io/resolved``
    words it), the node's kind, and what is wrong with the pod's ``numalign.io/resolved``
    when it was malformed (then the default applies)."""

    policy: AlignmentPolicy
    scope: str
    options: Options
    source: str
    origin: Origin
    node_kind: NodeKind
    problem: str | None = None

    @classmethod
    def of(cls, resolved: Resolved, origin: Origin, node_kind: NodeKind,
           problem: str | None = None) -> EffectivePolicy:
        """From a concrete resolution (a deferred one reads as ``none``)."""
        return cls(get_policy(resolved.policy or "none"), resolved.scope or DEFAULT_SCOPE,
                   resolved.options, resolved.source, origin, node_kind, problem)

    @property
    def name(self) -> str:
        """The policy's name (as the wire and the kubelet spell it)."""
        return self.policy.name

    @cached_property
    def resolved(self) -> Resolved:
        """As ``numalign.io/resolved`` encodes it."""
        return Resolved(self.policy.name, self.scope, self.options, self.source)

    @cached_property
    def key(self) -> tuple[Any, ...]:
        """What decides alike, hashable: the policy, scope, options given and origin (the
        extender's verdict cache key; built once per pod and node policy)."""
        return (self.policy.name, self.scope, tuple(sorted(self.options.given.items())),
                self.origin)

    @property
    def by_kubelet(self) -> bool:
        """The node's kubelet decides (numalign only reports and replays)."""
        return self.origin is Origin.KUBELET


def kubelet_policy(settings: Any) -> Resolved:
    """A kubelet's Topology Manager policy, scope and options (``status.kubelet``, as
    its configuration spells them) as a resolution with source ``kubelet``. Never raises:
    an unknown policy or scope reads as the kubelet's default, options the engine does
    not take are left out."""
    settings = settings if isinstance(settings, Mapping) else {}
    policy = settings.get("topologyManagerPolicy")
    scope = settings.get("topologyManagerScope")
    raw = settings.get("topologyManagerPolicyOptions")
    known = set(KUBELET_OPTION_NAMES.values())
    given = ({str(k): v for k, v in raw.items() if str(k) in known}
             if isinstance(raw, Mapping) else {})
    try:
        options = parse_options(given, "status.kubelet.topologyManagerPolicyOptions")
    except WireError:
        options = parse_options({k: v for k, v in given.items()
                                 if k != OPTION_MAX_ALLOWABLE_NUMA_NODES})
    return Resolved(policy if policy in kubelet_names() else "none",
                    scope if scope in SCOPES else DEFAULT_SCOPE, options, SOURCE_KUBELET)


def pod_or_node_default(pods: str | Resolved | None, default: Resolved
                        ) -> tuple[Resolved, Origin, str | None]:
    """The one rule "deferred -> node default": the pod's resolution (``pods``: the raw
    ``numalign.io/resolved`` or a parsed one) when it is concrete, else ``default``.
    Returns (resolution, origin, what is wrong with a malformed annotation)."""
    if pods is None:
        return default, Origin.NODE_DEFAULT, None
    if isinstance(pods, str):
        try:
            pods = parse_resolved(pods)
        except WireError as e:
            return default, Origin.NODE_DEFAULT, str(e)
    if pods.deferred:
        return default, Origin.NODE_DEFAULT, None
    return pods, Origin.POD, None


def effective_policy(pod: PodRead | Mapping[str, Any], node: NodePolicy, *,
                     recorded: Resolved | None = None) -> EffectivePolicy:
    """The policy ``pod`` gets on ``node`` (see the module docstring). ``recorded``: the
    policy the node recorded admitting the pod with (its ``status.admitted`` entry),
    which stands for the node's default where the pod's own does not apply. Never
    raises."""
    if node.kind is NodeKind.KUBELET_MANAGED and node.kubelet is not None:
        return EffectivePolicy.of(node.kubelet, Origin.KUBELET, node.kind)
    raw = PodRead.of(pod).resolved_annotation
    resolved, origin, problem = pod_or_node_default(raw, node.default)
    if origin is Origin.NODE_DEFAULT and recorded is not None and not recorded.deferred:
        resolved, origin = recorded, Origin.RECORDED
    return EffectivePolicy.of(resolved, origin, node.kind, problem)
