"""The engine's decisions as NRI cpusets: numalign, not the kubelet, places containers.

:class:`EnginePlacer` is the :class:`~numalign.agent.nri.plugin.Placer` of a
numalign-managed node. At a pod's first container it admits the whole pod with the engine
(:func:`numalign.agent.engine.admit`) under the pod's resolved policy and scope, as on an
emulated node; a pod the engine rejects never gets a container (:class:`Rejected`). Each
container then gets:

- its exclusive CPUs when the allocation gives it some (guaranteed, integer CPU requests:
  the static policy's order), and the memory nodes of its allocation;
- otherwise the shared pool: every CPU of the machine that no admitted container holds
  exclusively (reserved CPUs included, as the kubelet's static policy does), and every
  memory node.

When exclusive CPUs are taken or given back, every shared container's cpuset is updated
(the answer to ``CreateContainer`` carries those updates; releases go through NRI's
``UpdateContainers``).

The machine's NUMA nodes may be a view laid over fewer real memory nodes (the local real
node): ``cpuset.mems`` names only memory nodes the kernel has (:func:`kernel_memory_nodes`),
a view node with no kernel node of its own mapping to all of them.

Pods are looked up by uid (:class:`PodView`: the pod as Kubernetes has it, its resolved
policy, and its recorded allocation, if any); a container of a pod the lookup does not know
(not from Kubernetes) runs in the shared pool. After a restart, :meth:`EnginePlacer.synchronize`
rebuilds the ledger from the recorded allocations of the pods the runtime still runs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numalign.agent import engine
from numalign.agent.nri.devices import Assigned, assigned_overrides
from numalign.agent.nri.plugin import CpuSet, Placement, Rejected
from numalign.api.wire import REJECT_REASON, Allocation, Resolved
from numalign.topology import quantity
from numalign.topology.errors import TopologyError
from numalign.topology.ledger import ContainerAllocation as LedgerContainer
from numalign.topology.ledger import Ledger, LedgerError
from numalign.topology.machine import Machine
from numalign.topology.quantity import format_cpulist

log = logging.getLogger(__name__)

RESERVED = "numalign.io/reserved-cpus"  # the ledger's pseudo pod holding reserved CPUs


@dataclass(frozen=True)
class PodView:
    pod: Mapping[str, Any]  # the Pod as the API server has it
    resolved: Resolved
    allocation: Allocation | None = None  # recorded (numalign.io/allocation), if any


def cpulist(ids: Iterable[int]) -> str:
    """The kernel's list format, with ranges: [0, 1, 2, 5] -> "0-2,5"."""
    return format_cpulist(set(ids))


def parse_cpulist(text: str, where: str = "cpulist") -> set[int]:
    """The engine's bounded parser of the kernel's list format; ValueError names ``where``."""
    try:
        return set(quantity.parse_cpulist(text))
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def kernel_memory_nodes(sysfs: Path = Path("/sys")) -> set[int]:
    """The NUMA nodes with memory that this kernel has (``has_memory``, else ``online``)."""
    base = sysfs / "devices" / "system" / "node"
    for name in ("has_memory", "online"):
        f = base / name
        if f.is_file():
            nodes = parse_cpulist(f.read_text(), str(f))
            if nodes:
                return nodes
    return {0}


