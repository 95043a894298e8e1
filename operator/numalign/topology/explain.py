"""Why a pod got its NUMA affinity: the data behind ``numalign explain`` (pure, no I/O).

``explain_pod`` replays the Topology Manager decision(s) of one pod with the engine
(``admit.admit_pod`` on a trial copy of the ledger, nothing committed) and turns what
the engine exposes (``admit.UnitDecision``: each provider's hints; ``merge.MergeResult``: the
filtered per-resource hint lists, the best merged candidates, the best non-preferred
affinity count) into an :class:`Explanation`:

* each hint provider's hints per resource (CPU, memory and each hugepage size, each
  device resource, GPU groups from ``numalign.io/gpus``), with the kubelet's meaning of
  "no preference" (nil) and "cannot satisfy" (empty list);
* the merged candidates that took part in the final comparison, best first (never the
  cross product: the merge works from the structure of the problem and keeps the top
  ``merge.EXPLAIN_CANDIDATES``);
* the winner and why it won: preferred by every resource or not, narrowest, lowest
  average distance under ``prefer-closest-numa-nodes``, lowest node ids, or the
  kubelet's non-preferred rule around B (the best non-preferred affinity count);
* whether the policy admits it, and the allocation (CPUs, memory per zone, hugepages,
  devices, GPU requests).

The text view is :mod:`numalign.commands.explain_text`; a node's machine and ledger are
rebuilt from its NodeTopology status by :mod:`numalign.api.nodestatus`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .admit import AdmitResult, ProviderKind, admit_pod
from .hints import NumaMask, TopologyHint, mask_ids, mask_of
from .ledger import Ledger
from .machine import Machine
from .merge import REJECT_REASON, Candidate, MergeResult
from .pod import Pod
from .policies import get_policy
from .policyconfig import PolicyOptions

JSON = dict[str, Any]


# ---------------------------------------------------------------- the explanation


@dataclass
class ResourceView:
    """One resource's hints as one provider gave them."""

    provider: str  # its kind: cpu | memory | devices | gpu-groups | a registered one
    resource: str | None  # None: the provider gave no output at all
    hints: list[TopologyHint] | None  # None: no preference; []: cannot satisfy
    prefers_winner: str = ""  # "yes" | "any" | "no" | "" (no winner)

    @property
    def state(self) -> str:
        if self.hints is None:
            return "no preference"
        if not self.hints:
            return "cannot satisfy"
        return f"{len(self.hints)} hint" + ("" if len(self.hints) == 1 else "s")

    def to_json(self) -> JSON:
        return {"provider": self.provider, "resource": self.resource, "state": self.state,
                "hints": None if self.hints is None else [h.to_json() for h in self.hints],
                "prefersWinner": self.prefers_winner or None}


@dataclass
class DecisionView:
    """One Topology Manager decision (a container, or the pod under the pod scope)."""

    unit: str
    resources: list[ResourceView]
    candidates: list[Candidate]
    preferred_candidates: int | None  # how many preferred merged masks there were
    best_non_preferred: int
    hint: TopologyHint
    admit: bool
    why: str
    admit_why: str
    engine_reason: str = ""
    hint_generation: JSON = field(default_factory=dict)

    def to_json(self) -> JSON:
        return {
            "unit": self.unit,
            "providers": [r.to_json() for r in self.resources],
            "candidates": [c.to_json() for c in self.candidates],
            "preferredCandidates": self.preferred_candidates,
            "bestNonPreferredAffinityCount": self.best_non_preferred,
            "winner": self.hint.to_json(),
            "why": self.why,
            "admit": self.admit,
            "admitWhy": self.admit_why,
            "engineReason": self.engine_reason,
            "hintGeneration": self.hint_generation,
        }


