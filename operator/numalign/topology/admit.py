"""Pod admission as the kubelet's Topology Manager does it, against a ``Ledger``.

Scope ``container``: init containers in order, then app containers, one decision each
(hints, merge, admit, allocation inside the merged affinity); scope ``pod``: one decision
for the pod's effective request, every container allocated inside it. Resources held by
finished init containers are reusable as the kubelet reuses them. Work happens on a copy
of the ledger that replaces it only when the whole pod is admitted.

Rejections carry the kubelet's reasons and messages, in its order of admit handlers:
``TopologyAffinityError`` (the merge does not admit) or ``UnexpectedAdmissionError`` (a
manager cannot allocate inside what was admitted); then the resource-fit check
(``topology.fit``: ``OutOfcpu``, ``OutOfmemory``, ``OutOf<resource>``) against the pods
the ledger holds. A pod asking for more than the machine has is rejected the same way;
only malformed input (an unknown policy or scope) raises ``TopologyError``.

Each container's memory is reported as the memory manager holds it: the NUMA nodes its
memory may use (its block's affinity, kept when it reuses its init container's memory)
and the bytes it took per node. A ``DeviceOverride`` replaces the device manager for a
resource (GPU groups plug in here).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .cpu_assign import allocate_cpus
from .errors import TopologyError
from .fit import check_fit, fit_requests
from .hintgen import FULL_LIMIT, HintPlan, best_subset, plan_hints
from .hints import NumaMask, ProviderHints, TopologyHint, mask_ids
from .ledger import MEMORY, ContainerAllocation, Ledger
from .machine import Machine
from .merge import REJECT_MESSAGE, REJECT_REASON, MergeResult, merge
from .pod import HUGEPAGES_PREFIX, Container, Pod, effective_request, is_hugepages
from .policy import (
    POLICY_NONE,
    SCOPE_CONTAINER,
    SCOPE_POD,
    PolicyOptions,
    check_policy,
    check_scope,
)
from .providers import (
    Demand,
    cpu_demand,
    device_hints_or_demand,
    device_request,
    guaranteed_cpus,
    iterate_masks,
    memory_demand,
    memory_request,
)

UNEXPECTED_REASON = "UnexpectedAdmissionError"


class AllocationFailed(Exception):
    """A manager cannot allocate what the merge admitted (kubelet: Allocate error)."""


# ---------------------------------------------------------------- override hook


@dataclass(frozen=True)
class OverrideRequest:
    """What a device provider override is asked about: one decision (hints) or one
    container's allocation (``allocate``)."""

    machine: Machine
    pod: Pod
    resource: str
    containers: tuple[Container, ...]  # the decision unit, or the one container
    count: int  # devices of ``resource`` the unit asks for
    free: frozenset[str]  # free device ids of ``resource`` (plus the pod's reusable ones)
    free_by_resource: Mapping[str, frozenset[str]]  # the same for every device resource


@dataclass
class OverrideAllocation:
    devices: dict[str, list[str]]  # resource -> device ids for the container
    gpus: dict[str, list[str]] = field(default_factory=dict)  # request name -> device ids


class DeviceOverride(Protocol):
    """Replaces the device manager for the resources it names: ``allocate`` is asked for the
    first container requesting one (for each, with a true ``per_container`` attribute)."""

    resources: tuple[str, ...]

    def hints(self, req: OverrideRequest) -> list[TopologyHint] | None:
        """Hints for the decision; None = no preference, [] = cannot satisfy."""
        ...

    def allocate(self, req: OverrideRequest, mask: NumaMask | None) -> OverrideAllocation:
        """Devices for one container inside ``mask``; raise TopologyError if impossible."""
        ...


OverrideFactory = Callable[[Machine, Pod], Sequence[DeviceOverride]]


# ---------------------------------------------------------------- results