class EnginePlacer:
    def __init__(self, machine: Machine, lookup: Callable[[str], PodView | None], *,
                 reserved_cpus: Iterable[int] = (), memory_nodes: Iterable[int] = (0,),
                 on_admit: Callable[[str, Allocation], None] | None = None,
                 wait_for: Callable[[str, float], Awaitable[bool]] | None = None,
                 wait_s: float = 5.0) -> None:
        self.machine = machine
        self.lookup = lookup
        self.wait_for = wait_for
        self.wait_s = wait_s
        self.reserved = set(reserved_cpus)
        unknown = self.reserved - set(machine.cpus)
        if unknown:
            raise ValueError(f"reserved_cpus: {cpulist(unknown)} not in machine "
                             f"{machine.name}")
        self.memory_nodes = set(memory_nodes)
        if not self.memory_nodes:
            raise ValueError("memory_nodes: at least one kernel memory node is needed")
        self.on_admit = on_admit  # (uid, allocation): the agent records it on the pod
        self.ledger = self._fresh_ledger()
        self.allocations: dict[str, Allocation] = {}  # pod uid -> its allocation
        self.pods: dict[str, Mapping[str, Any]] = {}  # pod uid -> the admitted Pod
        self.rejected: dict[str, tuple[str, str]] = {}  # pod uid -> (reason, message)
        self.shared: dict[str, str] = {}  # container id -> pod uid, in the shared pool
        self.exclusive: dict[str, str] = {}  # container id -> pod uid, own CPUs

    def _fresh_ledger(self) -> Ledger:
        ledger = engine.new_ledger(self.machine)
        if self.reserved:
            held = LedgerContainer(cpus=tuple(sorted(self.reserved)))
            ledger.allocate(RESERVED, "reserved", held, pod_name="reserved", namespace="")
        return ledger

    # -- views ----------------------------------------------------------------------------

    def pool(self) -> set[int]:
        held = {c for c, (uid, _) in self.ledger.cpu_owner.items() if uid != RESERVED}
        return set(self.machine.cpus) - held

    def mems_of(self, numa_nodes: Iterable[int]) -> str:
        """cpuset.mems for a view's NUMA nodes: the kernel memory nodes among them, or all
        kernel memory nodes when none of them is one."""
        real = set(numa_nodes) & self.memory_nodes
        return cpulist(real or self.memory_nodes)

    def shared_cpuset(self) -> CpuSet:
        return CpuSet(cpulist(self.pool()), cpulist(self.memory_nodes))

    def _shared_updates(self) -> dict[str, CpuSet]:
        cpuset = self.shared_cpuset()
        return {cid: cpuset for cid in self.shared}

    def _container_cpuset(self, uid: str, name: str) -> CpuSet | None:
        alloc = self.allocations.get(uid)
        held = alloc.containers.get(name) if alloc is not None else None
        if held is None or not held.cpus:
            return None
        zones = [int(z) for z, b in held.memory.items() if b] or list(held.numa_nodes or [])
        return CpuSet(cpulist(held.cpus), self.mems_of(zones))

    # -- the Placer protocol ----------------------------------------------------------------

    async def prepare(self, pod: Any) -> None:
        """Before a pod's first container: give the pod watch time to deliver the pod (a
        Kubernetes pod the lookup does not know yet would otherwise run unplaced)."""
        uid = str(pod.uid)
        if (self.wait_for is not None and uid not in self.allocations
                and uid not in self.rejected and self.lookup(uid) is None
                and not await self.wait_for(uid, self.wait_s)):
            log.info("NRI: pod %s/%s (%s) is unknown: its containers share the pool",
                     pod.namespace, pod.name, uid)

    def decide(self, uid: str, devices: Assigned | None = None) -> bool | None:
        """Admit the pod ``uid`` now, unless it is decided already or unknown (None): True
        when admitted, False when rejected. ``devices``: what the kubelet's device manager
        assigned to its containers (fixed hints)."""
        if uid in self.allocations or uid in self.rejected:
            return None
        view = self.lookup(uid)
        if view is None:
            return None
        try:
            self._admit(uid, view, devices)
        except Rejected:
            return False
        return True

    def set_machine(self, machine: Machine) -> None:
        """The node's machine changed (devices the kubelet reports): the ledger is rebuilt
        on it with every allocation held."""
        if machine == self.machine:
            return
        self.machine = machine
        self.ledger = self._fresh_ledger()
        for uid, alloc in list(self.allocations.items()):
            try:
                engine.commit(machine, self.ledger, uid, self.pods.get(uid) or {}, alloc)
            except (engine.RestoreConflict, LedgerError) as exc:
                log.warning("NRI: pod %s's allocation does not fit the node's new machine: "
                            "%s", uid, exc)

    def create(self, pod: Any, container: Any) -> Placement:
        uid = str(pod.uid)
        if uid in self.rejected:
            raise Rejected(": ".join(self.rejected[uid]))
        if uid not in self.allocations:
            view = self.lookup(uid)
            if view is not None:
                self._admit(uid, view)
        cpuset = self._container_cpuset(uid, str(container.name))
        if cpuset is None:
            self.shared[str(container.id)] = uid
            return Placement(self.shared_cpuset())
        self.exclusive[str(container.id)] = uid
        return Placement(cpuset, self._shared_updates())

    def _admit(self, uid: str, view: PodView, devices: Assigned | None = None) -> None:
        try:
            overrides = assigned_overrides(self.machine, devices) if devices else []
            result = engine.admit(self.machine, self.ledger, view.pod, view.resolved, uid,
                                  overrides)
        except TopologyError as exc:  # a pod no placement can ever satisfy
            result = engine.EngineResult(False, reason=REJECT_REASON, message=str(exc))
        if not result.admit or result.allocation is None:
            self.rejected[uid] = (result.reason or REJECT_REASON, result.message or "")
            why = ": ".join(self.rejected[uid])
            log.info("NRI: pod %s rejected: %s", uid, why)
            raise Rejected(why)
        self.allocations[uid] = result.allocation
        self.pods[uid] = view.pod
        if self.on_admit is not None:
            self.on_admit(uid, result.allocation)

    def released(self, pod: Any, container: Any | None) -> Mapping[str, CpuSet]:
        uid = str(pod.uid)
        if container is not None:  # its CPUs stay the pod's until the pod goes
            self.shared.pop(str(container.id), None)
            self.exclusive.pop(str(container.id), None)
            return {}
        self.rejected.pop(uid, None)
        for table in (self.shared, self.exclusive):
            for cid in [c for c, u in table.items() if u == uid]:
                del table[cid]
        self.pods.pop(uid, None)
        if self.allocations.pop(uid, None) is None:
            return {}
        before = self.pool()
        engine.release(self.ledger, uid)
        return self._shared_updates() if self.pool() != before else {}

    def synchronize(self, pods: list[Any], containers: list[Any]) -> Mapping[str, CpuSet]:
        """Rebuild from the runtime's state: each running pod's recorded allocation goes
        back in a fresh ledger (one that would take a CPU twice is refused and its
        containers join the shared pool); the shared containers get the pool, and each
        exclusive container its recorded cpuset again (the same for one that kept it; the
        right one for a container the runtime created while the plugin was away, say
        because the agent died in the middle of its creation)."""
        self.ledger = self._fresh_ledger()
        self.allocations.clear()
        self.pods.clear()
        self.rejected.clear()
        self.shared.clear()
        self.exclusive.clear()
        for pod in pods:
            uid = str(pod.uid)
            view = self.lookup(uid)
            if view is None or view.allocation is None:
                continue
            try:
                engine.commit(self.machine, self.ledger, uid, view.pod, view.allocation)
            except (engine.RestoreConflict, LedgerError) as exc:
                log.warning("NRI: pod %s's recorded allocation conflicts: %s", uid, exc)
                continue
            self.allocations[uid] = view.allocation
            self.pods[uid] = view.pod
        uid_of = {str(p.id): str(p.uid) for p in pods}
        own: dict[str, CpuSet] = {}
        for ctr in containers:
            owner = uid_of.get(str(ctr.pod_sandbox_id), str(ctr.pod_sandbox_id))
            cpuset = self._container_cpuset(owner, str(ctr.name))
            if cpuset is not None:
                self.exclusive[str(ctr.id)] = owner
                own[str(ctr.id)] = cpuset
            else:
                self.shared[str(ctr.id)] = owner
        return {**self._shared_updates(), **own}
