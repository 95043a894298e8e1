"""The agent on a real node: discover the machine, publish its NodeTopology status and
acknowledge the node default policy the operator pushes. A real kubelet admits the pods
there, so this agent holds no allocations of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from numalign.api.wire import LABEL_MACHINE
from numalign.topology.machine import Machine

from .kube import NT_BASE, ApiError, Kube, q
from .lease import NodeLease
from .publish import Publisher
from .state import NodeState

log = logging.getLogger(__name__)


def discover_machine(name: str, root: str = "/") -> Machine:
    """The machine under ``root`` (sysfs, and nvidia-smi on a live node)."""
    from numalign.agent import discovery

    dm = discovery.discover(root)
    for w in getattr(dm, "warnings", []) or []:
        log.warning("discovery: %s", w)
    return discovery.to_machine(dm, name, description=f"discovered on {name}")


class RealNode:
    def __init__(self, kube: Kube, name: str, machine: Machine, *,
                 resync: float = 300.0, publish_nrt: bool = False,
                 lease: NodeLease | None = None) -> None:
        self.kube = kube
        self.lease = lease
        self.state = NodeState(name, machine, admits=False)
        self.states = {name: self.state}
        self.node_uid: str | None = None
        self.publisher = Publisher(kube, self.states,
                                   labels=lambda st: {LABEL_MACHINE: st.machine.name},
                                   nrt=publish_nrt, node_uid=lambda _: self.node_uid,
                                   preconditions=True)
        self.resync = resync

    def on_nodetopology(self, typ: str, obj: Mapping[str, Any]) -> None:
        if typ == "DELETED":
            self.publisher.mark(self.state.name)
            return
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
        try:
            done, _ = await asyncio.wait([keeper, main], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()  # LeaseLost: stop publishing (the pod restarts and stands by)
        finally:
            for t in (keeper, main):
                t.cancel()
            await asyncio.gather(keeper, main, return_exceptions=True)

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
        self.publisher.mark(name)
        await self.publisher.flush()
        writer = asyncio.create_task(self.publisher.run())
        ticker = asyncio.create_task(self._tick())
        try:
            while True:
                try:
                    async for ev in self.kube.watch(NT_BASE, {**selector, "resourceVersion": rv}):
                        obj = ev.get("object") or {}
                        if ev.get("type") == "ERROR":
                            raise RuntimeError(str(obj.get("message")))
                        rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                        if ev.get("type") != "BOOKMARK":
                            self.on_nodetopology(str(ev.get("type")), obj)
                except Exception as e:  # relist and watch again
                    log.warning("watch NodeTopology %s: %s", name, e)
                    await asyncio.sleep(1)
                    items, rv = await self.kube.list_all(NT_BASE, selector)
                    for o in items:
                        self.on_nodetopology("MODIFIED", o)
        finally:
            writer.cancel()
            ticker.cancel()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.resync)
            self.publisher.mark(self.state.name)
