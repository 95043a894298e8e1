"""What the extender decides about one pod on one node (:class:`Verdict`), and what of
the pod that decision depends on (:class:`PodShape`): the values the decision
(:mod:`.decide`), its fast filter (:mod:`.feasible`), its DRA choices
(:mod:`.dradecide`) and the wire (:mod:`.protocol`) share."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from numalign.api.effective import EffectivePolicy
from numalign.api.names import REJECTED_PREFIX
from numalign.api.nodestatus import HeldPod
from numalign.topology.ledger import ContainerAllocation
from numalign.topology.pod import Pod

from .score import NEUTRAL_SCORE

__all__ = ["CANDIDATE_UID", "OUT_OF_TIME", "PodShape", "Verdict"]

JSON = dict[str, Any]

CANDIDATE_UID = "numalign.io/extender-candidate"  # the uid a pod is decided under
OUT_OF_TIME = "not decided by numalign: this pod's time to decide ran out"


@dataclass(frozen=True)
class Verdict:
    """What ``node`` would do with the pod.

    ``fits``: it would admit it. Else ``reason`` and ``message`` are the kubelet's (e.g.
    ``TopologyAffinityError``, "Resources cannot be allocated with Topology locality");
    ``resolvable`` False when no change on the node can make it fit (a malformed GPU
    request). ``score`` 0-10 (:func:`score_admission`; 0 when refused). ``numa_nodes``:
    the NUMA nodes the pod would get. ``policy``: the effective policy (None when the
    node is not covered). ``covered`` False: the node has no usable NodeTopology and
    passes (fail open); ``note`` says why. ``containers``: what the pod would hold there
    (as the engine's ledger keeps it: a CPU an app container reuses from its init
    container held once), for a reservation (:meth:`held_by`)."""

    node: str
    fits: bool
    reason: str | None = None
    message: str | None = None
    score: int = NEUTRAL_SCORE
    numa_nodes: tuple[int, ...] = ()
    policy: EffectivePolicy | None = None
    covered: bool = True
    resolvable: bool = True
    note: str | None = None
    containers: tuple[tuple[str, ContainerAllocation], ...] = field(default=(), repr=False)
    # its allocation is counts per NUMA node (AdmitResult.room_by_counts)
    room_by_counts: bool = True
    # False: a filter's fast admission (.feasible), without allocation or score
    complete: bool = True

    def moved(self, node: str, policy: EffectivePolicy | None) -> Verdict:
        """This verdict for ``node`` under ``policy`` (a filter shares one verdict
        between many nodes: copied without the dataclass's checks)."""
        v = object.__new__(Verdict)
        v.__dict__.update(self.__dict__)
        v.__dict__["node"] = node
        v.__dict__["policy"] = policy
        return v

    @property
    def failure(self) -> str:
        """The refusal as the scheduler shows it (FailedNodes): reason, the kubelet's
        message, the policy. Free of the node's name, so the scheduler's event counts
        nodes refused for the same reason together."""
        if self.fits:
            return ""
        text = f"{self.reason}: {(self.message or '').removeprefix(REJECTED_PREFIX)}"
        if self.policy is not None:
            text += f" (numalign: policy {self.policy.name}, scope {self.policy.scope})"
        return text

    def held_by(self, pod: Mapping[str, Any]) -> HeldPod | None:
        """What ``pod`` would hold on this node, as a reservation (None: nothing to hold:
        refused, not covered, or no container holds anything)."""
        if not self.fits or not self.covered or not self.containers:
            return None
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        meta = meta if isinstance(meta, Mapping) else {}
        ns = str(meta.get("namespace") or "default")
        name = str(meta.get("name") or "")
        uid = str(meta.get("uid") or f"{ns}/{name}")
        return HeldPod(uid, name, ns, self.containers)

    def to_json(self) -> JSON:
        out: JSON = {"node": self.node, "fits": self.fits, "score": self.score,
                     "covered": self.covered, "numaNodes": list(self.numa_nodes)}
        if not self.fits:
            out.update({"reason": self.reason, "message": self.message,
                        "resolvable": self.resolvable})
        if self.policy is not None:
            out["policy"] = {**self.policy.resolved.to_json(),
                             "origin": self.policy.origin.value,
                             "nodeKind": self.policy.node_kind.value}
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class PodShape:
    """What of a pod its admission depends on (containers' names and resources, init
    containers' restart policy, the GPU request) as a model decided under
    :data:`CANDIDATE_UID`, and a key for it; or why the pod cannot be read."""

    key: Hashable
    model: Pod | None
    problem: str | None = None
