"""One node as the scheduler extender sees it: its NodeTopology read into a
:class:`NodeView` (the policy that decides there, the machine, what it holds, the pods it
lists), built once per ``resourceVersion``, and the keys that let nodes in the same state
share verdicts (:func:`held_key`). :class:`EntryReader` keeps the ``status.admitted``
entries it read, since a node republishes all its pods on every update."""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from numalign.api.effective import NodePolicy
from numalign.api.nodestatus import (
    HeldPod,
    held_from_admitted,
    held_from_status,
    ledger_from_held,
    machine_from_status,
    machine_source,
)
from numalign.api.reads import NodeTopologyRead
from numalign.topology.errors import TopologyError
from numalign.topology.ledger import ContainerAllocation, Ledger
from numalign.topology.machine import Machine

from .nodefree import NodeFree, node_free

__all__ = ["EntryReader", "KeptByIdentity", "NodeView", "held_key"]

K = TypeVar("K")
V = TypeVar("V")

log = logging.getLogger("numalign.extender")


@dataclass
class NodeView:
    """One node as its NodeTopology describes it: the policy that decides there, the
    machine, what it holds (``status.admitted`` and the kubelet's reserved CPUs), the
    pods it has admitted (uids, or ``namespace/name`` where an entry has no uid).
    ``machine`` None: unusable (``problem`` says why)."""

    name: str
    resource_version: str
    policy: NodePolicy
    machine: Machine | None
    held: tuple[HeldPod, ...] = ()
    admitted: frozenset[str] = frozenset()
    problem: str | None = None
    notes: tuple[str, ...] = ()
    machine_key: str = ""
    held_key: tuple[tuple[Any, ...], ...] = ()
    policy_id: str = ""  # the node's policy as text: nodes alike decide a pod alike
    raw_machine: tuple[Any, ...] = field(default=(), repr=False)  # what machine came from
    _ledger: Ledger | None = field(default=None, repr=False)
    # what the filter's fast verdicts read of the ledger (:meth:`free`), once read; a
    # view made from this one (``replace``) reads its own
    free_amounts: NodeFree | None = field(default=None, init=False, repr=False,
                                          compare=False)
    # the last state read with reservations (:meth:`state_with`): their identities, them
    # (held, so the identities stay theirs), the state
    _with: tuple[tuple[int, ...], tuple[HeldPod, ...], tuple[tuple[Any, ...], ...]] | None = (
        field(default=None, init=False, repr=False, compare=False))

    @classmethod
    def from_nodetopology(cls, nt: Mapping[str, Any],
                          machines: dict[str, Machine] | None = None,
                          previous: NodeView | None = None,
                          parse: Callable[[Mapping[str, Any], str], HeldPod] | None = None
                          ) -> NodeView:
        """Read a NodeTopology object (never raises: an unusable one gives a view with
        ``machine`` None). ``machines``: a table shared between views so that nodes of
        the same machine share one Machine object (and their verdicts); ``previous``:
        the node's last view, whose machine is kept when the fields it came from are
        unchanged (they are, but for a new agent: what changes is what it holds);
        ``parse``: reads one ``status.admitted`` entry (:class:`EntryReader`)."""
        read = NodeTopologyRead.of(nt)
        name = read.metadata.name or ""
        rv = read.metadata.resource_version or ""
        policy = NodePolicy.from_nodetopology(read)
        if not read.status.present:
            return cls(name, rv, policy, None, problem="NodeTopology has no status yet")
        status = nt["status"]  # the machine's parts, parsed strictly (machine_from_status)
        raw = machine_source(status)
        machine: Machine | None
        key: str
        if previous is not None and previous.machine is not None and previous.raw_machine == raw:
            machine, key = previous.machine, previous.machine_key
        else:
            # a digest of what describes the machine (the key of every verdict cached
            # for this node: the text itself would be kept once per cached verdict)
            key = hashlib.blake2b(json.dumps(raw, sort_keys=True, default=str).encode(),
                                  digest_size=16).hexdigest()
            machine = machines.get(key) if machines is not None else None
        if machine is None:
            try:
                machine = machine_from_status(status, name="node")
            except (TopologyError, ValueError, TypeError) as e:
                return cls(name, rv, policy, None, problem=f"NodeTopology {name}: {e}")
            if machines is not None:
                machines[key] = machine
        held, notes = held_from_status(read.status, name, parse)
        admitted = frozenset(_admitted_key(e) for e in read.status.admitted_entries)
        return cls(name, rv, policy, machine, tuple(held), admitted, None, tuple(notes),
                   machine_key=key, held_key=held_key(held), policy_id=policy.key,
                   raw_machine=raw)

    def without(self, uids: Collection[str]) -> NodeView:
        """This view less the pods ``uids`` (gone, or finished, before the node publishes
        that it released them)."""
        held = tuple(p for p in self.held if p.uid not in uids)
        if len(held) == len(self.held):
            return self
        return replace(self, held=held, held_key=held_key(held), _ledger=None)

    def state_with(self, reservations: Sequence[HeldPod]) -> tuple[tuple[Any, ...], ...]:
        """What the node holds with ``reservations`` besides what it lists, as one key
        (:attr:`held_key` and theirs, sorted); the last one kept: a node's reservations
        stay the same over many filters."""
        extra = tuple(r for r in reservations if not self.lists(r))
        if not extra:
            return self.held_key
        ids = tuple(map(id, extra))
        kept = self._with
        if kept is not None and kept[0] == ids:
            return kept[2]
        state = tuple(sorted((*self.held_key, *held_key(extra))))
        self._with = (ids, extra, state)
        return state

    def lists(self, held: HeldPod) -> bool:
        """The node's NodeTopology lists this pod (by uid, or by namespace and name)."""
        return held.uid in self.admitted or f"{held.namespace}/{held.name}" in self.admitted

    @property
    def usable(self) -> bool:
        return self.machine is not None

    def ledger(self) -> Ledger:
        """The node's ledger as published (built once; callers work on copies)."""
        if self.machine is None:
            raise ValueError(f"node {self.name}: {self.problem}")
        if self._ledger is None:
            ledger, more = ledger_from_held(self.machine, self.held)
            self._ledger = ledger
            self.notes = (*self.notes, *more)
        return self._ledger

    def free(self) -> NodeFree:
        """What the node's published ledger has free per NUMA node (:mod:`.nodefree`),
        kept on the view: a filter reads it for every node."""
        got = self.free_amounts
        if got is None:
            got = self.free_amounts = node_free(self.ledger())
        return got

    def ledger_with(self, reservations: Sequence[HeldPod]) -> Ledger:
        """The published ledger plus ``reservations`` (those it shows already, or that
        no longer fit, are left out); a copy when there are any."""
        base = self.ledger()
        extra = [r for r in reservations if not self.lists(r) and r.uid not in base.pods]
        if not extra:
            return base
        ledger = base.copy()
        for r in extra:
            try:
                ledger.allocate_many(r.uid, list(r.containers), pod_name=r.name,
                                     namespace=r.namespace)
            except TopologyError as e:
                # The node moved on (it shows other pods on some of it): hold what of it
                # is still free rather than nothing, so no room appears that the pod,
                # once admitted, takes.
                log.debug("node %s: reservation of pod %s/%s (%s) does not fit what the "
                          "node publishes (%s); holding what of it is free",
                          self.name, r.namespace, r.name, r.uid, e)
                ledger.allocate_many(r.uid, _still_free(ledger, r), pod_name=r.name,
                                     namespace=r.namespace)
        return ledger