@dataclass
class Explanation:
    pod: str
    namespace: str
    uid: str
    qos: str
    machine: str
    numa_nodes: list[int]
    policy: str
    scope: str
    options: PolicyOptions
    source: str
    admit: bool
    reason: str | None
    message: str | None
    hint: TopologyHint
    decisions: list[DecisionView]
    allocation: JSON  # {"numaNodes", "containers": {...}, "gpus": {...}}
    summary: str
    node: str | None = None
    notes: list[str] = field(default_factory=list)
    recorded: JSON | None = None  # live mode: the pod's numalign.io/allocation
    # live mode on a real node: the kubelet's own decision (commands/explain_realnode.py)
    kubelet: JSON | None = None
    # live mode, a pod with ResourceClaims: its claims, their devices and NUMA nodes
    # (commands/explain_claims.py)
    claims: JSON | None = None

    def to_json(self) -> JSON:
        out: JSON = {
            "pod": self.pod, "namespace": self.namespace, "uid": self.uid, "qos": self.qos,
            "node": self.node, "machine": self.machine, "numaNodes": self.numa_nodes,
            "policy": self.policy, "scope": self.scope, "options": self.options.to_json(),
            "source": self.source, "admit": self.admit, "reason": self.reason,
            "message": self.message, "hint": self.hint.to_json(), "summary": self.summary,
            "decisions": [d.to_json() for d in self.decisions],
            "allocation": self.allocation, "notes": list(self.notes),
        }
        if self.recorded is not None:
            out["recorded"] = self.recorded
        if self.kubelet is not None:
            out["kubelet"] = self.kubelet
        if self.claims is not None:
            out["claims"] = self.claims
        return out


# ---------------------------------------------------------------- building it


def nodes_text(mask: NumaMask | None) -> str:
    """``{0,1}`` for a mask, ``any`` for nil."""
    if mask is None:
        return "any"
    return "{" + ",".join(str(i) for i in mask_ids(mask)) + "}"


def hint_text(mask: NumaMask | None) -> str:
    """``NUMA nodes {0,1}``, or ``no NUMA affinity`` for nil."""
    return "no NUMA affinity" if mask is None else f"NUMA nodes {nodes_text(mask)}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _resource_views(result: AdmitResult, index: int) -> list[ResourceView]:
    d = result.decisions[index]
    views: list[ResourceView] = []
    for name, prov in zip(d.provider_names, d.providers, strict=True):
        if prov is None:
            continue  # no output: nothing the pod asks for concerns this provider
        for res, hints in prov.items():
            label = d.sources.get(res, name)  # the provider that gave them
            views.append(ResourceView(label, res, None if hints is None else list(hints)))
    return views


def _prefers(hints: Sequence[TopologyHint], mask: NumaMask) -> str:
    if any(h.preferred and h.mask == mask for h in hints):
        return "yes"
    if any(h.preferred and h.mask is None for h in hints):
        return "any"
    return "no"


def _mark_winner(views: list[ResourceView], merge: MergeResult, winner: NumaMask | None,
                 all_nodes: NumaMask) -> None:
    target = all_nodes if winner is None else winner
    by_res = {r.resource: r for r in merge.resources if r.resource is not None}
    for v in views:
        filtered = by_res.get(v.resource) if v.resource is not None else None
        hints = list(filtered.hints) if filtered is not None else (v.hints or [])
        if v.hints is None:
            v.prefers_winner = "any"
        else:
            v.prefers_winner = _prefers(hints, target)


def avg_distance(c: Candidate) -> float | None:
    if c.distance_sum is None or not c.width:
        return None
    return c.distance_sum / (c.width * c.width)


