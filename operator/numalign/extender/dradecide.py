"""The extender's decision for a pod with ResourceClaims on one node.

kube-scheduler's allocator picks the claims' devices after the extender has answered,
among the devices each request may get (:func:`numalign.api.draasks.pod_choices`). The
node decides the pod with the devices it then holds as fixed hints (the ``dra`` kind,
:mod:`numalign.topology.managers.dra`), under the pod's policy. So the pod is decided
with every choice that matters (the engine, as :func:`.decide.decide` runs it, once per
choice), and:

- under ``single-numa-node`` and ``restricted`` the node passes only if every choice is
  admitted: the allocator may pick any. A claim whose devices a ``matchAttribute`` on
  ``resource.kubernetes.io/numaNode`` keeps on one NUMA node (the ``numa-constraint``
  webhook adds it, :mod:`numalign.controller.claims`) has only choices on one NUMA node.
  Its score is that of the worst choice; more choices than listed: refused.
- under ``best-effort`` and ``none`` the node passes when any choice is admitted (the
  policy never refuses for alignment), scored by the narrowest admitted choice (fewest
  NUMA nodes): a node where an aligned choice exists ranks above one where none does.

A refusal reads like the kubelet's and names the claim requests and the NUMA nodes of
the devices the allocator could pick (``TopologyAffinityError``); no choice at all (a
class not found, too few free devices) is :data:`DRA_UNSATISFIABLE_REASON`, naming the
claim.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from numalign.api.draasks import Placement, PodChoices
from numalign.api.effective import EffectivePolicy
from numalign.api.names import DRA_UNSATISFIABLE_REASON, REJECTED_PREFIX

from .score import MIN_SCORE
from .verdict import Verdict
from .view import NodeView

HARD = ("single-numa-node", "restricted")

__all__ = ["HARD", "decide_claims", "describe", "spread"]


def describe(choice: Mapping[tuple[str, str], Placement]) -> str:
    """A choice in words: each claim request and the NUMA nodes of its devices."""
    parts = []
    for (claim, request), (numa, unknown, count) in sorted(choice.items()):
        nodes = ",".join(str(n) for g in numa for n in g) or "none known"
        more = f", {unknown} of unknown NUMA node" if unknown else ""
        parts.append(f"claim {claim} request {request}: {count} device(s) on NUMA "
                     f"node(s) {nodes}{more}")
    return "; ".join(parts)


def spread(choice: Mapping[tuple[str, str], Placement]) -> tuple[int, int]:
    """How many NUMA nodes a choice's devices are on (and of unknown ones)."""
    nodes = {n for numa, _, _ in choice.values() for g in numa for n in g}
    return len(nodes), sum(u for _, u, _ in choice.values())


def decide_claims(view: NodeView, eff: EffectivePolicy, choices: PodChoices,
                  run: Callable[[Mapping[tuple[str, str], Placement]], Verdict]) -> Verdict:
    """Would ``view``'s node admit the pod whatever devices the allocator gives its
    claims there (``choices``)? ``run(choice)``: the node's verdict with one choice's
    devices (:func:`.decide.decide` through the caller's cache). Never raises."""
    node = view.name
    if choices.refusal is not None:
        return Verdict(node, False, DRA_UNSATISFIABLE_REASON,
                       f"{REJECTED_PREFIX}{choices.refusal}", MIN_SCORE, policy=eff)
    hard = eff.name in HARD
    if hard and not choices.complete:
        return Verdict(node, False, DRA_UNSATISFIABLE_REASON, (
            f"{REJECTED_PREFIX}DRA: the pod's claims have more than {len(choices.choices)} "
            f"device choices on this node; numalign cannot check that every allocation "
            f"aligns under policy {eff.name}"), MIN_SCORE, policy=eff)
    verdicts: list[tuple[Verdict, Mapping[tuple[str, str], Placement]]] = []
    # the narrowest choices first: under best-effort and none the first admitted one
    # (an aligned choice where one exists) gives the verdict and its score
    for choice in sorted(choices.choices or [{}], key=spread):
        v = run(choice)
        verdicts.append((v, choice))
        if hard != v.fits:
            break
    refused = [(v, c) for v, c in verdicts if not v.fits]
    admitted = [v for v, _ in verdicts if v.fits]
    if (hard and refused) or not admitted:
        v, c = refused[0]
        v = v if v.node == node else replace(v, node=node)
        if not c:
            return v
        why = f" (DRA: the allocator may give {describe(c)})"
        return replace(v, message=f"{v.message or ''}{why}")
    best = min(admitted, key=lambda v: v.score) if hard else admitted[0]
    return best if best.node == node else replace(best, node=node)
