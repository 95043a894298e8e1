"""NodeTopology status: what the agent publishes about its node (``build_status`` is pure)
and the writer that keeps it current (``Publisher``: coalesced, one write per node per
interval however many pods changed, retried on conflicts and transient errors).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from numalign.api.allocation import Admitted
from numalign.api.common import API_VERSION
from numalign.api.effective import NodeKind
from numalign.api.kube import JSON_PATCH, MERGE_PATCH, ApiError, Kube, nt_path
from numalign.api.nodetopology import KIND, NRI_PLACEMENT, POLICY_APPLIED, READY
from numalign.topology.cputopo import cpu_topology_json
from numalign.topology.machine import Machine
from numalign.topology.quantity import format_bytes, format_cpulist

from . import nrt
from .kubelet_status import now_iso
from .nrt import NrtOptions
from .state import NodeState

log = logging.getLogger(__name__)

JSON = dict[str, Any]


def zone_capacity(machine: Machine) -> dict[int, dict[str, int]]:
    """Per NUMA node: cpu count, memory and hugepages bytes, device counts."""
    out: dict[int, dict[str, int]] = {}
    for n in machine.numa_nodes:
        res: dict[str, int] = {"cpu": len(n.cpus), "memory": n.memory}
        for size, total in sorted(n.hugepages.items()):
            res[f"hugepages-{size}"] = total
        out[n.id] = res
    for d in machine.devices:
        if d.numa_node is not None:
            zone = out[d.numa_node]
            zone[d.resource] = zone.get(d.resource, 0) + 1
    return out


def zone_used(state: NodeState) -> dict[int, dict[str, int]]:
    """Per NUMA node: exclusive CPUs, memory (by kind) and devices held by admitted pods."""
    m = state.machine
    cpu_numa = {c.id: c.numa for c in m.cpus.values()}
    dev_numa = {(d.resource, d.id): d.numa_node for d in m.devices}
    used: dict[int, dict[str, int]] = {n.id: {} for n in m.numa_nodes}
    for held in state.admitted.values():
        for ca in held.allocation.containers.values():
            for c in ca.cpus:
                z = cpu_numa.get(c)
                if z is not None:
                    used[z]["cpu"] = used[z].get("cpu", 0) + 1
            for zone, b in ca.memory.items():
                if zone.isdigit() and int(zone) in used:
                    u = used[int(zone)]
                    u["memory"] = u.get("memory", 0) + b
            for kind, per_zone in ca.hugepages.items():
                for zone, b in per_zone.items():
                    if zone.isdigit() and int(zone) in used:
                        u = used[int(zone)]
                        key = f"hugepages-{kind}"
                        u[key] = u.get(key, 0) + b
            for res, ids in ca.devices.items():
                for i in ids:
                    dz = dev_numa.get((res, i))
                    if dz is not None:
                        used[dz][res] = used[dz].get(res, 0) + 1
    return used


def _resources(res: Mapping[str, int]) -> dict[str, int | str]:
    """Counts as integers, memory and hugepages as quantities ("32Gi")."""
    return {k: format_bytes(v) if k == "memory" or k.startswith("hugepages-") else v
            for k, v in res.items()}


def admitted_entries(state: NodeState) -> list[JSON]:
    """``status.admitted``: one entry per admitted pod (:class:`~numalign.api.wire.Admitted`),
    in the order the node admitted them: the memory manager's NUMA groups are the last
    admission's on each NUMA node, so a ledger rebuilt from the status (a restarted
    agent, the scheduler extender) must take the pods back in this order to hold the
    same groups."""
    return [Admitted(held.name, held.namespace, held.uid, held.resolved, held.allocation).to_json()
            for held in state.admitted.values()]


@dataclass(frozen=True)
class _Static:
    """The parts of a node's status that only depend on its machine (computed once)."""

    capacity: dict[int, dict[str, int]]
    cpu_topology: JSON
    distances: dict[str, dict[str, int]] | None
    devices: list[JSON]