def _why_preferred(win: Candidate, others: Sequence[Candidate], n_pref: int | None,
                   closest: bool) -> str:
    head = (f"{nodes_text(win.mask)} is preferred by every resource that has hints "
            f"(each offers it as a preferred hint, or has no preference)")
    if not others:
        if n_pref is not None and n_pref > 1:
            return head + f", and it ranks first of {n_pref} preferred candidates."
        return head + "; it is the only mask they all prefer."
    nxt = others[0]
    if win.width < nxt.width:
        return (head + f"; it is the narrowest preferred candidate "
                f"({_plural(win.width, 'NUMA node')}; the next, {nodes_text(nxt.mask)}, "
                f"spans {nxt.width}).")
    a, b = avg_distance(win), avg_distance(nxt)
    if closest and a is not None and b is not None and a < b:
        return (head + f"; among the preferred candidates {win.width} wide it has the "
                f"lowest average distance ({a:g}, against {b:g} for {nodes_text(nxt.mask)}; "
                f"prefer-closest-numa-nodes).")
    if closest and a is not None:
        return (head + f"; among the preferred candidates {win.width} wide it is one of the "
                f"closest (average distance {a:g}, prefer-closest-numa-nodes) and has the "
                f"lowest NUMA node ids of those (ahead of {nodes_text(nxt.mask)}).")
    return (head + f"; among the preferred candidates {win.width} wide it has the lowest "
            f"NUMA node ids (ahead of {nodes_text(nxt.mask)}).")


def _why_non_preferred(win: Candidate, others: Sequence[Candidate],
                       views: Sequence[ResourceView], bnp: int, closest: bool) -> str:
    refusing = [str(v.resource) for v in views if v.prefers_winner == "no"]
    who = (f" ({', '.join(refusing)} do{'es' if len(refusing) == 1 else ''} not prefer it)"
           if refusing else "")
    c = win.width
    if c == bnp:
        rule = f"it is {c} wide, equal to B, which ranks first"
    elif c < bnp:
        rule = f"no merged mask is {bnp} wide; it is the widest below B ({c})"
    else:
        rule = f"nothing {bnp} wide or narrower can be merged; it is the narrowest above B ({c})"
    tie = ""
    if others and others[0].width == win.width:
        nxt = others[0]
        a, b = avg_distance(win), avg_distance(nxt)
        if closest and a is not None and b is not None and a < b:
            tie = (f"; of the masks {c} wide it has the lowest average distance ({a:g}, "
                   f"against {b:g} for {nodes_text(nxt.mask)})")
        else:
            tie = f"; of the masks {c} wide it has the lowest node ids (ahead of " \
                  f"{nodes_text(nxt.mask)})"
    return (f"No NUMA mask is preferred by every resource, so the best non-preferred merged "
            f"hint wins: {nodes_text(win.mask)}{who}. The kubelet ranks non-preferred hints "
            f"around B = {bnp} (the widest of the resources' narrowest hints): {rule}{tie}.")


def _decision_view(result: AdmitResult, index: int, machine: Machine,
                   options: PolicyOptions) -> DecisionView:
    d = result.decisions[index]
    pol = get_policy(result.policy)
    views = _resource_views(result, index)
    m = d.merge
    all_nodes = mask_of(machine.numa_ids)
    gen: JSON = {}
    if d.plan is not None:
        gen = {"method": d.plan.method, "exact": d.plan.exact, "notes": list(d.plan.notes)}
    if m is None:
        return DecisionView(d.unit, views, [], None, 0, d.hint, d.admit,
                            f"Policy {pol.name}: the Topology Manager does not align "
                            "resources; CPUs, memory and devices come from any NUMA node.",
                            pol.explain_admit(d.hint, REJECT_REASON), f"policy {pol.name}",
                            gen)
    winner_mask = d.hint.mask
    cands = list(m.candidates)
    if cands:
        _mark_winner(views, m, winner_mask, all_nodes)
    closest = options.prefer_closest_numa_nodes and pol.closest_applies
    n_pref = m.stats.get("preferred_candidates")
    if not views:
        why = ("No provider has a preference (the container asks for no exclusive CPUs, "
               "no Guaranteed memory and no NUMA-local devices), so the merged hint is "
               "every NUMA node, preferred.")
    elif cands and (winner_mask == cands[0].mask or
                    (winner_mask is None and cands[0].mask == all_nodes)):
        win = cands[0]
        if win.preferred:
            why = _why_preferred(win, cands[1:], n_pref, closest)
        else:
            why = _why_non_preferred(win, cands[1:], views,
                                     m.best_non_preferred_affinity_count, closest)
    else:
        why = m.reason[:1].upper() + m.reason[1:] + "."
    why += pol.explain_merge(winner_mask is None and bool(views))
    admit_why = pol.explain_admit(d.hint, REJECT_REASON)
    return DecisionView(d.unit, views, cands, n_pref, m.best_non_preferred_affinity_count,
                        d.hint, d.admit, why, admit_why, m.reason, gen)