def _still_free(ledger: Ledger, held: HeldPod) -> list[tuple[str, ContainerAllocation]]:
    """What of ``held`` ``ledger`` has free: its CPUs and devices nobody holds, its memory
    up to what each NUMA node has left."""
    used: dict[tuple[int, str], int] = {}
    taken: set[int] = set(ledger.cpu_owner)
    gone: set[tuple[str, str]] = set(ledger.device_owner)
    out = []
    for name, a in held.containers:
        memory: dict[str, dict[int, int]] = {}
        for kind, per in a.memory.items():
            for numa, b in per.items():
                left = max(0, min(b, ledger.free_memory(numa, kind) - used.get((numa, kind), 0)))
                used[(numa, kind)] = used.get((numa, kind), 0) + left
                if left:
                    memory.setdefault(kind, {})[numa] = left
        devices = {res: kept for res, ids in a.devices.items()
                   if (kept := tuple(dict.fromkeys(i for i in ids if (res, i) not in gone)))}
        gone.update((res, i) for res, ids in devices.items() for i in ids)
        cpus = tuple(dict.fromkeys(c for c in a.cpus if c not in taken))
        taken.update(cpus)
        out.append((name, ContainerAllocation(
            cpus=cpus, memory=memory,
            memory_mask=a.memory_mask, devices=devices, reusable=a.reusable)))
    return out


