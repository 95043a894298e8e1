"""One agent per node: a coordination.k8s.io Lease ``numalign-agent-<node>``, taken and
renewed the way the kubelet keeps its node Lease.

A second agent for the same node (a stuck DaemonSet rollout, an agent run by hand) finds
the Lease held and renewed by another identity and stands by until it expires; the agent
that loses its Lease (it could not renew it in time, or another took it over) stops, so
that two agents never publish one node's status at once. Every write of the Lease carries
its resourceVersion: of two agents racing for an expired Lease, one wins.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from numalign.api.kube import ApiError, Kube, q

log = logging.getLogger(__name__)

LEASE_PREFIX = "numalign-agent-"
DURATION_S = 40
RENEW_EVERY_S = 10.0


class LeaseLost(RuntimeError):
    """Another agent holds this node's Lease now, or it could not be renewed in time."""


def _micro(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: Any) -> float | None:
    if not isinstance(text, str) or not text:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return None


class NodeLease:
    def __init__(self, kube: Kube, node: str, namespace: str, identity: str, *,
                 duration: int = DURATION_S, renew_every: float = RENEW_EVERY_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.kube = kube
        self.node = node
        self.name = LEASE_PREFIX + node
        self.namespace = namespace
        self.identity = identity
        self.duration = duration
        self.renew_every = renew_every
        self.clock = clock
        self._rv: str | None = None
        self._renewed = 0.0

    @property
    def base(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{q(self.namespace)}/leases"

    @property
    def path(self) -> str:
        return f"{self.base}/{q(self.name)}"

    def _body(self, spec: dict[str, Any], rv: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace,
                                "labels": {"app.kubernetes.io/name": "numalign-agent"}}
        if rv is not None:
            meta["resourceVersion"] = rv
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": spec}

    def _stored(self, obj: dict[str, Any]) -> None:
        self._rv = str((obj.get("metadata") or {}).get("resourceVersion") or "") or None

    def holder(self, obj: dict[str, Any]) -> tuple[str, float | None]:
        """The holder of a Lease object and when its hold expires (None: never renewed)."""
        spec = obj.get("spec") or {}
        renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
        duration = spec.get("leaseDurationSeconds")
        if not isinstance(duration, int) or duration <= 0:
            duration = self.duration
        return str(spec.get("holderIdentity") or ""), (
            None if renewed is None else renewed + duration)

    async def try_acquire(self) -> bool:
        """Take the Lease when it is free, expired or ours; False when another agent
        holds it (or won the race for it)."""
        now = self.clock()
        try:
            obj = await self.kube.get(self.path)
        except ApiError as e:
            if e.status != 404:
                raise
            spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration,
                    "acquireTime": _micro(now), "renewTime": _micro(now),
                    "leaseTransitions": 0}
            try:
                self._stored(await self.kube.create(self.base, self._body(spec, None)))
            except ApiError as e2:
                if e2.status == 409:
                    return False
                raise
            self._renewed = now
            return True
        holder, expires = self.holder(obj)
        if holder and holder != self.identity and expires is not None and now < expires:
            return False
        spec = dict(obj.get("spec") or {})
        if holder != self.identity:
            spec["acquireTime"] = _micro(now)
            transitions = spec.get("leaseTransitions")
            spec["leaseTransitions"] = (transitions if isinstance(transitions, int) else 0) + (
                1 if holder else 0)
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=self.duration,
                    renewTime=_micro(now))
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        try:
            self._stored(await self.kube.put(self.path, self._body(spec, rv)))
        except ApiError as e:
            if e.status == 409:  # another agent wrote it first
                return False
            raise
        self._renewed = now
        return True

    async def acquire(self, retry: float | None = None) -> None:
        """Wait until this agent holds the Lease."""
        told = False
        while not await self.try_acquire():
            if not told:
                log.warning("another agent holds the Lease %s/%s of node %s: standing by",
                            self.namespace, self.name, self.node)
                told = True
            await asyncio.sleep(self.renew_every if retry is None else retry)
        log.info("holding the Lease %s/%s of node %s", self.namespace, self.name, self.node)

    async def renew(self) -> None:
        """Renew once; raises LeaseLost when another agent holds it now or the hold has
        run out."""
        now = self.clock()
        try:
            obj = await self.kube.get(self.path)
        except ApiError as e:
            if e.status == 404:
                raise LeaseLost(f"the Lease {self.name} was deleted") from None
            raise
        holder, _ = self.holder(obj)
        if holder != self.identity:
            raise LeaseLost(f"node {self.node}'s Lease is held by {holder or 'nobody'} now")
        if now - self._renewed > self.duration:
            raise LeaseLost(f"node {self.node}'s Lease was not renewed for "
                            f"{now - self._renewed:.0f}s")
        spec = dict(obj.get("spec") or {})
        spec["renewTime"] = _micro(now)
        rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
        try:
            self._stored(await self.kube.put(self.path, self._body(spec, rv)))
        except ApiError as e:
            if e.status == 409:  # written meanwhile: look again at the next renewal
                return
            raise
        self._renewed = now

    async def release(self) -> None:
        """Give the Lease up on a clean shutdown, so that the next agent of this node takes
        it at once instead of waiting for it to expire; a Lease held by another agent (or
        changed meanwhile) is left alone."""
        try:
            obj = await self.kube.get(self.path)
            if self.holder(obj)[0] != self.identity:
                return
            spec = dict(obj.get("spec") or {})
            spec.update(holderIdentity="", leaseDurationSeconds=1)
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or "")
            await self.kube.put(self.path, self._body(spec, rv))
            log.info("released the Lease %s/%s of node %s", self.namespace, self.name, self.node)
        except Exception as e:  # it expires by itself
            log.warning("releasing the Lease of node %s: %s", self.node, e)

    async def keep(self) -> None:
        """Renew every ``renew_every`` seconds until the Lease is lost (LeaseLost)."""
        while True:
            await asyncio.sleep(self.renew_every)
            try:
                await self.renew()
            except LeaseLost:
                raise
            except Exception as e:  # the API server away: retry until the hold runs out
                log.warning("renewing the Lease of node %s: %s", self.node, e)
                if self.clock() - self._renewed > self.duration:
                    raise LeaseLost(f"node {self.node}'s Lease could not be renewed: {e}"
                                    ) from None