def _allocation_json(result: AdmitResult) -> JSON:
    """The pod's allocation as ``numalign admit`` prints it (each container's
    :meth:`~numalign.topology.admit.ContainerResult.to_json`), with the pod's NUMA nodes."""
    containers: JSON = {name: c.to_json() for name, c in result.containers.items()}
    numa = (mask_ids(result.hint.mask) if result.hint.mask is not None
            else sorted({n for c in result.containers.values() for n in c.numa_nodes}))
    return {"numaNodes": numa if result.admit else [], "containers": containers,
            "gpus": {k: list(v) for k, v in result.gpus.items()}}


def _summary(result: AdmitResult, views: Sequence[DecisionView]) -> str:
    pod = f"{result.pod.namespace}/{result.pod.name}"
    if not get_policy(result.policy).aligns:
        return f"{pod} is admitted under policy {result.policy}: no NUMA alignment."
    if not result.admit:
        failed = views[-1] if views else None
        unit = f" (decision for {failed.unit})" if failed and failed.unit != "pod" else ""
        if result.reason == REJECT_REASON and failed is not None:
            why = (f"is not preferred and {result.policy} admits only preferred hints"
                   if not failed.hint.preferred else
                   f"is preferred, yet {result.policy} does not admit it")
            return (f"{pod} is rejected{unit}: the best merged hint "
                    f"({hint_text(failed.hint.mask)}) {why} ({REJECT_REASON}).")
        return f"{pod} is rejected{unit}: {result.reason}: {result.message}"
    pref = "preferred" if result.hint.preferred else "not preferred"
    return (f"{pod} is admitted under {result.policy} ({result.scope} scope) with "
            f"{hint_text(result.hint.mask)}, {pref}.")


def explain_pod(machine: Machine, pod: Pod, policy: str, scope: str,
                options: PolicyOptions | None = None, ledger: Ledger | None = None, *,
                source: str = "command line",
                providers: Sequence[ProviderKind] = ()) -> Explanation:
    """Replay the admission of ``pod`` on ``machine`` (against ``ledger``, which is left
    unchanged) and explain it. Raises TopologyError for bad input (unknown policy or
    scope, a bad ``numalign.io/gpus``); a pod asking for more than the machine has is
    explained as the rejection the kubelet gives it."""
    opts = options if options is not None else PolicyOptions()
    base = ledger if ledger is not None else Ledger(machine)
    result = admit_pod(machine, base, pod, policy, scope, opts, providers=providers,
                       commit=False)
    views = [_decision_view(result, i, machine, opts)
             for i in range(len(result.decisions))]
    notes: list[str] = []
    for v in views:
        gen = v.hint_generation
        if gen.get("method") == "reduced":
            notes.append(f"{v.unit}: {len(machine.numa_ids)} NUMA nodes: hint lists are "
                         "reduced to the masks that can win (the full lists have up to "
                         "2^N entries); the merge answer is the kubelet's"
                         + ("" if gen.get("exact", True) else ", but this search was not "
                            "exhaustive"))
    return Explanation(
        pod=pod.name, namespace=pod.namespace, uid=pod.uid, qos=pod.qos, machine=machine.name,
        numa_nodes=machine.numa_ids, policy=policy, scope=scope, options=opts, source=source,
        admit=result.admit, reason=result.reason, message=result.message, hint=result.hint,
        decisions=views, allocation=_allocation_json(result) if result.admit else
        {"numaNodes": [], "containers": {}, "gpus": {}},
        summary=_summary(result, views), notes=notes)
