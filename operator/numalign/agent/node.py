"""The agent on a real node: discover the machine, publish its NodeTopology status and
acknowledge the node default policy the operator pushes. A real kubelet admits the pods
there, so this agent holds no allocations of its own: given the kubelet's pod-resources
socket (and its configuration file), it reports the kubelet's, as the PodResources API
says them (agent/kubelet_view.py), refreshed on every event of a pod bound to the node and
every ``refresh`` seconds; when the socket cannot be read it says so (status condition
Ready False, ``status.kubelet.podResources``, a log line) and retries with backoff.

Given the runtime's NRI socket (``nri_socket``), on a node labelled
``numalign.io/managed=nri`` numalign places the containers instead (agent/nri/managed.py):
``status.admitted`` then shows numalign's decisions, with the condition NRIPlacement. The
node has one state (:attr:`NodeAgent.state`): the NRI placer decides in it and rebuilds it
after a restart, and the status, NodeResourceTopology and ``/metrics`` read it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from numalign.api.dra import NodeDraDevices
from numalign.api.kube import JSON, NT_BASE, ApiError, Kube, q
from numalign.api.kube.listwatch import list_watch
from numalign.api.names import LABEL_MACHINE, REJECT_REASON
from numalign.topology.errors import TopologyError
from numalign.topology.machine import Machine

from .dra import DraDevices, pci_topology
from .kubelet_config import KubeletConfig, load_kubelet_config
from .kubelet_view import apply_snapshot, kubelet_settings, machine_with_devices
from .lease import NodeLease
from .nrt import NrtOptions
from .podresources import PodResourcesClient, PodResourcesError
from .publish import Publisher
from .state import NodeState

if TYPE_CHECKING:
    from .nri.managed import ManagedNode

log = logging.getLogger(__name__)


def discover_machine(name: str, root: str = "/") -> Machine:
    """The machine under ``root`` (sysfs, and nvidia-smi on a live node)."""
    from numalign.agent import discovery

    dm = discovery.discover(root)
    for w in getattr(dm, "warnings", []) or []:
        log.warning("discovery: %s", w)
    return discovery.to_machine(dm, name, description=f"discovered on {name}")


class NodeAgent:
    def __init__(self, kube: Kube, name: str, machine: Machine, *,
                 resync: float = 300.0, publish_nrt: bool = False,
                 nrt_options: NrtOptions | None = None,
                 pod_resources: str | None = None, kubelet_config: str | None = None,
                 refresh: float = 10.0, debounce: float = 0.3,
                 max_backoff: float = 60.0, lease: NodeLease | None = None,
                 nri_socket: str | None = None, dra: bool = True,
                 sysfs_root: str = "/") -> None:
        self.kube = kube
        self.lease = lease
        self.base_machine = machine
        self.state = NodeState(name, machine, admits=False)
        self.states = {name: self.state}
        self.node_uid: str | None = None
        self.publisher = Publisher(kube, self.states,
                                   labels=lambda st: {LABEL_MACHINE: st.machine.name},
                                   nrt=publish_nrt, nrt_options=nrt_options,
                                   node_uid=lambda _: self.node_uid,
                                   preconditions=True)
        self.resync = resync
        self.dra = DraDevices(kube, name, [n.id for n in machine.numa_nodes],
                              pci_topology(sysfs_root), self._on_dra) if dra else None
        self.client = PodResourcesClient(pod_resources) if pod_resources else None
        self.kubelet_config_path = kubelet_config
        self.config: KubeletConfig | None = None
        self._config_mtime: float | None = None
        self._config_problem: str | None = None
        self.refresh_interval = refresh
        self.debounce = debounce
        self.max_backoff = max_backoff
        self.uids: dict[tuple[str, str], str] = {}
        self.rejected: set[str] = set()  # pods the kubelet failed with TopologyAffinityError
        self._rejected_before = 0
        self._wake = asyncio.Event()
        self._problem: str | None = None
        self.refreshes = 0
        self._seen_version = -1  # the state's version at the last refresh
        # with the runtime's NRI socket: numalign places containers when the node says so
        self.managed: ManagedNode | None = None
        if nri_socket:
            from .nri.managed import ManagedNode
            from .nri.placer import kernel_memory_nodes

            # cpuset.mems: the memory nodes of the kernel the cgroups belong to (the agent's
            # own /sys), not those of a view laid over it at --root
            self.managed = ManagedNode(
                kube, name, machine, Path(nri_socket), memory_nodes=kernel_memory_nodes(),
                pod_resources=self.client, on_change=self.wake, state=self.state,
                on_snapshot=lambda snap: machine_with_devices(self.base_machine,
                                                              snap.allocatable.devices))

    # -- the kubelet's view (PodResources, configuration) ---------------------------

    def _read_config(self) -> None:
        path = self.kubelet_config_path
        if path is None:
            return
        try:
            mtime: float | None = os.stat(path).st_mtime
        except OSError:
            mtime = None
        if mtime is not None and mtime == self._config_mtime:
            return
        try:
            config = load_kubelet_config(path)
        except TopologyError as e:
            problem = f"kubelet configuration: {e}"
            if problem != self._config_problem:
                log.warning("node %s: %s; keeping the last one read", self.state.name, problem)
            self._config_problem = problem
            return
        if config != self.config:
            if self.managed is not None:
                self.managed.set_config(config)
            log.info("node %s: kubelet topologyManagerPolicy %s, scope %s, cpuManagerPolicy %s",
                     self.state.name, config.topology_manager_policy,
                     config.topology_manager_scope, config.cpu_manager_policy)
        self.config = config
        self._config_mtime = mtime
        self._config_problem = None

    async def refresh(self) -> bool:
        """Read the kubelet's configuration and allocations once and mark the status for
        writing when they changed; False when the PodResources API could not be read."""
        managed = self.managed
        if self.client is None and managed is None:
            return True
        self._read_config()
        st = self.state
        problem: str | None = None
        changed = False
        if self.client is not None:
            try:
                snap = await self.client.snapshot()
                # a numalign-managed node: the state holds the pods numalign placed (its NRI
                # placer decides in it), not the kubelet's
                changed = apply_snapshot(st, self.base_machine, snap, self.config, self.uids,
                                         managed is not None)
                if managed is not None:  # the devices the kubelet reports, for the engine
                    managed.kubelet_machine(st.machine)
            except PodResourcesError as e:
                problem = str(e)
            except Exception as e:  # a bad answer must not stop the agent
                problem = (f"{self.client.socket}: cannot use the answer: "
                           f"{type(e).__name__}: {e}")
        if managed is not None:
            # the placer's decisions (and releases) since the last reading
            changed = changed or st.version != self._seen_version
            s = managed.status
            placement = (s.active, s.reason, s.message)
            if placement != st.placement:
                st.placement = placement
                st.version += 1
                changed = True
        self.refreshes += 1
        if problem != self._problem:
            if problem is not None:
                log.warning("node %s: PodResources: %s; retrying with backoff", st.name, problem)
            elif self._problem is not None:
                log.info("node %s: PodResources readable again", st.name)
            self._problem = problem
        settings = kubelet_settings(self.config, problem)
        ready = problem is None
        if problem is not None:
            message = f"the agent cannot read the kubelet's allocations: {problem}"
        elif managed is not None and managed.status.active:
            message = ("the agent publishes this node's topology and places its containers "
                       "(NRI)")
        elif self.client is None:
            message = "the agent publishes this node's topology"
        else:
            message = ("the agent publishes this node's topology and the kubelet's "
                       "allocations (PodResources)")
        if self._config_problem:
            message += f"; {self._config_problem}"
        # the pods the kubelet failed with TopologyAffinityError, and those numalign rejected
        rejected = max(self._rejected_before, len(self.rejected | set(st.rejections)))
        if (settings, ready, message, rejected) != (st.kubelet, st.ready, st.ready_message,
                                                    st.rejected_total):
            st.kubelet, st.ready, st.ready_message = settings, ready, message
            st.rejected_total = rejected
            st.version += 1
            changed = True
        if changed:
            self.publisher.mark(st.name)
        self._seen_version = st.version
        return ready

    def wake(self) -> None:
        self._wake.set()

    async def _refresh_loop(self) -> None:
        backoff = 1.0
        delay = self.refresh_interval
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)
            self._wake.clear()
            await asyncio.sleep(self.debounce)  # one reading for a burst of pod events
            self._wake.clear()
            if await self.refresh():
                backoff, delay = 1.0, self.refresh_interval
            else:
                delay = backoff
                backoff = min(self.max_backoff, backoff * 2)

    def on_pod(self, typ: str, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        uid = str(meta.get("uid") or "")
        if typ == "DELETED":
            if self.uids.get(key) == uid:
                del self.uids[key]
            changed = self.state.untrack(uid)
        else:
            self.uids[key] = uid
            status = pod.get("status") or {}
            if status.get("phase") == "Failed" and status.get("reason") == REJECT_REASON:
                self.rejected.add(uid)
            changed = self.state.track(pod)
        if changed and self.publisher.nrt:  # the NodeResourceTopology's pod fingerprint
            self.publisher.mark(self.state.name)
        if self.managed is not None:
            self.managed.on_pod(typ, pod)
        self.wake()

    async def _watch_pods(self) -> None:
        await list_watch(self.kube, "/api/v1/pods", self._listed_pods, self.on_pod,
                         params={"fieldSelector": f"spec.nodeName={self.state.name}"},
                         max_retry=self.max_backoff)

    def _listed_pods(self, items: list[JSON]) -> None:
        """A full listing of the node's pods: the ones gone meanwhile are gone."""
        self.uids.clear()
        if self.managed is not None:  # pods deleted while not watching are gone
            self.managed.index.pods.clear()
        for pod in items:
            self.on_pod("ADDED", pod)
        alive = {str((p.get("metadata") or {}).get("uid") or "") for p in items}
        for gone in [u for u in self.state.pods if u not in alive]:
            self.state.untrack(gone)
        if self.managed is not None:
            self.managed.pods_synced()

    def _listed_nodetopology(self, items: list[JSON]) -> None:
        for o in items:
            self.on_nodetopology("MODIFIED", o)

    def on_nodetopology(self, typ: str, obj: Mapping[str, Any]) -> None:
        if typ == "DELETED":
            self.publisher.mark(self.state.name)
            return
        if self.managed is not None:
            self.managed.on_node_spec(obj.get("spec"))
        if self.state.set_spec(obj.get("spec")):
            self.publisher.mark(self.state.name)

    async def run(self) -> None:
        await self.kube.open()
        if self.lease is None:
            await self._run()
            return
        # One agent per node: publish only while holding the node's Lease.
        await self.lease.acquire()
        keeper = asyncio.create_task(self.lease.keep(), name="lease")
        main = asyncio.create_task(self._run(), name="publish")
        lost = False
        try:
            done, _ = await asyncio.wait([keeper, main], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                lost = lost or t is keeper
                t.result()  # LeaseLost: stop publishing (the pod restarts and stands by)
        finally:
            for t in (keeper, main):
                t.cancel()
            await asyncio.gather(keeper, main, return_exceptions=True)
            if not lost:  # a clean stop: the node's next agent need not wait
                await asyncio.shield(self.lease.release())

    async def _run(self) -> None:
        name = self.state.name
        if self.publisher.nrt:
            try:  # the Node owns its NodeResourceTopology (garbage-collected with it)
                node = await self.kube.get(f"/api/v1/nodes/{q(name)}")
                self.node_uid = str((node.get("metadata") or {}).get("uid") or "") or None
            except ApiError as e:
                log.warning("node %s: %s; its NodeResourceTopology gets no owner", name, e)
        selector = {"fieldSelector": f"metadata.name={name}"}
        items, rv = await self.kube.list_all(NT_BASE, selector)
        existing = items[0] if items else None
        await self.publisher.ensure(name, existing)
        if existing is not None:
            self.state.restore(existing, [])
            self._rejected_before = self.state.rejected_total
        tasks = [asyncio.create_task(self._tick())]
        watching = self.client is not None or self.managed is not None
        if self.managed is not None:
            self.managed.on_node_spec((existing or {}).get("spec"))
            self.managed.on_published(existing)  # what it placed before: restored first
            if self.kubelet_config_path is None:
                log.warning("node %s: no --kubelet-config: numalign cannot check that the "
                            "kubelet's CPU, memory and Topology managers are off, nor avoid "
                            "its reserved CPUs", name)
            self._read_config()
            self.managed.set_config(self.config)
        if watching:
            tasks.append(asyncio.create_task(self._watch_pods()))
            await self.refresh()
        self.publisher.mark(name)
        await self.publisher.flush()
        tasks.append(asyncio.create_task(self.publisher.run()))
        if watching:
            tasks.append(asyncio.create_task(self._refresh_loop()))
        if self.managed is not None:
            tasks.append(asyncio.create_task(self.managed.run(), name="nri"))
        if self.dra is not None:
            tasks.append(asyncio.create_task(self.dra.run(), name="dra"))
        try:
            await list_watch(self.kube, NT_BASE, self._listed_nodetopology,
                             self.on_nodetopology, params=selector, since=rv)
        finally:
            for t in tasks:
                t.cancel()
            if self.client is not None:
                await self.client.close()

    def _on_dra(self, devices: NodeDraDevices) -> None:
        self.state.dra = devices
        self.publisher.mark(self.state.name)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.resync)
            self.publisher.mark(self.state.name)