def _admitted_key(entry: Mapping[str, Any]) -> str:
    """A ``status.admitted`` entry's pod: its uid, else ``namespace/name`` (a real node's
    kubelet may list a pod the agent cannot name by uid)."""
    uid = entry.get("uid")
    return str(uid) if uid else f"{entry.get('namespace') or 'default'}/{entry.get('pod')}"


def _container_key(a: ContainerAllocation) -> tuple[Any, ...]:
    return (tuple(sorted(a.cpus)),
            tuple(sorted((t, tuple(sorted(per.items()))) for t, per in a.memory.items())),
            a.memory_mask, tuple(sorted(a.devices.items())))


def held_key(held: Iterable[HeldPod]) -> tuple[tuple[Any, ...], ...]:
    """What a set of held pods takes, independent of who holds it: two nodes of one
    machine holding equal keys decide every pod the same."""
    return tuple(sorted(_pod_key(p) for p in held))


class KeptByIdentity(Generic[K, V]):
    """``make(obj)`` kept for the last ``size`` objects asked, by identity (each kept
    object is held, so its id cannot be reused while kept): for values of objects that
    are asked again and again but cannot be hashed (a pod mapping, a held pod)."""

    def __init__(self, make: Callable[[K], V], size: int) -> None:
        self.make = make
        self.size = size
        self._kept: OrderedDict[int, tuple[K, V]] = OrderedDict()

    def __call__(self, obj: K) -> V:
        hit = self._kept.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
        value = self.make(obj)
        self._kept[id(obj)] = (obj, value)
        if len(self._kept) > self.size:
            self._kept.popitem(last=False)
        return value


# what one held pod takes (a reservation is keyed again on every filter until its node
# lists it)
_pod_key = KeptByIdentity[HeldPod, tuple[Any, ...]](
    lambda p: tuple(sorted(_container_key(a) for _, a in p.containers)), 8192)


class EntryReader:
    """Reads ``status.admitted`` entries, keeping the last ``size`` read by pod uid: a
    node publishes all its pods on every update, and most of them as before."""

    def __init__(self, size: int = 50_000) -> None:
        self.size = size
        self._read: OrderedDict[str, tuple[Mapping[str, Any], HeldPod]] = OrderedDict()

    def __call__(self, entry: Mapping[str, Any], where: str) -> HeldPod:
        uid = entry.get("uid")
        if not isinstance(uid, str) or not uid:
            return held_from_admitted(entry, where)
        hit = self._read.get(uid)
        if hit is not None and hit[0] == entry:
            return hit[1]
        held = held_from_admitted(entry, where)
        self._read[uid] = (entry, held)
        if len(self._read) > self.size:
            self._read.popitem(last=False)
        return held