_STATIC: dict[int, tuple[Machine, _Static]] = {}


def _static_parts(m: Machine) -> _Static:
    hit = _STATIC.get(id(m))
    if hit is not None and hit[0] is m:
        return hit[1]
    distances = None
    if m.distances is not None:
        distances = {str(a): {str(b): d for b, d in row.items()} for a, row in m.distances.items()}
    devices: list[JSON] = []
    for d in m.devices:
        dev: JSON = {"resource": d.resource, "id": d.id}
        if d.numa_node is not None:
            dev["numaNode"] = d.numa_node
        if d.memory is not None:
            dev["memory"] = format_bytes(d.memory)
        if d.groups:
            dev["groups"] = [{"level": lvl, "id": gid} for lvl, gid in d.groups]
        devices.append(dev)
    static = _Static(zone_capacity(m), cpu_topology_json(m), distances, devices)
    _STATIC[id(m)] = (m, static)
    return static


def build_status(state: NodeState, previous: Mapping[str, Any] | None = None,
                 ready: bool | None = None, message: str | None = None) -> JSON:
    """The NodeTopology status of ``state`` (``previous`` keeps condition transition times;
    ``ready`` and ``message`` default to the state's)."""
    if ready is None:
        ready = state.ready
    if message is None:
        message = state.ready_message
    m = state.machine
    static = _static_parts(m)
    cap = static.capacity
    used = zone_used(state)
    zones: list[JSON] = []
    free_cpus = total_cpus = 0
    for n in m.numa_nodes:
        c = cap[n.id]
        a = c if state.zone_allocatable is None else state.zone_allocatable.get(n.id, c)
        avail = {k: max(0, v - used[n.id].get(k, 0)) for k, v in a.items()}
        total_cpus += a.get("cpu", 0)
        free_cpus += avail.get("cpu", 0)
        zone: JSON = {"id": n.id, "cpus": format_cpulist(list(n.cpus)),
                      "memory": format_bytes(n.memory),
                      "capacity": _resources(c), "allocatable": _resources(a),
                      "available": _resources(avail)}
        if n.hugepages:
            zone["hugepages"] = {k: format_bytes(v) for k, v in sorted(n.hugepages.items())}
        zones.append(zone)
    distances = static.distances
    devices = static.devices
    admitted = admitted_entries(state)
    used_devices = {(r, i) for h in state.admitted.values()
                    for r, ids in h.allocation.devices.items() for i in ids}
    gpu_ids = {i for h in state.admitted.values() for ids in h.allocation.gpus.values()
               for i in ids}
    used_devices |= {(d.resource, d.id) for d in m.devices if d.id in gpu_ids}
    known = {(d.resource, d.id) for d in m.devices}
    n_used = len(used_devices & known)

    prev_conds = {c.get("type"): c for c in (previous or {}).get("conditions") or []
                  if isinstance(c, Mapping)}
    t = now_iso()

    def cond(type_: str, ok: bool, reason: str, msg: str) -> JSON:
        status = "True" if ok else "False"
        old = prev_conds.get(type_)
        since = old.get("lastTransitionTime") if old and old.get("status") == status else None
        return {"type": type_, "status": status, "reason": reason, "message": msg,
                "lastTransitionTime": since or t}

    applied = state.observed_generation == state.spec_generation
    kubelet = state.kubelet
    placement = cond(NRI_PLACEMENT, *state.placement) if state.placement is not None else None
    kind = NodeKind.of({"status": {"kubelet": kubelet,
                                   "conditions": [placement] if placement else []}})
    if kubelet is not None and kind is NodeKind.KUBELET_MANAGED:
        # a kubelet-managed real node: the kubelet admits the pods under its own policy
        policy_text = (f"the kubelet's Topology Manager policy "
                       f"{kubelet.get('topologyManagerPolicy')}, scope "
                       f"{kubelet.get('topologyManagerScope')} (the kubelet admits this "
                       f"node's pods)")
    else:
        policy_text = f"node default policy {state.default.policy}, scope {state.default.scope}"
    status: JSON = {
        "zones": zones,
        "cpuTopology": static.cpu_topology,
        "devices": devices,
        "admitted": admitted,
        "rejected": state.rejected_total,
        "conditions": [
            cond(READY, ready, "AgentReady" if ready else "AgentNotReady",
                 message or ("the agent publishes this node's topology"
                             + (" and admits its pods" if state.admits else ""))),
            cond(POLICY_APPLIED, applied, "Applied" if applied else "Pending", policy_text),
        ],
        "summary": {"numaNodes": len(zones), "cpus": f"{free_cpus}/{total_cpus}",
                    "devices": f"{len(devices) - n_used}/{len(devices)}",
                    "pods": len(admitted)},
    }
    if placement is not None:
        status["conditions"].append(placement)
    if distances is not None:
        status["distances"] = distances
    if state.observed_generation is not None:
        status["observedPolicyGeneration"] = state.observed_generation
    if state.kubelet is not None:
        status["kubelet"] = dict(state.kubelet)
    if state.dra is not None:  # the node's DRA devices (agent/dra.py)
        status["draDevices"] = state.dra.entries()
        status["summary"]["draDevices"] = state.dra.total
    return status


