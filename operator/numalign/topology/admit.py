"""Pod admission as the kubelet's Topology Manager does it, against a ``Ledger``.

Scope ``container``: init containers in order, then app containers, one decision each
(hints, merge, admit, allocation inside the merged affinity); scope ``pod``: one decision
for the pod's effective request, every container allocated inside it. Resources held by
finished init containers are reusable as the kubelet reuses them. Work happens on a copy
of the ledger that replaces it only when the whole pod is admitted.

Rejections carry the kubelet's reasons and messages, in its order of admit handlers:
``TopologyAffinityError`` (the merge does not admit) or ``UnexpectedAdmissionError`` (a
manager cannot allocate inside what was admitted); then the resource-fit check
(``topology.resourcefit``: ``OutOfcpu``, ``OutOfmemory``, ``OutOf<resource>``) against the pods
the ledger holds. A pod asking for more than the machine has is rejected the same way;
only malformed input (an unknown policy or scope) raises ``TopologyError``.

Each container's memory is reported as the memory manager holds it: the NUMA nodes its
memory may use (its block's affinity, kept when it reuses its init container's memory)
and the bytes it took per node. The providers are the registry's
(:mod:`numalign.topology.managers`, GPU groups included) and the caller's own kinds;
what they report beyond the containers' records is in ``AdmitResult.reports``.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import TopologyError
from .hintgen import FULL_LIMIT, HintPlan, plan_hints
from .hints import NumaMask, ProviderHints, TopologyHint, mask_ids
from .ledger import MEMORY, ContainerAllocation, Ledger
from .machine import Machine
from .managers import providers_for
from .managers.base import Admission, AllocationFailed, Ask, HintProvider, ProviderKind
from .managers.gpu_groups import NAME as GPU_GROUPS
from .merge import REJECT_MESSAGE, REJECT_REASON, MergeResult, merge
from .pod import HUGEPAGES_PREFIX, Container, Pod, is_hugepages
from .policies import AlignmentPolicy, get_policy
from .policyconfig import SCOPE_CONTAINER, SCOPE_POD, PolicyOptions, check_scope
from .resourcefit import check_fit_totals, fit_requests

UNEXPECTED_REASON = "UnexpectedAdmissionError"

__all__ = ["UNEXPECTED_REASON", "AdmitResult", "AllocationFailed", "ProviderKind",
           "admit_pod", "allocation_failure"]

# Decisions by what they depend on (_Run._key): a scheduler extender decides one pod on
# many nodes, most of them with as much free per NUMA node as others. Bounded, oldest out
# first; what it keeps is read, never changed.
# (the plan, the managers' maps, the merge, resource -> provider name)
_Merged = tuple[HintPlan, tuple[ProviderHints, ...], MergeResult, dict[str, str]]
DECISION_CACHE_SIZE = 2048
_DECISIONS: dict[Hashable, _Merged] = {}
# decisions with demands share their merge too (False: each decides afresh, as the
# cold-filter benchmark's baseline)
SHARE_DEMAND_MERGES = True


# ---------------------------------------------------------------- results


@dataclass
class UnitDecision:
    """One Topology Manager decision (a container, or the pod): for `numalign explain`.
    ``providers``: the kubelet's hint providers' maps (``provider_names``: "cpu",
    "memory", "devices"), as the merge takes them; ``sources``: resource -> the name of
    the numalign provider that gave its hints ("gpu-groups" for GPU groups' ones)."""

    unit: str  # container name, or "pod"
    providers: list[ProviderHints]
    provider_names: list[str]
    merge: MergeResult | None
    hint: TopologyHint
    admit: bool
    plan: HintPlan | None = None
    seconds: float = 0.0
    sources: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        provs: list[Any] = []
        for name, p in zip(self.provider_names, self.providers, strict=True):
            provs.append({"provider": name, "hints": None if p is None else {
                res: None if hs is None else [h.to_json() for h in hs]
                for res, hs in p.items()}})
        out: dict[str, Any] = {"unit": self.unit, "hint": self.hint.to_json(),
                               "admit": self.admit, "providers": provs}
        if self.merge is not None:
            out["merge"] = {"reason": self.merge.reason,
                            "bestNonPreferredAffinityCount":
                                self.merge.best_non_preferred_affinity_count,
                            "candidates": [c.to_json() for c in self.merge.candidates]}
        if self.plan is not None:
            out["hintGeneration"] = {"method": self.plan.method, "exact": self.plan.exact,
                                     "notes": self.plan.notes}
        return out


@dataclass
class ContainerResult:
    numa_nodes: list[int]
    allocation: ContainerAllocation
    hint: TopologyHint

    def to_json(self) -> dict[str, Any]:
        a = self.allocation
        mem = {str(n): b for n, b in sorted(a.memory.get(MEMORY, {}).items()) if b}
        mem_nodes = [] if a.memory_mask is None else mask_ids(a.memory_mask)
        out: dict[str, Any] = {"numaNodes": self.numa_nodes, "cpus": list(a.cpus),
                               "memory": mem, "memoryNumaNodes": mem_nodes,
                               "devices": {r: list(ids) for r, ids in sorted(a.devices.items())}}
        huge = {k[len(HUGEPAGES_PREFIX):]: {str(n): b for n, b in sorted(per.items()) if b}
                for k, per in sorted(a.memory.items()) if is_hugepages(k)}
        if huge:
            out["hugepages"] = huge
        return out


@dataclass
class AdmitResult:
    pod: Pod
    policy: str
    scope: str
    admit: bool
    reason: str | None
    message: str | None
    hint: TopologyHint
    containers: dict[str, ContainerResult]
    reports: dict[str, Any]  # provider name -> what it reports (gpu-groups: its GPUs)
    decisions: list[UnitDecision]
    seconds: float = 0.0
    # An UnexpectedAdmissionError: the container whose allocation failed and the manager
    # that failed it ("devices", "cpu" or "memory"), as the kubelet's providers run
    failed: tuple[str, str] | None = None
    # Admitted without commit: the ledger as a commit would leave it (the pod's record
    # shows what its containers hold after reuse between init and app containers)
    work: Ledger | None = field(default=None, repr=False, compare=False)
    # every provider's allocation is counts per NUMA node (HintProvider.room_by_counts)
    room_by_counts: bool = True

    @property
    def gpus(self) -> dict[str, list[str]]:
        """GPU groups' placement: request name -> device ids (empty without one)."""
        got: dict[str, list[str]] = self.reports.get(GPU_GROUPS) or {}
        return got

    def to_json(self) -> dict[str, Any]:
        """The `numalign admit` output line."""
        return {"pod": self.pod.name, "admit": self.admit, "reason": self.reason,
                "hint": self.hint.to_json(),
                "containers": {n: c.to_json() for n, c in self.containers.items()},
                "gpus": self.gpus}

    def explain(self) -> dict[str, Any]:
        out = self.to_json()
        out.update({"namespace": self.pod.namespace, "uid": self.pod.uid,
                    "policy": self.policy, "scope": self.scope, "message": self.message,
                    "qos": self.pod.qos, "seconds": self.seconds,
                    "decisions": [d.to_json() for d in self.decisions]})
        return out


# ---------------------------------------------------------------- admission


class _Run:
    """One pod's admission: its hint providers (the registry's kinds and the caller's, in
    hint order: CPUs, memory, devices, GPU groups) over one working copy of the ledger.
    The providers that are parts of one kubelet manager give the merge one map, as that
    manager does (``explain`` shows the managers' maps)."""

    def __init__(self, machine: Machine, ledger: Ledger, pod: Pod, policy: AlignmentPolicy,
                 options: PolicyOptions, kinds: Sequence[ProviderKind]) -> None:
        self.machine = machine
        self.pod = pod
        self.policy = policy  # looked up once, by admit_pod
        self.aligns = policy.aligns
        self.options = options
        self.admission = Admission(machine, pod, ledger.copy())
        self.providers: tuple[HintProvider, ...] = tuple(providers_for(self.admission, kinds))
        self.managers = list(dict.fromkeys(p.manager for p in self.providers))
        self.allocators: list[HintProvider] = sorted(
            self.providers, key=lambda p: p.allocation_order)
        self.stage: tuple[str, str] | None = None  # (container, manager) allocating now

    @property
    def work(self) -> Ledger:
        return self.admission.work

    def reports(self) -> dict[str, Any]:
        return {p.name: r for p in self.providers if (r := p.report()) is not None}

    def decide(self, name: str, unit: Sequence[Container]) -> UnitDecision:
        t0 = time.perf_counter()
        if not self.aligns:
            return UnitDecision(name, [], [], None, TopologyHint(None, False), True,
                            seconds=time.perf_counter() - t0)
        asks = [p.ask(unit) for p in self.providers]
        key = self._key(asks)
        got = None if key is None else _DECISIONS.get(key)
        if got is None:
            got = self._merge(asks)
            if key is not None:
                if len(_DECISIONS) >= DECISION_CACHE_SIZE:
                    _DECISIONS.pop(next(iter(_DECISIONS)), None)
                _DECISIONS[key] = got
        plan, providers, result, sources = got
        return UnitDecision(name, list(providers), list(self.managers), result,
                            result.hint, result.admit, plan, time.perf_counter() - t0,
                            dict(sources))

    def _merge(self, asks: Sequence[Ask]) -> _Merged:
        demands = [d for a in asks for d in a.demands]
        fixed = [hints for a in asks for hints in a.fixed.values()]
        machine = self.machine
        plan = plan_hints(demands, machine.numa_ids, machine.distances, self.policy,
                          self.options.prefer_closest_numa_nodes, fixed=fixed)
        maps: dict[str, dict[str, list[TopologyHint] | None]] = {
            m: {} for m in self.managers}
        sources: dict[str, str] = {}
        at = 0
        for p, a in zip(self.providers, asks, strict=True):
            lists = plan.lists[at:at + len(a.demands)]
            at += len(a.demands)
            got = p.hints(a, lists)
            maps[p.manager].update(got)
            sources.update(dict.fromkeys(got, p.name))
        providers: list[ProviderHints] = [maps[m] or None for m in self.managers]
        result = merge(self.policy, providers, machine.numa_ids, machine.distances,
                       self.options)
        return plan, tuple(providers), result, sources

    def _key(self, asks: Sequence[Ask]) -> Hashable | None:
        """Everything the merge of a decision depends on: the policy and its options, the
        NUMA nodes, the lists the providers give as they are and, for their demands,
        what each demand's hint list depends on (:meth:`Demand.key`, which the hint
        walk computes anyway): nodes of one machine with as much free per NUMA node
        share the merge (a scheduler extender's first filter of a pod shape over many
        nodes). None (decide afresh) for a decision that needs NUMA distances, a machine
        too wide for the full hint walk (the reduced one reads more of a demand), or a
        demand without a key."""
        if self.options.prefer_closest_numa_nodes:
            return None
        numa_ids = tuple(self.machine.numa_ids)
        demands: list[Hashable] = []
        if any(a.demands for a in asks):
            if len(numa_ids) > FULL_LIMIT or not SHARE_DEMAND_MERGES:
                return None
            for a in asks:
                for d in a.demands:
                    k = d.key()
                    if k is None:
                        return None
                    demands.append((d.provider, d.keys, k))
        fixed = tuple((p.name, tuple((r, None if h is None else tuple(h))
                                     for r, h in a.fixed.items()), len(a.demands))
                      for p, a in zip(self.providers, asks, strict=True))
        return (self.policy.name, self.options, numa_ids, fixed, tuple(demands))

    def allocate(self, c: Container, hint: TopologyHint) -> ContainerResult:
        """Allocate one container inside the merged hint, the kubelet's providers in the
        order they were added (devices, CPUs, memory: the first that fails names the
        error), then record it in the working ledger."""
        pod, machine, work = self.pod, self.machine, self.work
        alloc = ContainerAllocation(reusable=c.is_init)
        for p in self.allocators:
            self.stage = (c.name, p.manager)
            p.allocate(c, hint, alloc)
        try:
            work.allocate(pod.uid, c.name, alloc, pod_name=pod.name, namespace=pod.namespace)
        except TopologyError as e:  # pragma: no cover - the managers keep the invariants
            raise AllocationFailed(str(e)) from None
        if hint.mask is not None:
            nodes = mask_ids(hint.mask)
        else:
            used = {machine.cpus[x].numa for x in alloc.cpus}
            used |= {nd for per in alloc.memory.values() for nd, b in per.items() if b}
            for r, held in alloc.devices.items():
                used |= {d.numa_node for d in machine.devices_of(r)
                         if d.id in held and d.numa_node is not None}
            nodes = sorted(used)
        return ContainerResult(nodes, alloc, hint)


def allocation_failure(problem: object) -> str:
    """The kubelet's message when a manager cannot allocate what the merge admitted."""
    return f"Allocate failed due to {problem}, which is unexpected"


def admit_pod(machine: Machine, ledger: Ledger, pod: Pod, policy: AlignmentPolicy | str,
              scope: str = SCOPE_CONTAINER, options: PolicyOptions | None = None, *,
              providers: Sequence[ProviderKind] = (), commit: bool = True) -> AdmitResult:
    """Admit ``pod`` on ``machine`` against ``ledger`` under ``policy`` (the policy
    object, or its name: looked up once, here); on admission (and ``commit``) the ledger
    takes the pod's allocation, on rejection it is left untouched. ``providers``: kinds
    of resource of this admission only, beside the registry's.

    Raises TopologyError for an unknown policy or scope, InvalidPodRequest (a
    TopologyError) for a pod's request of a kind that cannot be read (a bad
    ``numalign.io/gpus``); a pod asking for more than the machine has is rejected, as
    the kubelet rejects it.
    """
    t0 = time.perf_counter()
    pol = policy if isinstance(policy, AlignmentPolicy) else get_policy(policy)
    check_scope(scope)
    opts = options if options is not None else PolicyOptions()
    if pod.uid in ledger.pods:
        raise TopologyError(f"pod {pod.name}", f"uid {pod.uid} is already admitted")
    run = _Run(machine, ledger, pod, pol, opts, providers)
    decisions: list[UnitDecision] = []
    containers: dict[str, ContainerResult] = {}

    def reject(reason: str, message: str, hint: TopologyHint,
               failed: tuple[str, str] | None = None) -> AdmitResult:
        return AdmitResult(pod, pol.name, scope, False, reason, message, hint, {}, {},
                           decisions, time.perf_counter() - t0, failed)

    try:
        if scope == SCOPE_POD:
            dec = run.decide("pod", pod.all_containers)
            decisions.append(dec)
            if not dec.admit:
                return reject(REJECT_REASON, REJECT_MESSAGE, dec.hint)
            for c in pod.all_containers:
                containers[c.name] = run.allocate(c, dec.hint)
            hint = dec.hint
        else:
            for c in pod.all_containers:
                dec = run.decide(c.name, [c])
                decisions.append(dec)
                if not dec.admit:
                    return reject(REJECT_REASON, REJECT_MESSAGE, dec.hint)
                containers[c.name] = run.allocate(c, dec.hint)
            hint = _pod_hint(decisions)
    except AllocationFailed as e:
        return reject(UNEXPECTED_REASON, allocation_failure(e),
                      decisions[-1].hint if decisions else TopologyHint(None, False),
                      run.stage)
    short = check_fit_totals(machine, pod, *ledger.requested())
    if short is not None:
        return reject(short.reason, short.message, hint)
    result = AdmitResult(pod, pol.name, scope, True, None, None, hint, containers,
                         run.reports(), decisions, time.perf_counter() - t0,
                         work=None if commit else run.work,
                         room_by_counts=all(p.room_by_counts for p in run.providers))
    if commit:
        ledger.replace_with(run.work)
        if pod.uid in ledger.pods:
            ledger.annotate(pod.uid, {"policy": pol.name, "scope": scope,
                                      "hint": hint.to_json(), "gpus": result.gpus},
                            fit_requests(pod))
    return result


def _pod_hint(decisions: Sequence[UnitDecision]) -> TopologyHint:
    """Container scope: the union of the containers' affinities, preferred iff all are."""
    masks = [d.hint.mask for d in decisions if d.hint.mask is not None]
    union: NumaMask | None = None
    for m in masks:
        union = m if union is None else union | m
    return TopologyHint(union, all(d.hint.preferred for d in decisions))
