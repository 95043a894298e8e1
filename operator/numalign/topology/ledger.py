"""The allocation ledger of one node: which pod's container holds which exclusive CPUs,
memory per NUMA node (regular memory and each hugepage size) and devices.

Invariants, checked before anything changes (a refused operation leaves the ledger as it
was): a CPU or a device is held by at most one container; no NUMA node's free memory of
any kind goes below zero; everything named exists on the machine. The one sanctioned
hand-over is the kubelet's reuse: an app container (or a later init container) of the same
pod may take CPUs and devices held by one of the pod's plain (non-restartable) init
containers, which have finished by then.

The memory manager's grouping rule is derived from the records: every NUMA node in a
container's memory affinity counts one assignment per memory type and belongs to that
affinity's group (``cells``).

Copies are cheap (every admission works on one): a copy shares the pod records and copies
only the record map and the indexes. A record is written through its ledger only, which
first takes a private copy of a record it shares (copy on write), and a
``ContainerAllocation`` a ledger holds is never changed in place but replaced; so what a
copy does never shows in its source, nor the other way round. Records read from ``pods``
are for reading.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from .errors import TopologyError
from .hints import NumaMask, mask_ids, mask_of
from .machine import Machine
from .pod import HUGEPAGES_PREFIX

MEMORY = "memory"

T = TypeVar("T")


class LedgerError(TopologyError):
    """An allocation or release the ledger refuses; the ledger is unchanged."""


@dataclass
class ContainerAllocation:
    """What one container holds."""

    cpus: tuple[int, ...] = ()
    memory: dict[str, dict[int, int]] = field(default_factory=dict)  # type -> node -> bytes
    memory_mask: NumaMask | None = None  # the memory manager's NUMA affinity (its group)
    devices: dict[str, tuple[str, ...]] = field(default_factory=dict)  # resource -> ids
    reusable: bool = False  # a plain init container: later containers may take its CPUs/devices

    def memory_by_zone(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for per_node in self.memory.values():
            for node, b in per_node.items():
                if b:
                    out[str(node)] = out.get(str(node), 0) + b
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "cpus": list(self.cpus),
            "memory": {t: {str(n): b for n, b in sorted(per.items())}
                       for t, per in sorted(self.memory.items())},
            "memoryNumaNodes": None if self.memory_mask is None else mask_ids(self.memory_mask),
            "devices": {r: list(ids) for r, ids in sorted(self.devices.items())},
            "reusable": self.reusable,
        }

    @staticmethod
    def from_json(doc: Any, where: str) -> ContainerAllocation:
        if not isinstance(doc, Mapping):
            raise LedgerError(where, "must be a mapping")
        try:
            cpus = tuple(int(c) for c in doc.get("cpus") or [])
            memory = {str(t): {int(n): int(b) for n, b in per.items()}
                      for t, per in (doc.get("memory") or {}).items()}
            mm = doc.get("memoryNumaNodes")
            devices = {str(r): tuple(str(i) for i in ids)
                       for r, ids in (doc.get("devices") or {}).items()}
        except (TypeError, ValueError, AttributeError) as e:
            raise LedgerError(where, f"malformed allocation: {e}") from None
        mask = None if mm is None else mask_of([int(x) for x in mm])
        return ContainerAllocation(cpus=cpus, memory=memory, memory_mask=mask,
                                   devices=devices, reusable=bool(doc.get("reusable", False)))


@dataclass
class PodRecord:
    uid: str
    name: str
    namespace: str
    containers: dict[str, ContainerAllocation] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)  # free-form (policy, hint, ...)
    # the pod's requests as the kubelet's resource-fit check counts them (topology.resourcefit)
    requests: dict[str, int] = field(default_factory=dict)


Owner = tuple[str, str]  # (pod uid, container name)


def _copy_container(a: ContainerAllocation) -> ContainerAllocation:
    """A ledger's own copy of a caller's allocation (the caller may go on changing its
    object; the ledger never changes its copy in place)."""
    return ContainerAllocation(cpus=a.cpus, memory={t: dict(per) for t, per in a.memory.items()},
                               memory_mask=a.memory_mask, devices=dict(a.devices),
                               reusable=a.reusable)


def _copy_record(r: PodRecord) -> PodRecord:
    """A record another ledger may share, for writing: its maps are copied, the
    allocations in them (never changed in place) are shared, ``info``'s values too (they
    are replaced, never changed in place)."""
    return PodRecord(uid=r.uid, name=r.name, namespace=r.namespace,
                     containers=dict(r.containers), info=dict(r.info),
                     requests=dict(r.requests))


class Ledger:
    """Allocation state of one machine."""

    def __init__(self, machine: Machine) -> None:
        self.machine = machine
        self.pods: dict[str, PodRecord] = {}
        self._owned: set[str] = set()  # uids of records no other ledger shares
        self._cpu_numa = {c.id: c.numa for c in machine.cpus.values()}
        self._devices = {(d.resource, d.id): d for d in machine.devices}
        self._numa_mask = mask_of(machine.numa_ids)
        self._capacity: dict[tuple[int, str], int] = {}
        for n in machine.numa_nodes:
            self._capacity[(n.id, MEMORY)] = n.memory
            for size, total in n.hugepages.items():
                self._capacity[(n.id, HUGEPAGES_PREFIX + size)] = total
        self._reindex()

    # ------------------------------------------------------------ indexes

    def _reindex(self) -> None:
        self._memo: dict[Hashable, Any] = {}
        self.cpu_owner: dict[int, Owner] = {}
        self.device_owner: dict[tuple[str, str], Owner] = {}
        self.memory_used: dict[tuple[int, str], int] = {}
        self.assignments: dict[int, int] = {}
        self.cells: dict[int, NumaMask] = {}
        for uid, rec in self.pods.items():
            for name, a in rec.containers.items():
                self._index(uid, name, a)

    def _own(self, uid: str) -> PodRecord:
        """The ledger's record of ``uid``, to write to (copied first while shared)."""
        rec = self.pods[uid]
        if uid not in self._owned:
            rec = self.pods[uid] = _copy_record(rec)
            self._owned.add(uid)
        return rec

    def _share(self, other: Ledger) -> None:
        """Take ``other``'s state, sharing its records (neither may write them in place
        from now on)."""
        self.pods = dict(other.pods)
        self.cpu_owner = dict(other.cpu_owner)
        self.device_owner = dict(other.device_owner)
        self.memory_used = dict(other.memory_used)
        self.assignments = dict(other.assignments)
        self.cells = dict(other.cells)
        self._memo = other._memo  # the same state: the same derived values
        self._owned = set()
        other._owned = set()

    def _index(self, uid: str, name: str, a: ContainerAllocation) -> None:
        for c in a.cpus:
            self.cpu_owner[c] = (uid, name)
        for res, ids in a.devices.items():
            for i in ids:
                self.device_owner[(res, i)] = (uid, name)
        for t, per in a.memory.items():
            for node, b in per.items():
                self.memory_used[(node, t)] = self.memory_used.get((node, t), 0) + b
        if a.memory_mask is not None and a.memory:
            for node in mask_ids(a.memory_mask):
                self.assignments[node] = self.assignments.get(node, 0) + len(a.memory)
                self.cells[node] = a.memory_mask

    # ------------------------------------------------------------ views

    def derived(self, key: Hashable, make: Callable[[], T]) -> T:
        """``make()``, made once per state of the ledger (copies share it until one of
        them changes): ``make`` must depend on the ledger's state and ``key`` alone, and
        its value is read, never changed."""
        memo = self._memo
        if key in memo:
            return cast(T, memo[key])
        value = memo[key] = make()
        return value

    def capacity(self, node: int, kind: str) -> int:
        return self._capacity.get((node, kind), 0)

    def free_memory(self, node: int, kind: str) -> int:
        return self.capacity(node, kind) - self.memory_used.get((node, kind), 0)

    def free_cpus(self) -> set[int]:
        return set(self.derived("free_cpus", lambda: frozenset(
            c for c in self._cpu_numa if c not in self.cpu_owner)))

    def free_devices(self, resource: str) -> list[str]:
        return [d.id for d in self.machine.devices_of(resource)
                if (resource, d.id) not in self.device_owner]

    def reusable_cpus(self, uid: str) -> set[int]:
        """CPUs the pod's finished plain init containers hold (the kubelet's cpusToReuse)."""
        rec = self.pods.get(uid)
        if rec is None:
            return set()
        return {c for a in rec.containers.values() if a.reusable for c in a.cpus}

    def reusable_devices(self, uid: str, resource: str) -> set[str]:
        rec = self.pods.get(uid)
        if rec is None:
            return set()
        return {i for a in rec.containers.values() if a.reusable
                for i in a.devices.get(resource, ())}

    def pod_requests(self) -> list[dict[str, int]]:
        """The requests of every pod the ledger holds (for the resource-fit check)."""
        return [r.requests for r in self.pods.values()]

    def requested(self) -> tuple[int, Mapping[str, int]]:
        """How many pods the ledger holds and the sum of their requests per resource."""
        def total() -> tuple[int, Mapping[str, int]]:
            out: dict[str, int] = {}
            for r in self.pods.values():
                for res, v in r.requests.items():
                    out[res] = out.get(res, 0) + v
            return len(self.pods), out

        return self.derived("requested", total)

    def free_view(self) -> dict[str, dict[str, Any]]:
        """Free resources per NUMA node: cpus, memory and hugepages (bytes), devices."""
        free = self.free_cpus()
        out: dict[str, dict[str, Any]] = {}
        for n in self.machine.numa_nodes:
            kinds = {k for (node, k) in self._capacity if node == n.id}
            out[str(n.id)] = {
                "cpus": sorted(c for c in n.cpus if c in free),
                **{k: self.free_memory(n.id, k) for k in sorted(kinds)},
                "devices": {r: [d.id for d in self.machine.devices_of(r)
                                if d.numa_node == n.id and (r, d.id) not in self.device_owner]
                            for r in self.machine.device_resources},
            }
        return out

    # ------------------------------------------------------------ changes

    def _check(self, uid: str, name: str, a: ContainerAllocation,
               pending: Mapping[tuple[int, str], int]) -> None:
        where = f"pod {uid} container {name}"
        rec = self.pods.get(uid)
        if rec is not None and name in rec.containers:
            raise LedgerError(where, "already holds an allocation")
        cpus, cpu_numa, cpu_owner = a.cpus, self._cpu_numa, self.cpu_owner
        if len(set(cpus)) != len(cpus):
            raise LedgerError(where, "lists a CPU twice")
        for c in cpus:
            if c not in cpu_numa:
                raise LedgerError(where, f"cpu {c} is not on this machine")
            owner = cpu_owner.get(c)
            if owner is not None and not self._reusable_by(owner, uid):
                raise LedgerError(where, f"cpu {c} is already held by {owner[0]}/{owner[1]}")
        for res, ids in a.devices.items():
            if len(set(ids)) != len(ids):
                raise LedgerError(where, f"lists a device of {res} twice")
            for i in ids:
                if (res, i) not in self._devices:
                    raise LedgerError(where, f"device {i} of {res} is not on this machine")
                owner = self.device_owner.get((res, i))
                if owner is not None and not self._reusable_by(owner, uid):
                    raise LedgerError(where, f"device {i} of {res} is already held by "
                                             f"{owner[0]}/{owner[1]}")
        for t, per in a.memory.items():
            for node, b in per.items():
                if b < 0:
                    raise LedgerError(where, f"negative {t} on NUMA node {node}")
                if (node, t) not in self._capacity and b:
                    raise LedgerError(where, f"NUMA node {node} has no {t}")
                left = self.free_memory(node, t) - pending.get((node, t), 0) - b
                if left < 0:
                    raise LedgerError(where, f"{t} on NUMA node {node}: {-left} bytes short")
        if a.memory_mask is not None and a.memory_mask & ~self._numa_mask:
            bad = [n for n in mask_ids(a.memory_mask) if n not in self.machine.numa_ids]
            if bad:
                raise LedgerError(where, f"memory affinity names unknown NUMA nodes {bad}")

    def _reusable_by(self, owner: Owner, uid: str) -> bool:
        if owner[0] != uid:
            return False
        return self.pods[uid].containers[owner[1]].reusable

    def allocate(self, uid: str, name: str, allocation: ContainerAllocation, *,
                 pod_name: str = "", namespace: str = "default") -> None:
        """Record a container's allocation (all or nothing)."""
        self.allocate_many(uid, [(name, allocation)], pod_name=pod_name, namespace=namespace)

    def allocate_many(self, uid: str, items: Iterable[tuple[str, ContainerAllocation]], *,
                      pod_name: str = "", namespace: str = "default",
                      info: Mapping[str, Any] | None = None,
                      requests: Mapping[str, int] | None = None) -> None:
        """Record several containers of one pod at once: all are checked, then all applied."""
        items = list(items)
        names = [n for n, _ in items]
        if len(set(names)) != len(names):
            raise LedgerError(f"pod {uid}", "names a container twice")
        pending: dict[tuple[int, str], int] = {}
        taken_cpus: set[int] = set()
        taken_dev: set[tuple[str, str]] = set()
        for name, a in items:
            self._check(uid, name, a, pending)
            for c in a.cpus:
                if c in taken_cpus:
                    raise LedgerError(f"pod {uid} container {name}", f"cpu {c} is given twice")
                taken_cpus.add(c)
            for res, ids in a.devices.items():
                for i in ids:
                    if (res, i) in taken_dev:
                        raise LedgerError(f"pod {uid} container {name}",
                                          f"device {i} of {res} is given twice")
                    taken_dev.add((res, i))
            for t, per in a.memory.items():
                for node, b in per.items():
                    pending[(node, t)] = pending.get((node, t), 0) + b
        # all checked: apply
        self._memo = {}
        if uid in self.pods:
            rec = self._own(uid)
        else:
            rec = self.pods[uid] = PodRecord(uid=uid, name=pod_name or uid,
                                             namespace=namespace)
            self._owned.add(uid)
        if info:
            rec.info.update(info)
        if requests is not None:
            rec.requests = dict(requests)
        for name, a in items:
            if rec.containers:  # CPUs or devices may pass from its init containers
                self._hand_over(rec, a)
            rec.containers[name] = held = _copy_container(a)
            self._index(uid, name, held)  # (a handed-over item changes owner here)

    def _hand_over(self, rec: PodRecord, a: ContainerAllocation) -> None:
        """Take reused CPUs and devices away from the pod's finished init containers (the
        indexes keep them until the taker is indexed; memory is not handed over)."""
        for c in a.cpus:
            owner = self.cpu_owner.get(c)
            if owner is not None:
                held = rec.containers[owner[1]]
                rec.containers[owner[1]] = replace(
                    held, cpus=tuple(x for x in held.cpus if x != c))
        for res, ids in a.devices.items():
            for i in ids:
                owner = self.device_owner.get((res, i))
                if owner is not None:
                    held = rec.containers[owner[1]]
                    kept = tuple(x for x in held.devices.get(res, ()) if x != i)
                    rec.containers[owner[1]] = replace(held, devices={**held.devices,
                                                                      res: kept})

    def annotate(self, uid: str, info: Mapping[str, Any],
                 requests: Mapping[str, int] | None = None) -> None:
        """Add ``info`` to a held pod's record (and set its requests, when given)."""
        if uid not in self.pods:
            raise LedgerError(f"pod {uid}", "is not held")
        self._memo = {}
        rec = self._own(uid)
        rec.info.update(info)
        if requests is not None:
            rec.requests = dict(requests)

    def release(self, uid: str, container: str | None = None) -> bool:
        """Release a pod (or one of its containers). Returns whether anything was held."""
        rec = self.pods.get(uid)
        if rec is None:
            return False
        if container is None:
            del self.pods[uid]
        else:
            if container not in rec.containers:
                return False
            rec = self._own(uid)
            del rec.containers[container]
            if not rec.containers:
                del self.pods[uid]
        self._reindex()
        return True

    def copy(self) -> Ledger:
        """An independent copy (for trial allocations)."""
        new = Ledger.__new__(Ledger)
        new.machine = self.machine
        new._cpu_numa = self._cpu_numa
        new._devices = self._devices
        new._capacity = self._capacity
        new._numa_mask = self._numa_mask
        new._share(self)
        return new

    def replace_with(self, other: Ledger) -> None:
        """Take over another ledger's state (commit of a trial copy); the two stay
        independent."""
        if other.machine is not self.machine:
            raise LedgerError("", "ledgers of different machines")
        self._share(other)

    # ------------------------------------------------------------ persistence

    def to_json(self) -> dict[str, Any]:
        return {"machine": self.machine.name, "pods": [
            {"uid": r.uid, "name": r.name, "namespace": r.namespace, "info": r.info,
             "requests": dict(r.requests),
             "containers": {n: a.to_json() for n, a in r.containers.items()}}
            for r in self.pods.values()]}

    @classmethod
    def from_json(cls, machine: Machine, doc: Any) -> Ledger:
        """Rebuild a ledger; every record is checked as a fresh allocation would be."""
        ledger = cls(machine)
        if not isinstance(doc, Mapping) or not isinstance(doc.get("pods", []), list):
            raise LedgerError("ledger", "must be a mapping with a list of pods")
        for i, p in enumerate(doc.get("pods", [])):
            where = f"ledger.pods[{i}]"
            if not isinstance(p, Mapping) or not isinstance(p.get("uid"), str):
                raise LedgerError(where, "must be a mapping with a uid")
            if p["uid"] in ledger.pods:
                raise LedgerError(f"{where}.uid", f"pod {p['uid']} is listed twice")
            containers = p.get("containers") or {}
            if not isinstance(containers, Mapping):
                raise LedgerError(f"{where}.containers", "must be a mapping")
            items = [(str(n), ContainerAllocation.from_json(a, f"{where}.containers.{n}"))
                     for n, a in containers.items()]
            info = p.get("info") if isinstance(p.get("info"), Mapping) else None
            raw_req = p.get("requests") or {}
            try:
                requests = {str(k): int(v) for k, v in raw_req.items()}
            except (TypeError, ValueError, AttributeError):
                raise LedgerError(f"{where}.requests",
                                  "must map resource names to integers") from None
            ledger.allocate_many(p["uid"], items, pod_name=str(p.get("name") or p["uid"]),
                                 namespace=str(p.get("namespace") or "default"), info=info,
                                 requests=requests)
        return ledger
