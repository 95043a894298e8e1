"""Emulated nodes: many kubelets in one asyncio process, one pod watch for all.

Each node registers its Node (capacity from a machine file) and keeps it Ready, admits
the pods bound to it (Running with ``numalign.io/allocation``, or Failed with the
kubelet's reason and a Warning event), releases them on deletion and publishes its
NodeTopology status, coalesced. Pod status writes have the client's connection pool to
themselves; the other writes share a small pool (``background_connections``) and
NodeTopology writes are spaced out while decisions are made. NodeTopologies are watched
as metadata only; one is read when its spec changed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from numalign.api.allocation import Allocation
from numalign.api.dra import NodeDraDevices
from numalign.api.draclaims import uses_claims
from numalign.api.effective import NodeKind, NodePolicy, effective_policy
from numalign.api.kube import MERGE_PATCH, NT_BASE, ApiError, Kube, nt_path, pod_path, q
from numalign.api.kube.listwatch import list_watch
from numalign.api.names import (
    EVENT_INVALID_POLICY,
    LABEL_MACHINE,
    REJECT_REASON,
    REJECTED_PREFIX,
    TOPOLOGY_MESSAGE,
)
from numalign.topology.admit import ProviderKind
from numalign.topology.machine import Machine

from . import claimadmit
from .dra import FleetDraDevices
from .draslices import publish_slices, without_devices
from .kubelet_status import (
    lease_object,
    node_addresses,
    node_object,
    node_status,
    pod_event,
    rejected_status,
    running_status,
    scheduled_at,
)
from .nrt import NrtOptions
from .podips import PodIps
from .publish import Publisher
from .state import NodeState, pod_uid

log = logging.getLogger(__name__)

JSON = dict[str, Any]

POD_SELECTOR = "spec.nodeName!="
INVALID_POLICY_REASON = EVENT_INVALID_POLICY


@dataclass
class Stats:
    admitted: int = 0
    rejected: int = 0
    released: int = 0
    restored: int = 0
    write_errors: int = 0
    latencies: list[float] = field(default_factory=list)  # seen bound -> decision written


@dataclass
class NodeSpec:
    name: str
    machine: Machine
    source: str = ""


def expand(machines: Sequence[tuple[Machine, int]], start: int = 0) -> list[NodeSpec]:
    """Node names ``<machine name>-<i>`` for every (machine, count)."""
    out: list[NodeSpec] = []
    for machine, count in machines:
        for i in range(count):
            out.append(NodeSpec(f"{machine.name}-{start + i}", machine))
    return out


class Emulator(claimadmit.ClaimAdmission):
    def __init__(self, kube: Kube, nodes: Sequence[NodeSpec], *,
                 lease_interval: float = 10.0, status_interval: float = 60.0,
                 publish_delay: float = 0.2, publish_interval: float = 1.0,
                 concurrency: int = 96, index_offset: int = 0,
                 publish_nrt: bool = False, background_connections: int = 4,
                 busy_publish_interval: float = 8.0,
                 nrt_options: NrtOptions | None = None, dra: bool = False) -> None:
        self.kube = kube
        self.dra = dra  # devices as ResourceSlices of the emulated DRA driver (draslices.py)
        # Everything but pod decisions and watches: its own small connection pool.
        self.bg = kube.lane(max(1, background_connections))
        self._node_uids: dict[str, str] = {}
        self.states: dict[str, NodeState] = {}
        for i, n in enumerate(nodes):
            if n.name in self.states:
                raise ValueError(f"node {n.name} is emulated twice")
            self.states[n.name] = NodeState(n.name, n.machine, index=index_offset + i)
        self.lease_interval = lease_interval
        self.status_interval = status_interval
        self.publisher = Publisher(self.bg, self.states, delay=publish_delay,
                                   min_interval=publish_interval,
                                   labels=lambda st: {LABEL_MACHINE: st.machine.name},
                                   nrt=publish_nrt, nrt_options=nrt_options,
                                   nrt_kube=kube.lane(8) if publish_nrt else None,
                                   nrt_concurrency=8,
                                   node_uid=self._node_uids.get,
                                   busy=self.deciding, busy_interval=busy_publish_interval,
                                   busy_concurrency=max(1, background_connections // 2))
        self._pod_writes = 0  # pod status writes queued or in flight
        self._last_decision = float("-inf")
        self._nt_generation: dict[str, int] = {}  # generation of the spec taken
        self._nt_reading: dict[str, bool] = {}  # node -> read again when this one is done?
        self._sem = asyncio.Semaphore(concurrency)
        self._event_sem = asyncio.Semaphore(max(1, background_connections))
        self.ips = PodIps()
        self._finalizing: set[str] = set()
        self._claims_reading: set[str] = set()  # pods whose claims are read (claimadmit)
        self._order: dict[str, claimadmit.Queue] = {}  # nodes deciding in bind order
        self._claim_verdicts: dict[str, claimadmit.Verdict] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._seen: dict[str, float] = {}
        self.stats = Stats()
        self.ready = asyncio.Event()

    def _on_dra(self, name: str, devices: NodeDraDevices) -> None:
        self.states[name].dra = devices
        self.publisher.mark(name)

    # -- start-up -----------------------------------------------------------------------

    async def register(self) -> None:
        sem = asyncio.Semaphore(16)

        async def one(st: NodeState) -> None:
            async with sem:
                await self._register_node(st)

        await asyncio.gather(*(one(st) for st in self.states.values()))

    async def _register_node(self, st: NodeState) -> None:
        obj = node_object(st.name, self._advertised(st), st.index)
        try:
            created = await self.kube.create("/api/v1/nodes", obj)
            self._node_uids[st.name] = str(created["metadata"]["uid"])
        except ApiError as e:
            if e.status != 409:
                raise
            patched = await self.kube.patch(f"/api/v1/nodes/{q(st.name)}",
                                            {"metadata": {"labels": obj["metadata"]["labels"]}})
            self._node_uids[st.name] = str(patched["metadata"]["uid"])
            await self._post_node_status(st)
        if self.dra:
            await publish_slices(self.kube, st.name, st.machine, self._node_uids.get(st.name))
        await self._renew_lease(st)

    def _advertised(self, st: NodeState) -> Machine:
        """The machine the Node advertises: in DRA mode, its devices are in slices."""
        return without_devices(st.machine) if self.dra else st.machine

    async def _post_node_status(self, st: NodeState) -> None:
        body = {"status": node_status(st.name, self._advertised(st), st.index)}
        try:
            await self.bg.patch(f"/api/v1/nodes/{q(st.name)}/status", body, decode=False)
        except ApiError as e:
            if e.status != 404:
                raise
            await self._register_node(st)

    async def _renew_lease(self, st: NodeState) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{q(st.name)}"
        lease = lease_object(st.name, self._node_uids.get(st.name))
        try:
            await self.bg.patch(path, {"spec": lease["spec"]}, decode=False)
        except ApiError as e:
            if e.status != 404:
                raise
            try:
                await self.bg.create(
                    "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", lease)
            except ApiError as e2:
                if e2.status != 409:
                    raise

    async def restore(self) -> tuple[str, str]:
        """Rebuild every node's state from NodeTopology status and the pods; returns the
        resourceVersions to watch NodeTopologies and pods from."""
        nts, nt_rv = await self.kube.list_all(NT_BASE)
        existing = {str(o["metadata"]["name"]): o for o in nts}
        for name, o in existing.items():
            self._remember_generation(name, o)
        sem = asyncio.Semaphore(16)

        async def ensure(name: str) -> None:
            async with sem:
                await self._ensure_nodetopology(name, existing.get(name))

        await asyncio.gather(*(ensure(n) for n in self.states))
        pods, pod_rv = await self.kube.list_all("/api/v1/pods", {"fieldSelector": POD_SELECTOR})
        by_node: dict[str, list[JSON]] = {}
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            if node in self.states:
                by_node.setdefault(str(node), []).append(p)
                if (p.get("status") or {}).get("phase") == "Running":
                    self.ips.keep(str(node), p)
        pending: list[JSON] = []
        for name, st in self.states.items():
            report = st.restore(existing.get(name), by_node.get(name, []))
            self.stats.restored += len(report.restored)
            if report.restored or report.dropped or report.conflicts:
                log.info("%s: restored %d pods, dropped %d gone, %d conflicts, %d to decide",
                         name, len(report.restored), len(report.dropped),
                         len(report.conflicts), len(report.pending))
            pending.extend(report.pending)
        # Every node's status, written by the publisher's loop: pods are decided meanwhile.
        self.publisher.mark_all()
        for p in pending:
            self._handle(self.on_pod, "restore", "ADDED", p)
        # Pods already marked for deletion while we were away.
        for p in pods:
            if (p.get("metadata") or {}).get("deletionTimestamp"):
                self._handle(self.on_pod, "restore", "MODIFIED", p)
        return nt_rv, pod_rv

    # -- the loops ------------------------------------------------------------------------

    async def run(self) -> None:
        await self.kube.open()
        await self.register()
        nt_rv, pod_rv = await self.restore()
        loops = [
            asyncio.create_task(self._pod_loop(pod_rv), name="pods"),
            asyncio.create_task(self._nt_loop(nt_rv), name="nodetopologies"),
            asyncio.create_task(self._lease_loop(), name="leases"),
            asyncio.create_task(self._status_loop(), name="node-status"),
            asyncio.create_task(self.publisher.run(), name="publisher"),
            asyncio.create_task(self._report_loop(), name="report"),
            asyncio.create_task(FleetDraDevices(  # the nodes' DRA devices (agent/dra.py)
                self.kube, {n: [z.id for z in st.machine.numa_nodes]
                            for n, st in self.states.items()}, self._on_dra).run(), name="dra"),
        ]
        self.ready.set()
        log.info("emulating %d nodes", len(self.states))
        try:
            done, _ = await asyncio.wait(loops, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                t.result()
        finally:
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            if self._tasks:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
            try:
                if self.publisher.pending():
                    await asyncio.wait_for(self.publisher.flush(), 10)
            except Exception as e:  # best effort on the way out
                log.debug("final publish failed: %s", e)
            log.info("%s", self.summary())

    def summary(self) -> str:
        """One line on everything decided so far (logged at exit; the benchmark reads it)."""
        lat = sorted(self.stats.latencies)
        p50 = lat[len(lat) // 2] if lat else float("nan")
        p99 = lat[min(len(lat) - 1, round((len(lat) - 1) * 0.99))] if lat else float("nan")
        return (f"summary: decided {self.stats.admitted + self.stats.rejected} pods "
                f"({self.stats.admitted} admitted, {self.stats.rejected} rejected), "
                f"{self.stats.released} released; watch-to-written p50 {p50:.3f}s "
                f"p99 {p99:.3f}s; {self.publisher.writes} NodeTopology writes, "
                f"{self.publisher.nrt_writes} NodeResourceTopology writes, "
                f"{self.kube.requests} API requests")

    async def _report_loop(self, every: float = 30.0) -> None:
        last = 0
        while True:
            await asyncio.sleep(every)
            lat = self.stats.latencies[last:]
            last = len(self.stats.latencies)
            if not lat:
                continue
            lat.sort()
            log.info("decided %d pods (%d admitted, %d rejected), %d released; last %ds: "
                     "watch-to-written p50 %.3fs p99 %.3fs; %d writes in flight; "
                     "%d NodeTopology writes", self.stats.admitted + self.stats.rejected,
                     self.stats.admitted, self.stats.rejected, self.stats.released, every,
                     lat[len(lat) // 2], lat[min(len(lat) - 1, round(len(lat) * 0.99))],
                     len(self._tasks), self.publisher.writes)

    async def _lease_loop(self) -> None:
        names = list(self.states)
        sem = asyncio.Semaphore(8)
        while True:
            start = time.monotonic()

            async def one(n: str) -> None:
                async with sem:
                    try:
                        await self._renew_lease(self.states[n])
                    except Exception as e:  # try again next round
                        log.warning("lease %s: %s", n, e)

            await asyncio.gather(*(one(n) for n in names))
            await asyncio.sleep(max(0.5, self.lease_interval - (time.monotonic() - start)))

    async def _status_loop(self) -> None:
        while True:
            await asyncio.sleep(self.status_interval)
            for st in self.states.values():
                try:
                    await self._post_node_status(st)
                except Exception as e:  # try again next round
                    log.warning("node status %s: %s", st.name, e)

    @staticmethod
    def _handle(handle: Any, path: str, typ: Any, obj: Mapping[str, Any]) -> None:
        """One pod at restore. Nothing in an object's content may end the agent (and with
        it every emulated node): a handler's failure is logged and the pod skipped."""
        try:
            handle(typ, obj)
        except Exception:
            meta = obj.get("metadata") or {}
            log.exception("%s: %s event of %s/%s failed; skipped", path, typ,
                          meta.get("namespace"), meta.get("name"))

    async def _pod_loop(self, rv: str) -> None:
        """Pods from ``rv`` (the restore's listing) on; a listing again releases the pods
        that went while nobody watched. An event's failure is logged and skipped: nothing
        in an object's content may end the watch (and with it every emulated node)."""
        await list_watch(self.kube, "/api/v1/pods", self._relisted_pods, self.on_pod,
                         params={"fieldSelector": POD_SELECTOR}, since=rv)

    def _relisted_pods(self, pods: list[JSON]) -> None:
        alive: dict[str, set[str]] = {}
        for p in pods:
            node = str((p.get("spec") or {}).get("nodeName") or "")
            if node in self.states:
                alive.setdefault(node, set()).add(pod_uid(p))
                self.on_pod("MODIFIED", p)
        for name, st in self.states.items():
            for uid in list(st.decided):
                if uid not in alive.get(name, set()) and st.release(uid):
                    self.stats.released += 1
                    self.publisher.mark(name)

    async def _nt_loop(self, rv: str) -> None:
        """NodeTopologies from ``rv`` on, their metadata only (the spec read when its
        generation moves); a listing again takes every node's spec."""
        await list_watch(self.kube, NT_BASE, self._relisted_nts, self.on_nodetopology_meta,
                         since=rv, metadata_only=True)

    def _relisted_nts(self, items: list[JSON]) -> None:
        seen = set()
        for o in items:
            seen.add(str(o["metadata"]["name"]))
            self.on_nodetopology("MODIFIED", o)
        for name in self.states:
            if name not in seen:
                self.on_nodetopology("DELETED", {"metadata": {"name": name}})

    # -- events ---------------------------------------------------------------------------

    def _remember_generation(self, name: str, obj: Mapping[str, Any]) -> bool:
        """Note the generation of a NodeTopology whose spec we take; False when it is older
        than one already taken (a late read)."""
        gen = (obj.get("metadata") or {}).get("generation")
        if not isinstance(gen, int) or isinstance(gen, bool):
            return True
        if gen < self._nt_generation.get(name, 0):
            return False
        self._nt_generation[name] = gen
        return True

    def on_nodetopology_meta(self, typ: str, obj: Mapping[str, Any]) -> None:
        """A watch event with the NodeTopology's metadata only: status writes (ours) leave
        ``generation`` as it is; a spec change bumps it, and then we read the object."""
        meta = obj.get("metadata") or {}
        name = str(meta.get("name") or "")
        if name not in self.states:
            return
        if typ == "DELETED" or "spec" in obj:  # the whole object after all
            self.on_nodetopology(typ, obj)
            return
        gen = meta.get("generation")
        if isinstance(gen, int) and gen == self._nt_generation.get(name):
            return
        if name in self._nt_reading:
            self._nt_reading[name] = True  # read again: this event may be newer
            return
        self._nt_reading[name] = False
        self._spawn(self._read_nodetopology(name))

    async def _read_nodetopology(self, name: str) -> None:
        """Read a NodeTopology whose spec changed (one read per node at a time)."""
        try:
            while True:
                try:
                    obj = await self.bg.get(nt_path(name))
                except ApiError as e:
                    if e.status == 404:
                        self.on_nodetopology("DELETED", {"metadata": {"name": name}})
                    else:
                        log.warning("NodeTopology %s: %s", name, e)
                    return
                except Exception as e:  # the next spec change (or relist) tries again
                    log.warning("NodeTopology %s: %s", name, e)
                    return
                self.on_nodetopology("MODIFIED", obj)
                if not self._nt_reading.get(name):
                    return
                self._nt_reading[name] = False
        finally:
            self._nt_reading.pop(name, None)

    async def _ensure_nodetopology(self, name: str, existing: Mapping[str, Any] | None) -> None:
        created = await self.publisher.ensure(name, existing)
        if created is not None:  # its spec is empty: nothing to take but the generation
            self._remember_generation(name, created)

    def on_nodetopology(self, typ: str, obj: Mapping[str, Any]) -> None:
        name = str((obj.get("metadata") or {}).get("name") or "")
        st = self.states.get(name)
        if st is None:
            return
        if typ == "DELETED":
            self._nt_generation.pop(name, None)
            self._spawn(self._ensure_nodetopology(name, None))
            self.publisher.mark(name)
            return
        if not self._remember_generation(name, obj):
            return
        if st.set_spec(obj.get("spec")):
            log.info("%s: node default policy %s/%s (generation %s)", name, st.default.policy,
                     st.default.scope, st.observed_generation)
            self.publisher.mark(name)

    def on_pod(self, typ: str, pod: Mapping[str, Any]) -> None:
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        st = self.states.get(node)
        if st is None:
            return
        uid = pod_uid(pod)
        meta = pod.get("metadata") or {}
        if typ == "DELETED":
            self._seen.pop(uid, None)
            self.ips.release(node, uid)
            self._finalizing.discard(uid)
            if st.release(uid):
                self.stats.released += 1
            self.publisher.mark(node)
            return
        if meta.get("deletionTimestamp"):
            if uid not in self._finalizing:
                self._finalizing.add(uid)
                if st.release(uid):
                    self.stats.released += 1
                self.publisher.mark(node)
                self._spawn(self._finalize(pod))
            return
        if uid in st.decided:
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            st.decided[uid] = False
            if st.track(pod):
                self.publisher.mark(node)
            return
        self._seen.setdefault(uid, time.monotonic())
        if uses_claims(pod) or st.name in self._order:  # in bind order (claimadmit.py)
            self._admit_in_order(st, pod)
            return
        self._decide(st, pod)

    def _decide(self, st: NodeState, pod: Mapping[str, Any],
                devices: Sequence[ProviderKind] = ()) -> None:
        node, uid, meta = st.name, pod_uid(pod), pod.get("metadata") or {}
        eff = effective_policy(pod, NodePolicy(NodeKind.EMULATED, st.default))
        problem = eff.problem
        try:
            decision = st.decide(pod, eff, devices)
        except Exception as e:  # a pod the engine cannot read is rejected
            log.exception("%s: cannot admit %s/%s", node, meta.get("namespace"), meta.get("name"))
            st.decided[uid] = False
            st.track(pod, "Failed")
            self.publisher.mark(node)
            self._spawn(self._write_rejected(st, pod, "UnexpectedAdmissionError", str(e), problem))
            return
        self._last_decision = time.monotonic()
        self.publisher.mark(node)
        if decision.admit:
            self.stats.admitted += 1
            self._spawn(self._write_running(st, pod, decision.allocation or Allocation(), problem))
        else:
            self.stats.rejected += 1
            self._spawn(self._write_rejected(st, pod, decision.reason or REJECT_REASON,
                                             decision.message or TOPOLOGY_MESSAGE, problem))

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- writes ---------------------------------------------------------------------------

    async def _event(self, st: NodeState, pod: Mapping[str, Any], reason: str,
                     message: str) -> None:
        ns = str((pod.get("metadata") or {}).get("namespace"))
        try:
            async with self._event_sem:
                await self.bg.create(f"/api/v1/namespaces/{q(ns)}/events",
                                       pod_event(pod, st.name, "Warning", reason, message))
        except ApiError as e:
            log.warning("event on %s/%s: %s", ns, (pod.get("metadata") or {}).get("name"), e)

    async def _write_running(self, st: NodeState, pod: Mapping[str, Any], alloc: Allocation,
                             problem: str | None) -> None:
        uid = pod_uid(pod)
        host_ip, _ = node_addresses(st.index)
        status = running_status(pod, host_ip, self.ips.take(st.name, st.index), scheduled_at(pod))
        self.ips.keep(st.name, {"metadata": {"uid": uid}, "spec": pod.get("spec"),
                                "status": status})
        body = {**alloc.pod_patch(uid), "status": status}
        await self._write_pod(st, pod, body)
        if problem:
            self._spawn(self._event(st, pod, INVALID_POLICY_REASON,
                                    f"{problem}; using the node default policy "
                                    f"{st.default.policy} (scope {st.default.scope})"))

    def deciding(self, quiet: float = 1.0) -> bool:
        """Pod decisions are being made: status writes queued or in flight, or a decision
        less than ``quiet`` seconds ago (the publisher spaces NodeTopology writes out)."""
        return self._pod_writes > 0 or time.monotonic() - self._last_decision < quiet

    async def _write_pod(self, st: NodeState, pod: Mapping[str, Any], body: JSON) -> None:
        """The pod's status write, ``concurrency`` at a time; ``_pod_writes`` counts those
        queued or in flight."""
        self._pod_writes += 1
        try:
            async with self._sem:
                await self._patch_pod(st, pod, body)
        finally:
            self._pod_writes -= 1

    async def _write_rejected(self, st: NodeState, pod: Mapping[str, Any], reason: str,
                              message: str, problem: str | None) -> None:
        uid = pod_uid(pod)
        body = {"metadata": {"uid": uid},
                "status": rejected_status(pod, reason, message, scheduled_at(pod))}
        await self._write_pod(st, pod, body)
        # Events are off the critical path: the pod's status is the decision.
        if problem:
            self._spawn(self._event(st, pod, INVALID_POLICY_REASON,
                                    f"{problem}; using the node default policy "
                                    f"{st.default.policy} (scope {st.default.scope})"))
        self._spawn(self._event(st, pod, reason, message.removeprefix(REJECTED_PREFIX)))

    async def _patch_pod(self, st: NodeState, pod: Mapping[str, Any], body: JSON) -> None:
        meta = pod.get("metadata") or {}
        ns, name, uid = str(meta.get("namespace")), str(meta.get("name")), pod_uid(pod)
        try:
            await self.kube.patch(pod_path(ns, name, "status"), body, MERGE_PATCH, decode=False)
        except ApiError as e:
            if e.status in (404, 409):
                # Gone (or replaced by a pod of the same name): nothing to hold for it.
                if st.release(uid):
                    self.stats.released += 1
                    self.publisher.mark(st.name)
                return
            self.stats.write_errors += 1
            log.warning("pod %s/%s: status write failed: %s", ns, name, e)
            return
        seen = self._seen.pop(uid, None)
        if seen is not None:
            self.stats.latencies.append(time.monotonic() - seen)

    async def _finalize(self, pod: Mapping[str, Any]) -> None:
        """The kubelet's last step for a deleted pod: delete it for good (grace 0)."""
        meta = pod.get("metadata") or {}
        ns, name, uid = str(meta.get("namespace")), str(meta.get("name")), pod_uid(pod)
        async with self._sem:
            try:
                await self.kube.delete(pod_path(ns, name), {
                    "apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                    "preconditions": {"uid": uid}})
            except ApiError as e:
                if e.status not in (404, 409):
                    log.warning("pod %s/%s: final delete failed: %s", ns, name, e)

    def nodetopology_path(self, name: str) -> str:
        return nt_path(name)

