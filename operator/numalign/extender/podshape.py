"""A pod as the extender decides it: its shape (what the decision reads of it, with a
digest that keys cached verdicts) and its effective policy per node policy, each kept
for the last pod objects asked (a pod in flight is decided again on many nodes, every
filter)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from numalign.api.effective import EffectivePolicy, effective_policy
from numalign.api.names import ANN_GPUS
from numalign.topology.errors import TopologyError
from numalign.topology.pod import pod_from_dict

from .verdict import CANDIDATE_UID, PodShape
from .view import KeptByIdentity, NodeView

JSON = dict[str, Any]

__all__ = ["pod_shape", "policy_of"]


def pod_shape(pod: Mapping[str, Any]) -> PodShape:
    """The pod's shape (never raises: an unreadable pod gives ``model`` None); kept for
    the last pod objects asked (a pod in flight is decided again on many nodes)."""
    return _shapes(pod)


def _pod_shape(pod: Mapping[str, Any]) -> PodShape:
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    meta = meta if isinstance(meta, Mapping) else {}
    ann = meta.get("annotations")
    gpus = ann.get(ANN_GPUS) if isinstance(ann, Mapping) else None
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    spec = spec if isinstance(spec, Mapping) else {}

    def reduced(cs: Any) -> Any:
        if not isinstance(cs, list):
            return cs
        return [{k: c.get(k) for k in ("name", "resources", "restartPolicy") if k in c}
                if isinstance(c, Mapping) else c for c in cs]

    doc: JSON = {"metadata": {"name": "candidate", "uid": CANDIDATE_UID,
                              "annotations": {} if gpus is None else {ANN_GPUS: gpus}},
                 "spec": {"containers": reduced(spec.get("containers")),
                          "initContainers": reduced(spec.get("initContainers") or [])}}
    # a digest, not the text: verdicts are cached by it, and what a cached verdict keeps
    # must not grow with the pod
    key = hashlib.blake2b(json.dumps(doc, sort_keys=True, default=str).encode(),
                          digest_size=16).digest()
    try:
        return PodShape(key, pod_from_dict(doc))
    except TopologyError as e:
        return PodShape(key, None, str(e))


_shapes = KeptByIdentity[Mapping[str, Any], PodShape](_pod_shape, 1024)


class _PolicyMemo:
    """One pod's effective policy per node policy (a pod in flight is asked on every
    node of every filter)."""

    def __init__(self, pod: Mapping[str, Any]) -> None:
        self.pod = pod
        self.by: dict[str, EffectivePolicy] = {}

    def __call__(self, view: NodeView) -> EffectivePolicy:
        eff = self.by.get(view.policy_id)
        if eff is None:
            eff = self.by[view.policy_id] = effective_policy(self.pod, view.policy)
        return eff


_policies = KeptByIdentity[Mapping[str, Any], _PolicyMemo](_PolicyMemo, 1024)


def policy_of(pod: Mapping[str, Any], view: NodeView) -> EffectivePolicy:
    """effective_policy of ``pod`` on ``view``'s node, kept by the pod's identity per node
    policy (a pod in flight is asked on every node of every filter)."""
    return _policies(pod)(view)