@dataclass
class Decision:
    """One Topology Manager decision (a container, or the pod): for `numalign explain`."""

    unit: str  # container name, or "pod"
    providers: list[ProviderHints]
    provider_names: list[str]
    merge: MergeResult | None
    hint: TopologyHint
    admit: bool
    plan: HintPlan | None = None
    seconds: float = 0.0

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
    gpus: dict[str, list[str]]
    decisions: list[Decision]
    seconds: float = 0.0
    # An UnexpectedAdmissionError: the container whose allocation failed and the manager
    # that failed it ("devices", "cpu" or "memory"), as the kubelet's providers run
    failed: tuple[str, str] | None = None

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
    def __init__(self, machine: Machine, ledger: Ledger, pod: Pod, policy: str,
                 options: PolicyOptions, overrides: Sequence[DeviceOverride]) -> None:
        self.machine = machine
        self.work = ledger.copy()
        self.pod = pod
        self.policy = policy
        self.options = options
        self.overrides = {r: o for o in overrides for r in o.resources}
        self.gpus: dict[str, list[str]] = {}
        self.override_done: set[int] = set()
        # memory of plain init containers reusable by later ones: (mask, kind) -> bytes
        self.mem_reuse: dict[tuple[NumaMask, str], int] = {}
        self.stage: tuple[str, str] | None = None  # (container, manager) allocating now

    # -- requests of a unit (one container, or the whole pod)

    def unit_cpus(self, unit: Sequence[Container]) -> int:
        return self._unit(unit, lambda c: guaranteed_cpus(self.pod, c))

    def unit_memory(self, unit: Sequence[Container]) -> dict[str, int]:
        per = {c.name: memory_request(self.pod, c) for c in self.pod.all_containers}
        out = self._unit_map(unit, per)
        if len(unit) > 1:
            # the memory manager's pod request (getPodRequestedResources) has only the
            # memory types the app containers ask for: a type only init containers or
            # sidecars ask for takes no part in the pod's hints
            asked = {k for c in self.pod.containers for k in per[c.name]}
            out = {k: v for k, v in out.items() if k in asked}
        return out

    def unit_devices(self, unit: Sequence[Container]) -> dict[str, int]:
        per = {c.name: device_request(c, self.machine) for c in self.pod.all_containers}
        return self._unit_map(unit, per)

    def _unit_map(self, unit: Sequence[Container],
                  per: Mapping[str, Mapping[str, int]]) -> dict[str, int]:
        kinds = sorted({k for c in unit for k in per[c.name]})
        out: dict[str, int] = {}
        for k in kinds:
            v = self._unit(unit, _getter(per, k))
            if v:
                out[k] = v
        return out

    def _unit(self, unit: Sequence[Container], value: Callable[[Container], int]) -> int:
        if len(unit) == 1:
            return value(unit[0])
        return effective_request(self.pod.init_containers, self.pod.containers, value, 0)

    def free_sets(self) -> dict[str, frozenset[str]]:
        uid = self.pod.uid
        return {r: frozenset(self.work.free_devices(r)) | self.work.reusable_devices(uid, r)
                for r in self.machine.device_resources}

    # -- one decision

    def decide(self, name: str, unit: Sequence[Container]) -> Decision:
        t0 = time.perf_counter()
        pod, machine, work = self.pod, self.machine, self.work
        if self.policy == POLICY_NONE:
            return Decision(name, [], [], None, TopologyHint(None, False), True,
                            seconds=time.perf_counter() - t0)
        demands: list[Demand] = []
        slots: list[tuple[str, str]] = []  # (provider, resource key) per demand
        fixed: dict[str, dict[str, list[TopologyHint] | None]] = {"devices": {}}
        n_cpu = self.unit_cpus(unit)
        if n_cpu:
            demands.append(cpu_demand(machine, work, pod.uid, n_cpu))
            slots.append(("cpu", "cpu"))
        mem = self.unit_memory(unit)
        if mem:
            demands.append(memory_demand(machine, work, mem, self._reusable_memory()))
            slots.append(("memory", ""))
        free_sets = self.free_sets()
        for res, count in self.unit_devices(unit).items():
            if res in self.overrides:
                continue
            got = device_hints_or_demand(machine, work, pod.uid, res, count)
            if isinstance(got, Demand):
                demands.append(got)
                slots.append(("devices", res))
            else:
                fixed["devices"][res] = got
        seen: set[int] = set()
        for res, ov in self.overrides.items():
            if id(ov) in seen or not any(r in c.requests for c in unit for r in ov.resources):
                continue
            seen.add(id(ov))
            counts = {c.name: {res: int(c.request(res))} for c in pod.all_containers}
            req = OverrideRequest(machine, pod, res, tuple(unit),
                                  self._unit(unit, _getter(counts, res)),
                                  free_sets.get(res, frozenset()), free_sets)
            fixed["devices"][res] = ov.hints(req)
        plan = plan_hints(demands, machine.numa_ids, machine.distances, self.policy,
                          self.options.prefer_closest_numa_nodes,
                          fixed=list(fixed["devices"].values()))
        cpu_p: dict[str, list[TopologyHint] | None] = {}
        mem_p: dict[str, list[TopologyHint] | None] = {}
        dev_p: dict[str, list[TopologyHint] | None] = {}
        for (prov, key), d, hints in zip(slots, demands, plan.lists, strict=True):
            if prov == "cpu":
                cpu_p[key] = hints
            elif prov == "memory":
                # the memory manager returns no hint at all when no mask can hold the
                # request: no preference (its Allocate then fails), not "cannot satisfy"
                if hints:
                    for k in d.keys:
                        mem_p[k] = list(hints)
            else:
                dev_p[key] = hints
        dev_p.update(fixed["devices"])
        providers: list[ProviderHints] = [cpu_p or None, mem_p or None, dev_p or None]
        result = merge(self.policy, providers, machine.numa_ids, machine.distances,
                       self.options)
        return Decision(name, providers, ["cpu", "memory", "devices"], result, result.hint,
                        result.admit, plan, time.perf_counter() - t0)

    # -- allocation of one container inside a merged hint

    def allocate(self, c: Container, hint: TopologyHint) -> ContainerResult:
        pod, machine, work = self.pod, self.machine, self.work
        mask = hint.mask
        alloc = ContainerAllocation(reusable=c.is_init)
        # the kubelet's providers allocate in the order they were added: devices, CPUs,
        # memory (the first that fails names the error)
        self.stage = (c.name, "devices")
        free_sets = self.free_sets()
        for res, count in device_request(c, machine).items():
            if res in self.overrides:
                continue
            alloc.devices[res] = tuple(self._allocate_devices(res, count, mask))
        for res, ov in self.overrides.items():
            if id(ov) in self.override_done or res not in c.requests:
                continue
            if not getattr(ov, "per_container", False):  # GPU groups: all to the first
                self.override_done.add(id(ov))
            req = OverrideRequest(machine, pod, res, (c,), int(c.request(res)),
                                  free_sets.get(res, frozenset()), free_sets)
            try:
                got = ov.allocate(req, mask)
            except TopologyError as e:
                raise AllocationFailed(str(e)) from None
            for r, ids in got.devices.items():
                alloc.devices[r] = tuple(ids)
            self.gpus.update(got.gpus)
        self.stage = (c.name, "cpu")
        n = guaranteed_cpus(pod, c)
        if n:
            usable = work.free_cpus() | work.reusable_cpus(pod.uid)
            cpus = allocate_cpus(machine, usable, n, mask)
            if cpus is None:
                # the CPU manager takes the CPUs inside the affinity first, then fails on
                # the remainder: its message counts what is left after the aligned ones
                aligned = 0 if mask is None else min(n, sum(
                    1 for x in usable if mask >> machine.cpus[x].numa & 1))
                raise AllocationFailed(f"not enough cpus available to satisfy request: "
                                       f"requested={n - aligned}, "
                                       f"available={len(usable) - aligned}")
            alloc.cpus = tuple(cpus)
        self.stage = (c.name, "memory")
        mem = memory_request(pod, c)
        if mem:
            self._allocate_memory(c, mem, hint, alloc)
        try:
            work.allocate(pod.uid, c.name, alloc, pod_name=pod.name, namespace=pod.namespace)
        except TopologyError as e:  # pragma: no cover - the managers keep the invariants
            raise AllocationFailed(str(e)) from None
        if mask is not None:
            nodes = mask_ids(mask)
        else:
            used = {machine.cpus[x].numa for x in alloc.cpus}
            used |= {nd for per in alloc.memory.values() for nd, b in per.items() if b}
            for r, held in alloc.devices.items():
                used |= {d.numa_node for d in machine.devices_of(r)
                         if d.id in held and d.numa_node is not None}
            nodes = sorted(used)
        return ContainerResult(nodes, alloc, hint)

    def _reusable_memory(self) -> dict[NumaMask, dict[str, int]]:
        out: dict[NumaMask, dict[str, int]] = {}
        for (m, kind), b in self.mem_reuse.items():
            if b:
                out.setdefault(m, {})[kind] = b
        return out

    def _allocate_memory(self, c: Container, req: Mapping[str, int], hint: TopologyHint,
                         alloc: ContainerAllocation) -> None:
        """The memory manager's Allocate: the default hint when the affinity is nil,
        extended when the affinity's free memory cannot hold the request, refused when it
        breaks the NUMA grouping rule; then bytes are taken node by node (lowest id
        first), less what the pod's init containers hold with the same affinity."""
        work = self.work
        d = memory_demand(self.machine, work, req, self._reusable_memory())

        def reuse(m: NumaMask, kind: str) -> int:
            return self.mem_reuse.get((m, kind), 0)

        def free_holds(m: NumaMask) -> bool:  # isAffinitySatisfyRequest: free memory only
            return all(sum(work.free_memory(nd, k) for nd in mask_ids(m)) >= v
                       for k, v in req.items())

        best, preferred = hint.mask, hint.preferred
        if best is None:
            best = self._best_hint(d, 0)
            if best is None:
                raise AllocationFailed("[memorymanager] failed to get the default NUMA "
                                       "affinity, no NUMA nodes with enough memory is available")
            if preferred and best.bit_count() != d.min_width():
                raise AllocationFailed("[memorymanager] failed to find the default preferred "
                                       "hint")
            preferred = best.bit_count() == d.min_width()
        if not free_holds(best):
            ext = self._best_hint(d, best)
            if ext is None:
                raise AllocationFailed("[memorymanager] failed to find NUMA nodes to extend "
                                       "the current topology hint")
            if preferred and ext.bit_count() != d.min_width():
                raise AllocationFailed("[memorymanager] failed to find the extended preferred "
                                       "hint")
            best = ext
        nodes = mask_ids(best)
        if len(nodes) > 1:
            for nd in nodes:
                if work.assignments.get(nd, 0) > 0:
                    group = work.cells.get(nd, 0)
                    if group.bit_count() <= 1 or group != best:
                        raise AllocationFailed("[memorymanager] preferred hint violates NUMA "
                                               "node allocation")
        for kind, size in req.items():
            r = reuse(best, kind)
            left = 0 if r >= size else size - r
            per: dict[int, int] = {}
            for nd in nodes:
                if left <= 0:
                    break
                take = min(max(0, work.free_memory(nd, kind)), left)
                if take:
                    per[nd] = take
                    left -= take
            alloc.memory[kind] = per
            key = (best, kind)
            if c.is_init:  # what later containers may reuse: the largest init block
                self.mem_reuse[key] = max(r, size)
            elif r:  # used up by this container
                self.mem_reuse[key] = 0 if size >= r else r - size
        alloc.memory_mask = best

    def _best_hint(self, d: Demand, within: NumaMask) -> NumaMask | None:
        """The memory manager's findBestHint over its hints containing ``within``: the
        narrowest (preferred ones are the narrowest), then the lowest mask value."""
        if len(d.domain) <= FULL_LIMIT:
            found = [m for m in iterate_masks(d.domain) if m & within == within and d.fits(m)]
            if not found:
                return None
            return min(found, key=lambda m: (m.bit_count(), m))
        start = max(1, within.bit_count())
        for k in range(start, len(d.domain) + 1):
            m = best_subset(d.domain, k, d.fits, tables=[(d.free, d.request)],
                            forced=within | d.required, prune=d.extendable)
            if m is not None:
                return m
        return None

    def _allocate_devices(self, res: str, count: int, mask: NumaMask | None) -> list[str]:
        """The device manager's devicesToAllocate: the pod's reusable devices first, then
        devices inside the affinity, then the others (each set in id order)."""
        work, machine = self.work, self.machine
        reusable = sorted(work.reusable_devices(self.pod.uid, res))
        out = reusable[:count]
        if len(out) == count:
            return out
        free = set(work.free_devices(res))
        need = count - len(out)
        if len(free) < need:
            raise AllocationFailed(f"requested number of devices unavailable for {res}. "
                                   f"Requested: {need}, Available: {len(free)}")
        devs = {dv.id: dv for dv in machine.devices_of(res)}
        aligned_possible = any(dv.numa_node is not None for dv in devs.values())
        if mask is None or not aligned_possible:
            aligned: list[str] = []
            rest = sorted(free)
        else:
            aligned = sorted(i for i in free if devs[i].numa_node is not None
                             and mask >> (devs[i].numa_node or 0) & 1)
            rest = sorted(free - set(aligned))
        return [*out, *(aligned + rest)[:need]]