def nodetopology_object(name: str, labels: Mapping[str, str] | None = None) -> JSON:
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": name, "labels": dict(labels or {})}, "spec": {}}


class Publisher:
    """Writes NodeTopology status for many nodes, coalescing changes.

    ``mark(name)`` asks for a write; the writer waits ``delay`` to gather more changes,
    and writes a node at most once per ``min_interval``, so a burst of pod decisions
    costs one write per node rather than one per pod. Pod decisions come first: while
    ``busy()`` says they are being made (their writes queued or in flight), a node is
    written at most once per ``busy_interval`` instead, ``busy_concurrency`` writes at a
    time; once the burst is over, every node still dirty is written within
    ``min_interval``.

    A write sends only what changed since the status this writer knows is stored (a
    JSON merge patch; nothing at all when nothing changed), and the whole status when it
    does not know (the first write, after an error).
    """

    def __init__(self, kube: Kube, states: Mapping[str, NodeState], *,
                 delay: float = 0.2, min_interval: float = 1.0, concurrency: int = 8,
                 labels: Callable[[NodeState], Mapping[str, str]] | None = None,
                 nrt: bool = False, nrt_options: NrtOptions | None = None,
                 nrt_delay: float = 0.1, nrt_interval: float = 0.5, nrt_concurrency: int = 4,
                 nrt_kube: Kube | None = None,
                 node_uid: Callable[[str], str | None] | None = None,
                 busy: Callable[[], bool] | None = None, busy_interval: float = 8.0,
                 busy_concurrency: int = 2, preconditions: bool = False) -> None:
        self.kube = kube
        # Every status write names the resourceVersion it was computed against (a stale
        # one is refused with 409, then the stored object is read again): another writer
        # of the same status is never overwritten blindly, nor merged into.
        self.preconditions = preconditions
        self._rv: dict[str, str] = {}
        self.busy = busy
        self.busy_interval = max(busy_interval, min_interval)
        self.busy_concurrency = max(1, busy_concurrency)
        self.nrt = nrt
        self.nrt_options = nrt_options or NrtOptions()
        self.nrt_kube = nrt_kube or kube  # NodeResourceTopology writes (a lane of their own)
        self.node_uid = node_uid
        self._nrt_rv: dict[str, str] = {}
        self._nrt_sent: dict[str, JSON] = {}  # the object last written per node
        self._nrt_omitted: dict[str, list[int]] = {}
        self._nrt_dirty: set[str] = set()
        self._nrt_event = asyncio.Event()
        self._nrt_last: dict[str, float] = {}
        self.nrt_delay = nrt_delay
        self.nrt_interval = nrt_interval
        self.nrt_concurrency = max(1, nrt_concurrency)
        self._nrt_backoff: dict[str, float] = {}
        self.nrt_writes = 0
        self.nrt_errors = 0
        self.states = states
        self.delay = delay
        self.min_interval = min_interval
        self.concurrency = concurrency
        self.labels = labels
        self._dirty: set[str] = set()
        self._event = asyncio.Event()
        self._last_write: dict[str, float] = {}
        self._published_version: dict[str, int] = {}
        self._previous: dict[str, JSON] = {}
        # The status known to be stored (what a merge patch is computed against); absent
        # when unknown.
        self._stored: dict[str, JSON] = {}
        self.writes = 0
        self.skipped = 0  # writes found unnecessary (nothing changed)
        self.errors = 0

    def mark(self, name: str) -> None:
        self._dirty.add(name)
        self._event.set()
        if self.nrt:
            self.mark_nrt(name)

    def mark_all(self) -> None:
        self._dirty.update(self.states)
        self._event.set()
        for name in self.states if self.nrt else ():
            self.mark_nrt(name)

    def mark_nrt(self, name: str) -> None:
        """Ask for the node's NodeResourceTopology to be written (its own loop, not
        slowed down by pod decisions: see :meth:`run_nrt`)."""
        self._nrt_dirty.add(name)
        self._nrt_event.set()

    async def ensure(self, name: str, existing: Mapping[str, Any] | None) -> JSON | None:
        """Create the node's NodeTopology when it does not exist yet; the object created,
        if this call created it."""
        if existing is not None:
            self._previous[name] = dict(existing.get("status") or {})
            self._stored[name] = self._previous[name]
            return None
        self._stored.pop(name, None)
        st = self.states[name]
        labels = self.labels(st) if self.labels else {}
        try:
            return await self.kube.create("/apis/numalign.io/v1alpha1/nodetopologies",
                                          nodetopology_object(name, labels))
        except ApiError as e:
            if e.status != 409:
                raise
        return None

    async def _write_checked(self, name: str, status: JSON) -> None:
        """Write ``status`` as a merge patch against the stored object, with its
        resourceVersion as a precondition (see ``preconditions``)."""
        for attempt in range(6):
            rv, stored = self._rv.get(name), self._stored.get(name)
            if rv is None or stored is None:
                try:
                    obj = await self.kube.get(nt_path(name))
                except ApiError as e:
                    if e.status == 404 and attempt < 5:
                        await self.ensure(name, None)
                        continue
                    raise
                stored = dict(obj.get("status") or {})
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            diff = merge_diff(stored, status)
            if diff is None:
                self._rv[name], self._stored[name] = rv, stored
                self.skipped += 1
                return
            self._rv.pop(name, None)
            self._stored.pop(name, None)
            try:
                out = await self.kube.patch(nt_path(name, "status"),
                                            {"metadata": {"resourceVersion": rv},
                                             "status": diff}, MERGE_PATCH)
            except ApiError as e:
                if e.status in (404, 409) and attempt < 5:  # read it again, then retry
                    await asyncio.sleep(0.05 * attempt)
                    continue
                raise
            self._rv[name] = str((out.get("metadata") or {}).get("resourceVersion") or "")
            self.writes += 1
            return
        raise RuntimeError(f"NodeTopology {name}: status not written")  # pragma: no cover

    async def write(self, name: str) -> None:
        st = self.states[name]
        version = st.version
        status = build_status(st, self._previous.get(name))
        for attempt in range(6 if not self.preconditions else 0):
            stored = self._stored.get(name)
            if stored is not None:
                diff = merge_diff(stored, status)
                if diff is None:
                    self.skipped += 1
                    break
                body: Any = {"status": diff}
                kind = MERGE_PATCH
            else:
                body = [{"op": "add", "path": "/status", "value": status}]
                kind = JSON_PATCH
            # Unknown outcome (error, timeout) -> unknown stored status: write it all next.
            self._stored.pop(name, None)
            try:
                await self.kube.patch(nt_path(name, "status"), body, kind, decode=False)
            except ApiError as e:
                if e.status == 404 and attempt < 5:
                    await self.ensure(name, None)
                    continue
                if e.status == 409 and attempt < 5:
                    await asyncio.sleep(0.1 * (attempt + 1))
                    continue
                raise
            self.writes += 1
            break
        if self.preconditions:
            await self._write_checked(name, status)
        self._stored[name] = status
        self._previous[name] = status
        self._published_version[name] = version
        self._last_write[name] = time.monotonic()

    async def write_nrt(self, name: str, status: Mapping[str, Any]) -> None:
        """The node's NodeResourceTopology from ``status`` (its state's): replaced in one
        request while nobody else wrote it since our last write (its resourceVersion is
        ours), else through ``nrt.publish_nrt`` (read, merge labels, create or replace)."""
        st = self.states[name]
        spec = {"policy": st.default.policy, "scope": st.default.scope,
                "options": dict(st.default.options.given)}
        labels = self.labels(st) if self.labels else None
        uid = self.node_uid(name) if self.node_uid else None
        obj = nrt.build_nrt(name, status, spec, node_uid=uid, labels=labels,
                            legacy_policies=self.nrt_options.legacy_policies)
        nrt.add_fingerprint(obj, st.pods.values(), self.nrt_options)
        omitted = nrt.omitted_zones(status)
        if omitted and self._nrt_omitted.get(name) != omitted:
            log.warning("NodeResourceTopology %s: NUMA nodes %s left out (the scheduler "
                        "plugin reads ids 0-%d only)", name, omitted, nrt.MAX_ZONE_ID)
        self._nrt_omitted[name] = omitted
        if self._nrt_rv.get(name) and self._nrt_sent.get(name) == obj:
            return  # nothing changed since our last write
        rv = self._nrt_rv.get(name)
        stored: JSON | None = None
        if rv:
            body = dict(obj)
            body["metadata"] = {**obj["metadata"], "resourceVersion": rv}
            try:
                stored = await self.nrt_kube.put(nrt.nrt_path(name), body)
            except ApiError as e:
                if e.status not in (404, 409):
                    raise
        if stored is None:
            stored = await nrt.publish_nrt(self.nrt_kube, obj)
        self._nrt_rv[name] = str((stored.get("metadata") or {}).get("resourceVersion") or "")
        self._nrt_sent[name] = obj
        self.nrt_writes += 1

    async def _nrt_one(self, name: str) -> None:
        """Write one node's NodeResourceTopology from its state now; on failure, try
        again later (backing off); the NodeTopology writes go on regardless."""
        self._nrt_last[name] = time.monotonic()
        try:
            await self.write_nrt(name, build_status(self.states[name],
                                                    self._previous.get(name)))
        except Exception as e:  # any failure: retried, the NodeTopology write stands
            self.nrt_errors += 1
            hint = (" (is the NodeResourceTopology CRD installed? config/nrt)"
                    if isinstance(e, ApiError) and e.status == 404 else "")
            backoff = min(60.0, 2 * self._nrt_backoff.get(name, 0.5))
            self._nrt_backoff[name] = backoff
            log.warning("NodeResourceTopology %s: %s%s; retrying in %.0fs", name, e, hint,
                        backoff)
            asyncio.get_running_loop().call_later(backoff, self.mark_nrt, name)
        else:
            self._nrt_backoff.pop(name, None)

    async def _nrt_many(self, names: list[str]) -> None:
        sem = asyncio.Semaphore(self.nrt_concurrency)

        async def one(n: str) -> None:
            async with sem:
                await self._nrt_one(n)

        await asyncio.gather(*(one(n) for n in names))

    async def run_nrt(self) -> None:
        """Keep every node's NodeResourceTopology fresh: a node marked dirty is written
        ``nrt_delay`` later (gathering the changes meanwhile), at most once per
        ``nrt_interval``, ``nrt_concurrency`` at a time -- whether or not pod decisions
        are being made (the NodeTopology status waits then; a topology-aware scheduler
        reading a stale NodeResourceTopology places pods on resources already taken)."""
        while True:
            await self._nrt_event.wait()
            self._nrt_event.clear()
            await asyncio.sleep(self.nrt_delay)
            now = time.monotonic()
            due = [n for n in sorted(self._nrt_dirty)
                   if now - self._nrt_last.get(n, float("-inf")) >= self.nrt_interval]
            self._nrt_dirty.difference_update(due)
            if due:
                await self._nrt_many(due)
            if self._nrt_dirty:
                wait = min(self.nrt_interval - (time.monotonic() - self._nrt_last.get(n, 0.0))
                           for n in self._nrt_dirty)
                if wait > 0:
                    await asyncio.sleep(wait)
                self._nrt_event.set()

    def pending(self) -> bool:
        return bool(self._dirty) or bool(self._nrt_dirty)

    async def flush(self) -> None:
        """Write every node marked dirty now (ignores the interval)."""
        names = sorted(self._dirty)
        self._dirty.clear()
        await self._write_many(names)
        nrt_names = sorted(self._nrt_dirty)
        self._nrt_dirty.clear()
        await self._nrt_many(nrt_names)

    async def _write_many(self, names: list[str], concurrency: int | None = None) -> None:
        sem = asyncio.Semaphore(concurrency or self.concurrency)

        async def one(n: str) -> None:
            async with sem:
                try:
                    await self.write(n)
                except Exception as e:  # keep publishing the other nodes
                    self.errors += 1
                    log.warning("NodeTopology %s: status write failed: %s", n, e)
                    self._dirty.add(n)

        await asyncio.gather(*(one(n) for n in names))

    async def run(self) -> None:
        """Write NodeTopology status (and, with ``nrt``, NodeResourceTopology: its own
        loop) until cancelled."""
        if not self.nrt:
            await self._run()
            return
        nrt_loop = asyncio.create_task(self.run_nrt(), name="noderesourcetopology")
        try:
            await self._run()
        finally:
            nrt_loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await nrt_loop

    async def _run(self) -> None:
        while True:
            await self._event.wait()
            self._event.clear()
            await asyncio.sleep(self.delay)
            # Pod decisions first: while they are being made, each node's status waits
            # longer (busy_interval) and carries every change made meanwhile.
            busy = self.busy is not None and self.busy()
            interval = self.busy_interval if busy else self.min_interval
            now = time.monotonic()
            ready: list[str] = []
            wait = None
            for n in sorted(self._dirty, key=lambda n: (self._last_write.get(n, 0.0), n)):
                due = self._last_write.get(n, 0.0) + interval
                if due <= now:
                    ready.append(n)
                else:
                    wait = due - now if wait is None else min(wait, due - now)
            if busy:
                # A few at a time, the longest-waiting first: look at the load again soon.
                ready = ready[:self.busy_concurrency]
            self._dirty.difference_update(ready)
            if ready:
                await self._write_many(ready, self.busy_concurrency if busy else None)
            if self._dirty:
                if ready:
                    wait = None
                elif busy and wait is not None:
                    # Look at the load again soon: once the burst is over, the nodes left
                    # are due after min_interval rather than busy_interval.
                    wait = min(wait, 0.5)
                if wait:
                    await asyncio.sleep(wait)
                self._event.set()


def merge_diff(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``; None when they are
    equal. Objects are diffed key by key (a key gone becomes null); anything else that
    differs (lists included) is replaced whole. ``new`` must hold no nulls."""
    if old == new:
        return None
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    out: JSON = {}
    for k, v in new.items():
        if k not in old:
            out[k] = v
        else:
            d = merge_diff(old[k], v)
            if d is not None:
                out[k] = d
    for k in old:
        if k not in new:
            out[k] = None
    return out
