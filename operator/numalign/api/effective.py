"""Which policy decides a pod on a node: one function, :func:`effective_policy`, for the
agent (emulated and numalign-managed nodes), the redeploy fit check, ``numalign explain``
and the scheduler extender, so that they never disagree.

A node is one of three kinds (:func:`node_kind`, read from its NodeTopology):

- **emulated**: numalign's kubelet emulator admits the pod (no ``status.kubelet``);
- **numalign-managed**: numalign's NRI plugin places the pod; the kubelet's managers are
  ``none`` and ``status.kubelet`` says so. The ``NRIPlacement`` condition marks it: True
  while the plugin is registered, False while it starts or the runtime is away (the
  runtime requires the plugin, so nothing starts unplaced meanwhile). Its reasons
  ``NotManaged`` (the Node lacks the label) and ``KubeletManagersOn`` (the agent refused
  to place) leave the node to its kubelet;
- **kubelet-managed**: a real node whose kubelet admits with its own Topology Manager
  policy, scope and options (``status.kubelet``), whatever numalign resolved for the pod.

On the first two the pod's ``numalign.io/resolved`` applies; a deferred (the pod was not
bound when the operator resolved it), missing or malformed one gives way to the node's
default (``NodeTopology.spec``), and a malformed one is reported in ``problem``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from numalign.topology.policies import kubelet_names
from numalign.topology.policy import OPTION_MAX_ALLOWABLE_NUMA_NODES, SCOPES

from .nodetopology import NRI_NOT_PLACING, NRI_PLACEMENT
from .wire import (
    ANN_RESOLVED,
    DEFAULT_SCOPE,
    KUBELET_OPTION_NAMES,
    NONE,
    SOURCE_KUBELET,
    Resolved,
    WireError,
    node_default,
    parse_options,
    parse_resolved,
)

EMULATED = "emulated"
NUMALIGN_MANAGED = "numalign-managed"
KUBELET_MANAGED = "kubelet-managed"
NODE_KINDS = (EMULATED, NUMALIGN_MANAGED, KUBELET_MANAGED)

# Where the policy came from (EffectivePolicy.origin).
FROM_POD = "pod"  # the pod's numalign.io/resolved
FROM_NODE_DEFAULT = "node-default"  # deferred, missing or malformed: the node's default
FROM_KUBELET = "kubelet"  # a kubelet-managed node: its kubelet's own policy


@dataclass(frozen=True)
class NodePolicy:
    """What decides pods on one node: its kind, its default (``NodeTopology.spec``) and,
    on a kubelet-managed node, its kubelet's policy."""

    kind: str = EMULATED
    default: Resolved = NONE
    kubelet: Resolved | None = None

    @classmethod
    def from_nodetopology(cls, nt: Mapping[str, Any] | None) -> NodePolicy:
        """From a NodeTopology object (never raises: malformed parts read as absent)."""
        nt = nt if isinstance(nt, Mapping) else {}
        spec = nt.get("spec")
        status = nt.get("status")
        status = status if isinstance(status, Mapping) else {}
        kind = node_kind(status)
        kubelet = kubelet_policy(status.get("kubelet")) if kind == KUBELET_MANAGED else None
        return cls(kind, node_default(spec if isinstance(spec, Mapping) else None), kubelet)


@dataclass(frozen=True)
class EffectivePolicy:
    """The policy a pod gets on a node (:attr:`resolved`), which of the three rules gave
    it (:attr:`origin`: :data:`FROM_POD`, :data:`FROM_NODE_DEFAULT`,
    :data:`FROM_KUBELET`), the node's kind, and what is wrong with the pod's
    ``numalign.io/resolved`` when it was malformed (then the default applies)."""

    resolved: Resolved
    origin: str
    node_kind: str
    problem: str | None = None

    @property
    def by_kubelet(self) -> bool:
        """The node's kubelet decides (numalign only reports and replays)."""
        return self.origin == FROM_KUBELET


def node_kind(status: Mapping[str, Any] | None) -> str:
    """The kind of a node from its NodeTopology ``status`` (see the module docstring)."""
    if not isinstance(status, Mapping):
        return EMULATED
    for cond in status.get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == NRI_PLACEMENT:
            if cond.get("status") == "True" or cond.get("reason") not in NRI_NOT_PLACING:
                return NUMALIGN_MANAGED
            break
    kubelet = status.get("kubelet")
    if isinstance(kubelet, Mapping) and kubelet.get("topologyManagerPolicy"):
        return KUBELET_MANAGED
    return EMULATED


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


def effective_policy(pod: Mapping[str, Any], node: NodePolicy) -> EffectivePolicy:
    """The policy ``pod`` gets on ``node`` (see the module docstring). Never raises."""
    if node.kind == KUBELET_MANAGED and node.kubelet is not None:
        return EffectivePolicy(node.kubelet, FROM_KUBELET, node.kind)
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    ann = meta.get("annotations") if isinstance(meta, Mapping) else None
    raw = ann.get(ANN_RESOLVED) if isinstance(ann, Mapping) else None
    if raw is None:
        return EffectivePolicy(node.default, FROM_NODE_DEFAULT, node.kind)
    try:
        resolved = parse_resolved(str(raw))
    except WireError as e:
        return EffectivePolicy(node.default, FROM_NODE_DEFAULT, node.kind, str(e))
    if resolved.deferred:
        return EffectivePolicy(node.default, FROM_NODE_DEFAULT, node.kind)
    return EffectivePolicy(resolved, FROM_POD, node.kind)