def _getter(per: Mapping[str, Mapping[str, int]], key: str) -> Callable[[Container], int]:
    def get(c: Container) -> int:
        return per[c.name].get(key, 0)

    return get


def admit_pod(machine: Machine, ledger: Ledger, pod: Pod, policy: str,
              scope: str = SCOPE_CONTAINER, options: PolicyOptions | None = None, *,
              overrides: Sequence[DeviceOverride] = (), commit: bool = True) -> AdmitResult:
    """Admit ``pod`` on ``machine`` against ``ledger``; on admission (and ``commit``) the
    ledger takes the pod's allocation, on rejection it is left untouched.

    Raises TopologyError for an unknown policy or scope (a pod asking for more than the
    machine has is rejected, as the kubelet rejects it).
    """
    t0 = time.perf_counter()
    check_policy(policy)
    check_scope(scope)
    opts = options if options is not None else PolicyOptions()
    if pod.uid in ledger.pods:
        raise TopologyError(f"pod {pod.name}", f"uid {pod.uid} is already admitted")
    run = _Run(machine, ledger, pod, policy, opts, overrides)
    decisions: list[Decision] = []
    containers: dict[str, ContainerResult] = {}

    def reject(reason: str, message: str, hint: TopologyHint,
               failed: tuple[str, str] | None = None) -> AdmitResult:
        return AdmitResult(pod, policy, scope, False, reason, message, hint, {}, {},
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
        return reject(UNEXPECTED_REASON, f"Allocate failed due to {e}, which is unexpected",
                      decisions[-1].hint if decisions else TopologyHint(None, False),
                      run.stage)
    short = check_fit(machine, pod, ledger.pod_requests())
    if short is not None:
        return reject(short.reason, short.message, hint)
    if commit:
        ledger.replace_with(run.work)
        rec = ledger.pods.get(pod.uid)
        if rec is not None:
            rec.info.update({"policy": policy, "scope": scope, "hint": hint.to_json(),
                             "gpus": run.gpus})
            rec.requests = fit_requests(pod)
    return AdmitResult(pod, policy, scope, True, None, None, hint, containers, run.gpus,
                       decisions, time.perf_counter() - t0)


def _pod_hint(decisions: Sequence[Decision]) -> TopologyHint:
    """Container scope: the union of the containers' affinities, preferred iff all are."""
    masks = [d.hint.mask for d in decisions if d.hint.mask is not None]
    union: NumaMask | None = None
    for m in masks:
        union = m if union is None else union | m
    return TopologyHint(union, all(d.hint.preferred for d in decisions))


# ---------------------------------------------------------------- GPU groups hook


class GpuAnnotationOverride:
    """Device provider override for pods with ``numalign.io/gpus``: the GPU group
    allocator (``topology.gpu``) gives the NUMA hints of all the pod's GPU requests and
    places them; the whole placement goes to the first container asking for the GPU
    resource (or a ``withResource`` one)."""

    def __init__(self, machine: Machine, text: str) -> None:
        from . import gpu

        self._gpu = gpu
        self.machine = machine
        try:
            self.requests = gpu.parse_gpu_requests(text, machine)
        except TopologyError as e:
            sub = "" if e.field == gpu.ANNOTATION else _sub(e.field)
            raise TopologyError(f"metadata.annotations.{gpu.ANNOTATION}{sub}",
                                e.problem) from None
        res: list[str] = []
        for r in self.requests:
            for name in (r.resource, r.with_resource.resource if r.with_resource else None):
                if name is not None and name not in res:
                    res.append(name)
        self.resources = tuple(res)

    def hints(self, req: OverrideRequest) -> list[TopologyHint] | None:
        free = {r: req.free_by_resource.get(r, frozenset()) for r in self.resources}
        return list(self._gpu.hints(self.machine, free, self.requests))

    def allocate(self, req: OverrideRequest, mask: NumaMask | None) -> OverrideAllocation:
        free = {r: req.free_by_resource.get(r, frozenset()) for r in self.resources}
        got = self._gpu.allocate(self.machine, free, self.requests, mask)
        return OverrideAllocation({r: list(ids) for r, ids in got.devices.items()},
                                  {k: list(v) for k, v in got.gpus.items()})


def _sub(field_: str) -> str:
    if not field_:
        return ""
    return field_ if field_.startswith("[") else "." + field_


def default_overrides(machine: Machine, pod: Pod) -> list[DeviceOverride]:
    """The overrides a pod gets by default: GPU groups when it has ``numalign.io/gpus``."""
    text = pod.annotations.get("numalign.io/gpus")
    if text is None:
        return []
    return [GpuAnnotationOverride(machine, text)]
