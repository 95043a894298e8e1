"""What the operator checks before it deletes or creates a pod for a redeploy.

The operator redeploys only pods that a node rejected for topology: Failed with
``TopologyAffinityError`` (the kubelet's reason, which numalign's agents use too), never
in ``kube-system``, and a bare pod's replacement has the rejected pod's spec (without
its node, with node avoidance added) in the same namespace. The admission policy
``numalign-operator-restriction`` (config/operator) makes the API server refuse the same
things from the operator's identity; these checks keep a bug (or a stale object) from
asking it to. Pure functions: a refusal is a sentence, None allows.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from numalign.api.names import ANN_REDEPLOY_OF, ANN_REDEPLOY_OF_UID, REJECT_REASON

from .record import is_topology_rejected, with_node_avoidance

# Namespaces whose pods the operator never deletes or creates: the cluster's own.
PROTECTED_NAMESPACES = frozenset({"kube-system"})


class RedeployRefused(RuntimeError):
    """A redeploy step that the operator's own checks refuse (the message says why)."""


def _where(pod: Mapping[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def refusal_to_delete(pod: Mapping[str, Any]) -> str | None:
    """Why the operator may not delete ``pod`` (None: it may)."""
    ns, name = _where(pod)
    if ns in PROTECTED_NAMESPACES:
        return f"pod {ns}/{name} is in {ns}, whose pods numalign never deletes"
    if not is_topology_rejected(pod):
        status = pod.get("status") or {}
        return (f"pod {ns}/{name} is {status.get('phase') or 'without a phase'}"
                f" (reason {status.get('reason') or 'none'}), not Failed with {REJECT_REASON}")
    return None


def _avoided_nodes(spec: Mapping[str, Any]) -> list[str]:
    """The node names a spec's required node affinity excludes by ``metadata.name NotIn``."""
    terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
             .get("nodeSelectorTerms") or [])
    names: set[str] = set()
    for term in terms:
        for f in (term or {}).get("matchFields") or []:
            if f.get("key") == "metadata.name" and f.get("operator") == "NotIn":
                names.update(str(v) for v in f.get("values") or [])
    return sorted(names)


def spec_matches(original: Mapping[str, Any], replacement: Mapping[str, Any]) -> bool:
    """Whether ``replacement`` has ``original``'s spec but for the node: no ``nodeName``
    and, at most, nodes excluded by name in its required node affinity."""
    spec = copy.deepcopy(dict(original.get("spec") or {}))
    spec.pop("nodeName", None)
    new = dict(replacement.get("spec") or {})
    if "nodeName" in new:
        return False
    return with_node_avoidance(spec, _avoided_nodes(new)) == new


def refusal_to_create(original: Mapping[str, Any], replacement: Mapping[str, Any]
                      ) -> str | None:
    """Why the operator may not create ``replacement`` for the rejected ``original``."""
    ns, name = _where(original)
    new_ns, new_name = _where(replacement)
    if ns in PROTECTED_NAMESPACES or new_ns in PROTECTED_NAMESPACES:
        return f"pod {new_ns}/{new_name}: numalign never creates pods in {new_ns or ns}"
    if new_ns != ns:
        return f"replacement {new_ns}/{new_name} is not in {ns}, the namespace of {name}"
    why = refusal_to_delete(original)
    if why is not None:
        return f"{why}: it has no replacement"
    ann = (replacement.get("metadata") or {}).get("annotations") or {}
    uid = str((original.get("metadata") or {}).get("uid") or "")
    if ann.get(ANN_REDEPLOY_OF) != name or ann.get(ANN_REDEPLOY_OF_UID) != uid:
        return (f"replacement {ns}/{new_name} does not name {name} (uid {uid}) in "
                f"{ANN_REDEPLOY_OF} and {ANN_REDEPLOY_OF_UID}")
    if not spec_matches(original, replacement):
        return (f"replacement {ns}/{new_name} has another spec than {name} (only the node "
                "may differ)")
    return None
