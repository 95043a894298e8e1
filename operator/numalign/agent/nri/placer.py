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

The decisions and the ledger are the node's :class:`~numalign.agent.state.NodeState`, as on
an emulated node (one decide, release and restore): on a real node the agent's own
(``state``), which its status, NodeResourceTopology and metrics read; the placer keeps
beside it only which container runs where (container id -> pod uid, exclusive or shared).
Pods are looked up by uid (:class:`PodView`: the pod as Kubernetes has it and its resolved
policy); a container of a pod the lookup does not know (not from Kubernetes) runs in the
shared pool.
:meth:`EnginePlacer.free` is the one path that gives a pod's resources back (deleted,
finished, or its sandbox gone). After a (re)connection, :meth:`EnginePlacer.synchronize`
rebuilds the state with :meth:`NodeState.restore <numalign.agent.state.NodeState.restore>`
from the pods the runtime still runs: what this agent decided first (its own decisions
before a reconnection, else its published NodeTopology status, :attr:`EnginePlacer.published`),
a pod's recorded allocation only for pods those lack and only when it matches the pod. Until
then the state shows what that status says (:meth:`EnginePlacer.show_published`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numalign.agent.claimadmit import UNREADY_REASON, Verdict
from numalign.agent.nri.devices import Assigned, assigned_kinds
from numalign.agent.nri.plugin import CpuSet, Placement, Rejected
from numalign.agent.state import NodeState, PlacedPod, published_pods
from numalign.api.allocation import Allocation
from numalign.api.effective import EffectivePolicy
from numalign.api.names import REJECT_REASON
from numalign.api.nodestatus import RESERVED_UID
from numalign.topology import quantity
from numalign.topology.errors import TopologyError
from numalign.topology.ledger import Ledger
from numalign.topology.machine import Machine
from numalign.topology.quantity import format_cpulist

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class PodView:
    pod: Mapping[str, Any]  # the Pod as the API server has it
    policy: EffectivePolicy  # the policy it gets here (numalign.api.effective)


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
                 wait_s: float = 5.0, name: str = "", state: NodeState | None = None) -> None:
        self.lookup = lookup
        self.wait_for = wait_for
        self.wait_s = wait_s
        reserved = set(reserved_cpus)
        unknown = reserved - set(machine.cpus)
        if unknown:
            raise ValueError(f"reserved_cpus: {cpulist(unknown)} not in machine "
                             f"{machine.name}")
        self.memory_nodes = set(memory_nodes)
        if not self.memory_nodes:
            raise ValueError("memory_nodes: at least one kernel memory node is needed")
        self.on_admit = on_admit  # (uid, allocation): the agent records it on the pod
        if state is None:
            state = NodeState(name or machine.name, machine, reserved=reserved)
        else:  # the node's one state (the agent's), on this machine, deciding nothing yet
            state.set_machine(machine)
            if reserved != state.reserved:
                state.reserved = reserved
                state.reset()
        self.state = state
        # the agent's NodeTopology as it found it at start: what the first synchronize
        # restores from (later ones from what this placer decided since)
        self.published: Mapping[str, Any] | None = None
        self._synchronized = False
        self.shared: dict[str, str] = {}  # container id -> pod uid, in the shared pool
        self.exclusive: dict[str, str] = {}  # container id -> pod uid, own CPUs

    # -- the node state -------------------------------------------------------------------

    @property
    def machine(self) -> Machine:
        return self.state.machine

    @property
    def ledger(self) -> Ledger:
        return self.state.ledger

    @property
    def reserved(self) -> set[int]:
        return self.state.reserved

    @reserved.setter
    def reserved(self, cpus: set[int]) -> None:
        """Taken at the next synchronize (a fresh ledger)."""
        self.state.reserved = set(cpus)

    @property
    def admitted(self) -> dict[str, PlacedPod]:
        return self.state.admitted

    @property
    def synchronized(self) -> bool:
        """Whether the runtime's state was taken once (the state is this placer's own)."""
        return self._synchronized

    @property
    def allocations(self) -> dict[str, Allocation]:
        """Pod uid -> its allocation, for every admitted pod."""
        return {uid: held.allocation for uid, held in self.state.admitted.items()}

    @property
    def rejected(self) -> dict[str, tuple[str, str]]:
        """Pod uid -> (reason, message), for every rejected pod."""
        return self.state.rejections

    def set_machine(self, machine: Machine) -> None:
        """The node's machine changed (devices the kubelet reports)."""
        self.state.set_machine(machine)

    def show_published(self, published: Mapping[str, Any] | None) -> None:
        """The agent's NodeTopology as it found it at start: what the first synchronize
        restores from; until then the state shows the pods its ``status.admitted`` lists,
        their allocations held (a restarted agent publishes them again, not an empty list
        that a second restart would find)."""
        self.published = published
        if not self._synchronized:
            self.state.show(published_pods(self.state.name, published))

    # -- views ----------------------------------------------------------------------------

    def pool(self) -> set[int]:
        held = {c for c, (uid, _) in self.ledger.cpu_owner.items() if uid != RESERVED_UID}
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
        held = self.state.admitted.get(uid)
        ca = held.allocation.containers.get(name) if held is not None else None
        if ca is None or not ca.cpus:
            return None
        zones = [int(z) for z, b in ca.memory.items() if b] or list(ca.numa_nodes or [])
        return CpuSet(cpulist(ca.cpus), self.mems_of(zones))

    # -- the Placer protocol ----------------------------------------------------------------

    async def prepare(self, pod: Any) -> None:
        """Before a pod's first container: give the pod watch time to deliver the pod (a
        Kubernetes pod the lookup does not know yet would otherwise run unplaced)."""
        uid = str(pod.uid)
        if (self.wait_for is not None and uid not in self.state.decided
                and self.lookup(uid) is None
                and not await self.wait_for(uid, self.wait_s)):
            log.info("NRI: pod %s/%s (%s) is unknown: its containers share the pool",
                     pod.namespace, pod.name, uid)

    def decide(self, uid: str, devices: Assigned | None = None,
               claims: Verdict | None = None) -> bool | None:
        """Admit the pod ``uid`` now, unless it is decided already or unknown (None): True
        when admitted, False when rejected. ``devices``: what the kubelet's device manager
        assigned to its containers (fixed hints); ``claims``: its ResourceClaims' devices
        (the ``dra`` kind's fixed hints), or why they cannot be read."""
        if uid in self.state.decided:
            return None
        view = self.lookup(uid)
        if view is None:
            return None
        try:
            kinds = assigned_kinds(self.machine, devices) if devices else []
            if claims is not None and claims.refusal is not None:
                decision = self.state.refuse(view.pod, UNREADY_REASON, claims.refusal,
                                             view.policy.resolved)
            else:
                kinds += claims.kinds if claims is not None else []
                decision = self.state.decide(view.pod, view.policy, kinds)
        except TopologyError as exc:  # a pod no placement can ever satisfy
            decision = self.state.refuse(view.pod, REJECT_REASON, str(exc),
                                           view.policy.resolved)
        if not decision.admit or decision.allocation is None:
            log.info("NRI: pod %s rejected: %s: %s", uid, decision.reason, decision.message)
            return False
        if self.on_admit is not None:
            self.on_admit(uid, decision.allocation)
        return True

    def create(self, pod: Any, container: Any) -> Placement:
        uid = str(pod.uid)
        self.decide(uid)
        if uid in self.state.rejections:
            raise Rejected(": ".join(self.state.rejections[uid]))
        cpuset = self._container_cpuset(uid, str(container.name))
        if cpuset is None:
            self.shared[str(container.id)] = uid
            return Placement(self.shared_cpuset())
        self.exclusive[str(container.id)] = uid
        return Placement(cpuset, self._shared_updates())

    def released(self, pod: Any, container: Any | None) -> Mapping[str, CpuSet]:
        if container is not None:  # its CPUs stay the pod's until the pod goes
            self.shared.pop(str(container.id), None)
            self.exclusive.pop(str(container.id), None)
            return {}
        return self.free(str(pod.uid))

    def free(self, uid: str) -> dict[str, CpuSet]:
        """The one path that gives a pod's resources back (deleted, finished, or its
        sandbox gone): the new cpusets of the shared containers (none if nothing changed)."""
        for table in (self.shared, self.exclusive):
            for cid in [c for c, u in table.items() if u == uid]:
                del table[cid]
        before = self.pool()
        self.state.release(uid)
        return self._shared_updates() if self.pool() != before else {}

    def synchronize(self, pods: list[Any], containers: list[Any]) -> Mapping[str, CpuSet]:
        """Rebuild from the runtime's state (:meth:`NodeState.restore
        <numalign.agent.state.NodeState.restore>` of the pods it runs; a record refused is
        logged and its pod's containers join the shared pool); the shared containers get
        the pool, and each exclusive container its recorded cpuset again (the same for one
        that kept it; the right one for a container the runtime created while the plugin
        was away, say because the agent died in the middle of its creation)."""
        # decided by this process: believed first (before the first synchronize, the state
        # shows what it published: restored from that instead)
        own = dict(self.state.admitted) if self._synchronized else {}
        published = None if self._synchronized else self.published
        self.state.reset()
        self.shared.clear()
        self.exclusive.clear()
        running = [view.pod for p in pods if (view := self.lookup(str(p.uid))) is not None]
        report = self.state.restore(published, running, own)
        recorded = {str(e.get("uid")) for e in ((published or {}).get("status") or {}).get(
            "admitted") or [] if isinstance(e, Mapping)}
        for uid in report.restored:  # from the pod's own record: its policy as resolved now
            view = self.lookup(uid)
            if uid not in own and uid not in recorded and view is not None:
                self.state.admitted[uid].resolved = view.policy.resolved
        self._synchronized, self.published = True, None
        if report.restored or report.refused or report.dropped:
            log.info("NRI: synchronized: %d pods restored, %d refused, %d gone",
                     len(report.restored), len(report.refused), len(report.dropped))
        uid_of = {str(p.id): str(p.uid) for p in pods}
        own_cpus: dict[str, CpuSet] = {}
        for ctr in containers:
            owner = uid_of.get(str(ctr.pod_sandbox_id), str(ctr.pod_sandbox_id))
            cpuset = self._container_cpuset(owner, str(ctr.name))
            if cpuset is not None:
                self.exclusive[str(ctr.id)] = owner
                own_cpus[str(ctr.id)] = cpuset
            else:
                self.shared[str(ctr.id)] = owner
        return {**self._shared_updates(), **own_cpus}
