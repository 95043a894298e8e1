"""A numalign-managed real node: the agent places its containers through the runtime's NRI.

Started by the real-node agent when it is given the runtime's NRI socket
(``numalign agent --node NAME --nri-socket PATH``). It registers numalign's NRI plugin with
the runtime only while:

- the Node carries the label ``numalign.io/managed=nri`` (watched: the plugin registers
  when the label appears and disconnects when it goes; containers placed so far keep their
  cpusets), and
- the kubelet does not place containers itself: its configuration file must say
  ``cpuManagerPolicy: none``, ``topologyManagerPolicy: none`` and a memory manager policy
  other than ``Static`` (two placers would fight over the same cgroups); otherwise the agent
  refuses, with a log line and the NodeTopology status condition ``NRIPlacement``.

The condition ``NRIPlacement`` says which: ``True``/``Registered``, or ``False`` with reason
``NotManaged`` (no label), ``KubeletManagersOn`` (refused), ``RuntimeUnavailable`` (no
runtime on the socket yet) or ``Starting`` (the Node's labels, or the kubelet's devices, not
read yet: the pods' recorded allocations name those devices, so the plugin registers only
once the node's machine has them).

While registered, each pod bound to the node is decided once, at its first container:

- the engine admits it under its resolved policy and scope (:class:`PodIndex`: the pod's
  ``numalign.io/resolved``, else the node default of its NodeTopology spec), with the
  devices the kubelet's device manager assigned (PodResources) and the devices allocated
  to its ResourceClaims (DRA: read by name, mapped to NUMA nodes through the node's
  ResourceSlices, :mod:`numalign.agent.claimadmit`) as fixed hints (:mod:`.devices`),
  never on the kubelet's reserved CPUs;
- admitted: its ``numalign.io/allocation`` is written on the pod *before* the runtime gets
  the answer, so that an agent restarted mid-creation finds it (NRI synchronize and the
  pods' recorded allocations rebuild the ledger) and a retried creation is not decided
  again; when it cannot be written the creation fails (the kubelet retries);
- rejected: every container of the pod fails to be created, and the pod gets the kubelet's
  status (``Failed``, reason ``TopologyAffinityError``, the kubelet's message) and a Warning
  event; the kubelet then keeps the terminal phase and removes the pod's sandbox, and the
  operator redeploys the pod like any other rejection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numalign.agent import claimadmit
from numalign.agent.kubelet_config import KubeletConfig
from numalign.agent.kubelet_status import pod_event, rejected_status, scheduled_at
from numalign.agent.nri.devices import Assigned, asks_for_devices, assigned_of
from numalign.agent.nri.placer import EnginePlacer, cpulist
from numalign.agent.nri.plugin import CpuSet, NriPlugin, Placement, Rejected
from numalign.agent.nri.pods import PodIndex
from numalign.agent.podresources import PodResourcesClient, PodResourcesError, Snapshot
from numalign.agent.state import NodeState, PlacedPod
from numalign.api.draclaims import uses_claims
from numalign.api.kube import MERGE_PATCH, Kube, pod_path, q
from numalign.api.kube.listwatch import list_watch
from numalign.api.names import (
    ANN_REJECTION,
    LABEL_MANAGED,
    MANAGED_NRI,
    NRI_PLUGIN_NAME,
    REJECTED_PREFIX,
)
from numalign.api.nodetopology import (
    NRI_KUBELET_MANAGERS_ON,
    NRI_NOT_MANAGED,
    NRI_REGISTERED,
    NRI_RUNTIME_UNAVAILABLE,
    NRI_STARTING,
)
from numalign.api.reads import ObjectRead, labelled_nri
from numalign.topology.machine import Machine

log = logging.getLogger(__name__)

TERMINAL = ("Failed", "Succeeded")
MAX_REASSERTS = 5  # a rejection written again when the kubelet reverted it
RESTART_MIN_S = 0.5  # an ended plugin task is started again after this, doubling
RESTART_MAX_S = 8.0  # up to this while it keeps ending without registering



@dataclass(frozen=True)
class PlacementStatus:
    """The NodeTopology condition NRIPlacement."""

    active: bool
    reason: str
    message: str


def is_managed(node: Mapping[str, Any] | None) -> bool:
    """Whether a Node object says it is numalign-managed (``numalign.io/managed=nri``;
    the label :meth:`numalign.api.effective.NodeKind.of` reads too)."""
    return labelled_nri(ObjectRead.of(node).metadata.labels)


def refusal(config: KubeletConfig | None) -> str | None:
    """Why numalign must not place containers on a node whose kubelet does (None: it may)."""
    if config is None:
        return None
    on: list[str] = []
    if config.cpu_manager_policy != "none":
        on.append(f"cpuManagerPolicy {config.cpu_manager_policy}")
    if config.topology_manager_policy != "none":
        on.append(f"topologyManagerPolicy {config.topology_manager_policy}")
    if config.memory_manager_policy == "Static":
        on.append("memoryManagerPolicy Static")
    if not on:
        return None
    return (f"the kubelet places containers itself ({', '.join(on)}); numalign does not "
            "place them as well (two placers would fight): set cpuManagerPolicy none, "
            "topologyManagerPolicy none and memoryManagerPolicy None on a numalign-managed "
            "node")


def placement_status(labelled: bool | None, refused: str | None, connected: bool,
                     runtime: tuple[str, str] | None, socket_path: Path,
                     devices_known: bool = True) -> PlacementStatus:
    if labelled is None:
        return PlacementStatus(False, NRI_STARTING, "reading the Node's labels")
    if not labelled:
        return PlacementStatus(False, NRI_NOT_MANAGED,
                               f"the Node has no label {LABEL_MANAGED}={MANAGED_NRI}: the "
                               "kubelet places its containers, numalign does not register "
                               "with the runtime")
    if refused is not None:
        return PlacementStatus(False, NRI_KUBELET_MANAGERS_ON, refused)
    if not devices_known:
        return PlacementStatus(False, NRI_STARTING,
                               "waiting for the kubelet's devices (PodResources API): the "
                               "pods' recorded allocations name them")
    if not connected:
        return PlacementStatus(False, NRI_RUNTIME_UNAVAILABLE,
                               f"waiting for the container runtime's NRI socket {socket_path}")
    who = f"{runtime[0]} {runtime[1]}" if runtime else "the runtime"
    return PlacementStatus(True, NRI_REGISTERED,
                           f"numalign places this node's containers through the NRI of {who}")


def rejection_patch(pod: Mapping[str, Any], reason: str, message: str,
                    again: int = 0) -> dict[str, Any]:
    """The pod status patch of a rejection, as the kubelet writes it, with the uid as a
    precondition and ``numalign.io/rejection`` on the metadata (``again``: how many times
    it was written before). The metadata change is what makes a real kubelet sync the pod
    at once, finding the terminal phase on the API server -- which it then keeps
    (``generateAPIPodStatus``) and stops the pod; a status change alone lets its status
    manager write back the ``Pending`` it last generated first."""
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    note = reason if not again else f"{reason} (written again: {again})"
    return {"metadata": {"uid": uid, "annotations": {ANN_REJECTION: note}},
            "status": rejected_status(pod, reason, message, scheduled_at(pod))}


class ManagedNode:
    """The NRI side of a real node's agent; :meth:`run` until cancelled."""

    def __init__(self, kube: Kube, name: str, machine: Machine, socket_path: Path, *,
                 memory_nodes: set[int], pod_resources: PodResourcesClient | None = None,
                 on_change: Callable[[], None] = lambda: None,
                 on_snapshot: Callable[[Snapshot], Machine] | None = None,
                 plugin_index: str = "50", retry_s: float = 1.0, wait_s: float = 5.0,
                 poll_s: float = 2.0, state: NodeState | None = None) -> None:
        self.kube = kube
        self.name = name
        self.socket_path = socket_path
        self.index = PodIndex()
        self.placer = EnginePlacer(machine, self.index, memory_nodes=memory_nodes,
                                   wait_for=self.index.wait_for,
                                   wait_s=wait_s, name=name, state=state)
        self.plugin = NriPlugin(self, name=NRI_PLUGIN_NAME, index=plugin_index,
                                socket_path=socket_path, retry_s=retry_s)
        self.pod_resources = pod_resources
        self.on_snapshot = on_snapshot  # a PodResources reading -> the node's machine
        self.on_change = on_change  # the status (condition, admitted pods) changed
        self.poll_s = poll_s
        self.labelled: bool | None = None
        self.refused: str | None = None
        self.config: KubeletConfig | None = None
        self.pods_listed = asyncio.Event()  # the pod watch delivered its first list
        # the node's machine has the kubelet's devices (read once before registering, so
        # that the recorded allocations naming them go back into the ledger)
        self.devices_known = pod_resources is None
        self.recorded: set[str] = set()  # uids whose allocation is written on the pod
        self.reported: set[str] = set()  # uids whose rejection is written on the pod
        self.reasserted: dict[str, int] = {}  # uid -> rejections written again
        self._tasks: set[asyncio.Task[None]] = set()
        self.status = placement_status(None, None, False, None, socket_path)
        self._task: asyncio.Task[None] | None = None
        self._restart_s = 0.0  # the last backoff before starting an ended plugin again
        self._restart_at = 0.0  # (loop time) not before
        self._registrations_at_start = 0
        self._wake = asyncio.Event()

    # -- inputs -----------------------------------------------------------------------------

    def on_pod(self, typ: str, pod: Mapping[str, Any]) -> None:
        self.index.on_pod(typ, pod)
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        finished = str((pod.get("status") or {}).get("phase") or "") in TERMINAL
        if typ == "DELETED" or (finished and uid in self.placer.admitted):
            # deleted, or every container exited for good: its resources go back at once
            # (as the kubelet's CPU manager frees them), not when its sandbox goes
            updates = self.free(uid)
            if updates:
                self._background(self.plugin.update_quietly(updates))
        elif self._reasserts(pod):
            self._background(self._report(uid))

    def on_published(self, nodetopology: Mapping[str, Any] | None) -> None:
        """This agent's NodeTopology as it found it at start: the plugin's first
        synchronize restores the pods' allocations from its ``status.admitted``, which the
        node's state shows until then."""
        self.placer.show_published(nodetopology)

    def on_node_spec(self, spec: Mapping[str, Any] | None) -> None:
        self.index.on_node_spec(spec)

    def pods_synced(self) -> None:
        """The pod watch listed the node's pods: the plugin may register (NRI synchronize
        needs the pods' recorded allocations)."""
        if not self.pods_listed.is_set():
            self.pods_listed.set()
            self._wake.set()

    def kubelet_machine(self, machine: Machine) -> None:
        """The node's machine with the devices the kubelet reports (PodResources)."""
        self.placer.set_machine(machine)
        if not self.devices_known:
            self.devices_known = True
            self._wake.set()

    def on_node(self, node: Mapping[str, Any] | None) -> None:
        labelled = is_managed(node)
        if labelled != self.labelled:
            log.info("node %s: %s", self.name,
                     f"labelled {LABEL_MANAGED}={MANAGED_NRI}: numalign places its containers"
                     if labelled else f"no label {LABEL_MANAGED}={MANAGED_NRI}: numalign "
                     "does not place its containers")
        self.labelled = labelled
        self._wake.set()

    def set_config(self, config: KubeletConfig | None) -> None:
        """The kubelet's configuration (read again when its file changes): its reserved CPUs
        (taken at the next registration) and whether numalign may place at all."""
        self.config = config
        refused = refusal(config)
        if refused != self.refused and refused is not None:
            log.warning("node %s: not placing containers: %s", self.name, refused)
        self.refused = refused
        reserved = set(config.reserved_system_cpus) if config else set()
        unknown = reserved - set(self.placer.machine.cpus)
        if unknown:
            log.warning("node %s: reservedSystemCPUs %s are not CPUs of this machine; "
                        "ignored", self.name, cpulist(unknown))
            reserved -= unknown
        self.placer.reserved = reserved
        self._wake.set()

    # -- the Placer the plugin calls ----------------------------------------------------------

    def synchronize(self, pods: list[Any], containers: list[Any]) -> Mapping[str, CpuSet]:
        updates = self.placer.synchronize(pods, containers)
        self.recorded = set(self.placer.admitted)
        self.on_change()
        return updates

    async def prepare(self, pod: Any) -> None:
        uid = str(pod.uid)
        await self.placer.prepare(pod)
        view = self.index(uid)
        status = (view.pod.get("status") or {}) if view is not None else {}
        phase = str(status.get("phase") or "")
        if phase in TERMINAL and uid not in self.placer.admitted \
                and uid not in self.placer.rejected:
            # failed (rejected before this agent started, say) or done: never started again
            why = f"{status.get('reason')}: {status.get('message')}" \
                if status.get("reason") else f"numalign: pod {pod.namespace}/{pod.name} is {phase}"
            raise Rejected(why)
        if view is not None and uid not in self.placer.state.decided:
            devices = await self._devices(view.pod) if asks_for_devices(view.pod) else None
            claims = await self._claims(view.pod) if uses_claims(view.pod) else None
            if self.placer.decide(uid, devices, claims) is not None:
                self.on_change()
        if uid in self.placer.admitted and uid not in self.recorded:
            await self._record(uid)
        if uid in self.placer.rejected and uid not in self.reported:
            await self._report(uid)

    def create(self, pod: Any, container: Any) -> Placement:
        return self.placer.create(pod, container)

    def released(self, pod: Any, container: Any | None) -> Mapping[str, CpuSet]:
        if container is None:  # the pod's sandbox is gone
            return self.free(str(pod.uid))
        return self.placer.released(pod, container)

    def free(self, uid: str) -> Mapping[str, CpuSet]:
        """The one path that gives a pod's resources back and forgets it (deleted,
        finished, or its sandbox gone): the shared containers' new cpusets."""
        updates = self.placer.free(uid)
        self.recorded.discard(uid)
        self.reported.discard(uid)
        self.reasserted.pop(uid, None)
        self.on_change()
        return updates

    # -- the pod's records ----------------------------------------------------------------------

    async def _devices(self, pod: Mapping[str, Any]) -> Assigned | None:
        """What the kubelet's device manager assigned to ``pod`` (PodResources), the node's
        machine updated with the devices the kubelet reports."""
        if self.pod_resources is None:
            return None
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        try:
            snap = await self.pod_resources.snapshot()
        except PodResourcesError as exc:
            raise Rejected(f"numalign: cannot read the devices the kubelet assigned to pod "
                           f"{key[0]}/{key[1]}: {exc}") from None
        if self.on_snapshot is not None:
            self.kubelet_machine(self.on_snapshot(snap))
        for kp in snap.pods:
            if (kp.namespace, kp.name) == key:
                return assigned_of(kp)
        return None

    async def _claims(self, pod: Mapping[str, Any]) -> claimadmit.Verdict:
        """The devices of the pod's ResourceClaims (the kubelet prepared them before the
        sandbox, so they are allocated), or why they cannot be read."""
        v = await claimadmit.verdict(self.kube, self.placer.state, pod, wait=self.placer.wait_s)
        if v.warning:
            meta = pod.get("metadata") or {}
            log.warning("pod %s/%s: %s", meta.get("namespace"), meta.get("name"), v.warning)
        return v

    async def _record(self, uid: str) -> None:
        held = self.placer.admitted[uid]
        alloc, pod = held.allocation, held.pod
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        try:
            await self.kube.patch(pod_path(ns, name, "status"),
                                  alloc.pod_patch(uid), MERGE_PATCH,
                                  decode=False)
        except Exception as exc:
            # not recorded, not answered (an API error or connection trouble): the creation
            # fails and the kubelet retries it (the decision is kept: the same answer again)
            raise Rejected(f"numalign: cannot record the allocation of pod {ns}/{name}: "
                           f"{type(exc).__name__}: {exc}") from None
        self.recorded.add(uid)

    async def _report(self, uid: str) -> None:
        view = self.index(uid)
        if view is None:
            return
        pod = view.pod
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        reason, message = self.placer.rejected.get(uid, ("", ""))
        if not reason:
            return
        try:
            await self.kube.patch(pod_path(ns, name, "status"),
                                  rejection_patch(pod, reason, message,
                                                  self.reasserted.get(uid, 0)), MERGE_PATCH,
                                  decode=False)
        except Exception as exc:
            # the creation fails all the same; the next container's creation tries again
            log.warning("pod %s/%s: rejection status write failed: %s", ns, name, exc)
            return
        self.reported.add(uid)
        if self.reasserted.get(uid, 0):
            return  # its event is posted already
        try:
            await self.kube.create(f"/api/v1/namespaces/{q(ns)}/events",
                                   pod_event(pod, self.name, "Warning", reason,
                                             message.removeprefix(REJECTED_PREFIX)))
        except Exception as exc:  # events are best effort
            log.warning("pod %s/%s: event: %s", ns, name, exc)

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` on the loop, keeping a reference until it ends (watch callbacks are
        synchronous)."""
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop: nothing to write with
            coro.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _reasserts(self, pod: Mapping[str, Any]) -> bool:
        """Whether ``pod``, rejected and reported, shows a non-terminal phase again (the
        kubelet's status manager won the race): its rejection is written once more, a
        bounded number of times."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if uid not in self.reported or uid not in self.placer.rejected:
            return False
        if str((pod.get("status") or {}).get("phase") or "") in TERMINAL:
            return False
        n = self.reasserted.get(uid, 0)
        if n >= MAX_REASSERTS:
            return False
        self.reasserted[uid] = n + 1
        self.reported.discard(uid)
        return True

    # -- what NodeTopology status shows ------------------------------------------------------

    def admitted(self) -> dict[str, PlacedPod]:
        """The pods numalign placed, with what their containers' cgroups got (the node's
        state: the agent publishes them from there). Until the plugin's first synchronize,
        what the status said when this agent started: the next restart must find it there,
        not an empty list."""
        return dict(self.placer.admitted)

    # -- running --------------------------------------------------------------------------------

    def _update_status(self) -> None:
        connected = self.plugin._client is not None and self.plugin.synchronized.is_set()
        status = placement_status(self.labelled, self.refused, connected,
                                  self.plugin.runtime, self.socket_path, self.devices_known)
        if status != self.status:
            self.status = status
            self.on_change()

    async def _watch_node(self) -> None:
        await list_watch(self.kube, "/api/v1/nodes",
                         lambda items: self.on_node(items[0] if items else None),
                         lambda typ, obj: self.on_node(None if typ == "DELETED" else obj),
                         params={"fieldSelector": f"metadata.name={self.name}"},
                         max_retry=30.0)

    async def _stop_plugin(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # ended already
                await task

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The plugin's task ended by itself (it should not): start it again after a
        backoff, doubled each time it ends before registering once more."""
        if task is not self._task:
            return
        self._task = None
        why = "cancelled" if task.cancelled() else (
            f"{type(task.exception()).__name__}: {task.exception()}"
            if task.exception() is not None else "it returned")
        registered = self.plugin.registrations > self._registrations_at_start
        self._restart_s = RESTART_MIN_S if registered else min(
            RESTART_MAX_S, self._restart_s * 2 if self._restart_s else RESTART_MIN_S)
        self._restart_at = asyncio.get_running_loop().time() + self._restart_s
        log.warning("node %s: numalign's NRI plugin stopped (%s); starting it again in "
                    "%.1fs", self.name, why, self._restart_s)
        self._wake.set()

    async def run(self) -> None:
        watcher = asyncio.create_task(self._watch_node(), name="nri-node")
        loop = asyncio.get_running_loop()
        try:
            while True:
                want = bool(self.labelled) and self.refused is None \
                    and self.pods_listed.is_set() and self.devices_known
                wait = self.poll_s
                if want and self._task is None and loop.time() < self._restart_at:
                    wait = min(wait, self._restart_at - loop.time())
                elif want and self._task is None:
                    log.info("node %s: registering numalign's NRI plugin on %s", self.name,
                             self.socket_path)
                    self._registrations_at_start = self.plugin.registrations
                    self._task = asyncio.create_task(self.plugin.run(), name="nri-plugin")
                    self._task.add_done_callback(self._ended)
                elif not want and self._task is not None:
                    log.info("node %s: disconnecting numalign's NRI plugin (%s)", self.name,
                             "refused" if self.refused else "not managed")
                    await self._stop_plugin()
                self._update_status()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait)
                self._wake.clear()
        finally:
            watcher.cancel()
            await self._stop_plugin()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
