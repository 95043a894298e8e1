"""In-flight reservations: what the extender approved for a pod, held on the node the pod
was bound to until that node's NodeTopology shows the pod (``status.admitted`` has its
uid), the pod goes away or finishes, or ``timeout`` seconds pass.

A burst of pods is filtered faster than the agents publish; without reservations every
pod of the burst would see the same free NUMA node. After a restart they are rebuilt from
the pods bound but not yet published (:meth:`numalign.extender.fleet.Fleet.load`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from numalign.api.nodestatus import HeldPod

DEFAULT_TIMEOUT = 120.0


@dataclass(frozen=True)
class Reservation:
    node: str
    held: HeldPod
    since: float  # monotonic seconds

    @property
    def uid(self) -> str:
        return self.held.uid


class Reservations:
    """Reservations by node and by pod uid (one per pod)."""

    def __init__(self, timeout: float = DEFAULT_TIMEOUT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout = timeout
        self.clock = clock
        self._by_uid: dict[str, Reservation] = {}
        self._by_node: dict[str, dict[str, Reservation]] = {}

    def __len__(self) -> int:
        return len(self._by_uid)

    def __contains__(self, uid: object) -> bool:
        return uid in self._by_uid

    def get(self, uid: str) -> Reservation | None:
        return self._by_uid.get(uid)

    def add(self, node: str, held: HeldPod) -> Reservation:
        self.drop(held.uid)
        r = Reservation(node, held, self.clock())
        self._by_uid[held.uid] = r
        self._by_node.setdefault(node, {})[held.uid] = r
        return r

    def drop(self, uid: str) -> Reservation | None:
        r = self._by_uid.pop(uid, None)
        if r is not None:
            per = self._by_node.get(r.node)
            if per is not None:
                per.pop(uid, None)
                if not per:
                    del self._by_node[r.node]
        return r

    def on_node(self, node: str, exclude: str | None = None) -> list[HeldPod]:
        """What ``node`` holds for pods not published yet (less the pod ``exclude``)."""
        per = self._by_node.get(node)
        if not per:
            return []
        return [r.held for uid, r in per.items() if uid != exclude]

    def nodes(self) -> list[str]:
        return list(self._by_node)

    def among(self, nodes: Sequence[str]) -> list[str]:
        """Those of ``nodes`` holding any reservation."""
        return _among(self._by_node, nodes)

    def published(self, node: str, admitted: Iterable[str]) -> list[Reservation]:
        """The node now lists ``admitted`` (uids, or ``namespace/name`` where it names a
        pod without its uid): drop the reservations it shows."""
        per = self._by_node.get(node)
        if not per:
            return []
        listed = set(admitted)
        shown = [uid for uid, r in per.items()
                 if uid in listed or f"{r.held.namespace}/{r.held.name}" in listed]
        return [r for uid in shown if (r := self.drop(uid)) is not None]

    def expire(self) -> list[Reservation]:
        """Drop the reservations older than the timeout."""
        limit = self.clock() - self.timeout
        old = [uid for uid, r in self._by_uid.items() if r.since < limit]
        return [r for uid in old if (r := self.drop(uid)) is not None]


IN_FLIGHT_TTL = 5.0


def _among(by_node: Mapping[str, Any], nodes: Sequence[str]) -> list[str]:
    """Those of ``nodes`` that are keys of ``by_node`` (walking the smaller of the two)."""
    if not by_node:
        return []
    if len(by_node) < len(nodes):
        wanted = set(nodes)
        return [n for n in by_node if n in wanted]
    return [n for n in nodes if n in by_node]


class InFlight:
    """What filter approved for pods not bound yet: each such pod is counted on every
    node it was approved for, until it is bound (by the extender's bind verb, or seen
    bound on the pod watch), goes away, is filtered again, or ``ttl`` seconds pass.

    The scheduler filters the next pod as soon as it has picked a node for the previous
    one, before that pod is bound: without this, two pods of a burst could be approved
    for the last room of one NUMA node. Each approval also keeps the nodes the pod
    passed (covered or not): the bind verb binds a pod only to one of them."""

    def __init__(self, ttl: float = IN_FLIGHT_TTL,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.clock = clock
        self._by_uid: dict[str, Approval] = {}
        self._by_node: dict[str, dict[str, HeldPod]] = {}

    def __len__(self) -> int:
        return len(self._by_uid)

    def approve(self, pod: Mapping[str, Any], uid: str, holds: dict[str, HeldPod],
                passed: Iterable[str] = ()) -> None:
        """``pod`` passed the nodes ``passed`` and would hold ``holds`` (by node) on those
        of them that hold anything (replacing what it had)."""
        self.drop(uid)
        nodes = frozenset(passed) | frozenset(holds)
        if not nodes:
            return
        self._by_uid[uid] = Approval(self.clock(), pod, holds, nodes)
        for node, held in holds.items():
            self._by_node.setdefault(node, {})[uid] = held

    def approved(self, uid: str, node: str) -> Mapping[str, Any] | None:
        """The pod ``uid`` as filter approved it for ``node`` (within ``ttl``), else None."""
        a = self._by_uid.get(uid)
        if a is None or node not in a.nodes or a.since < self.clock() - self.ttl:
            return None
        return a.pod

    def complete(self, uid: str, holds: Mapping[str, HeldPod]) -> None:
        """What the approved pod ``uid`` would hold on some of its nodes, now decided in
        full (its undecided holds there replaced)."""
        a = self._by_uid.get(uid)
        if a is None:
            return
        for node, held in holds.items():
            per = self._by_node.get(node)
            if per is not None and uid in per and not a.holds[node].containers:
                a.holds[node] = held
                per[uid] = held

    def heading(self, uid: str, node: str) -> None:
        """The bind verb for the pod ``uid`` names ``node``: it no longer counts in flight
        on its other nodes (it goes there or back to the scheduler's queue, to be filtered
        again), and the pods approved after it for those nodes need not wait for it
        (:meth:`before`)."""
        a = self._by_uid.get(uid)
        if a is None:
            return
        for other in a.holds:
            if other != node:
                self._forget(other, uid)

    def _forget(self, node: str, uid: str) -> None:
        per = self._by_node.get(node)
        if per is not None:
            per.pop(uid, None)
            if not per:
                del self._by_node[node]

    def drop(self, uid: str) -> list[str]:
        """The pod ``uid`` is no longer in flight: the nodes where it counted."""
        entry = self._by_uid.pop(uid, None)
        if entry is None:
            return []
        out = [n for n in entry.holds if uid in self._by_node.get(n, ())]
        for node in out:
            self._forget(node, uid)
        return out

    def on_node(self, node: str, exclude: str | None = None
                ) -> list[tuple[Mapping[str, Any], HeldPod]]:
        """The pods in flight that may come to ``node`` (oldest first), with what they
        were approved to hold there: not those whose bind verb names another node (a
        pod goes only where its binding names, or back to the scheduler's queue and is
        filtered again)."""
        per = self._by_node.get(node)
        if not per:
            return []
        limit = self.clock() - self.ttl
        out = []
        for uid, held in per.items():
            a = self._by_uid[uid]
            if uid != exclude and a.since >= limit:
                out.append((a.pod, held))
        return out

    def among(self, nodes: Sequence[str]) -> list[str]:
        """Those of ``nodes`` with any pod in flight."""
        return _among(self._by_node, nodes)

    def before(self, uid: str, node: str) -> list[str]:
        """The pods approved for ``node`` before ``uid`` (its last approval) and still
        in flight, less those whose bind verb names another node: the pods ``uid`` was
        decided after there that may still land there."""
        per = self._by_node.get(node)
        if not per or uid not in per:
            return []
        limit = self.clock() - self.ttl
        out = []
        for other in per:  # (a pod whose bind verb names another node is not here)
            if other == uid:
                break
            if self._by_uid[other].since >= limit:
                out.append(other)
        return out

    def expire(self) -> list[str]:
        limit = self.clock() - self.ttl
        old = [uid for uid, a in self._by_uid.items() if a.since < limit]
        for uid in old:
            self.drop(uid)
        return old


@dataclass(frozen=True)
class Approval:
    """One pod in flight: when filter approved it, the pod, what it would hold on each
    node that holds anything, and every node it passed."""

    since: float
    pod: Mapping[str, Any]
    holds: dict[str, HeldPod]
    nodes: frozenset[str]
