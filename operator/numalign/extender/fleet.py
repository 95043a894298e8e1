"""What the extender knows of the cluster: every node's NodeTopology (as
:class:`~numalign.extender.decide.Decider` views), the in-flight reservations, and the
pods it saw bound. Fed by the NodeTopology and Pod watches, asked by filter and
prioritize; synchronous and free of I/O (the server runs it on one event loop).

- A pod filter approved is counted on every node it was approved for while it is in
  flight (:class:`~.reservations.InFlight`: the scheduler filters the next pod before
  this one is bound).
- A pod bound (by the bind verb, :meth:`Fleet.claim`, or seen with ``spec.nodeName`` on
  the pod watch, not finished) that its node does not list yet gets a reservation: what
  the node will give it, decided as the node decides it, after the pods bound there
  before it (:meth:`Decider.hold`). Not what filter approved: that may have been decided
  without a pod in flight that has landed there since, and the node, admitting that
  pod first, gives this one other CPUs, even other NUMA nodes.
- A NodeTopology update drops the reservations of the pods it lists.
- A pod deleted or finished drops its reservation and, while its node still lists it,
  is decided as released (:meth:`Decider.release`): the scheduler retries parked pods
  on that very pod event, and the extender must already see the room it frees.
- After a restart, :meth:`load_pods` rebuilds the reservations from the pods bound, not
  finished and not listed by their node (running ones too: an agent busy with a burst
  publishes a node every few seconds).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from numalign.api.nodestatus import HeldPod

from .decide import Decider, Verdict
from .pending import slim
from .reservations import InFlight, Reservation, Reservations

log = logging.getLogger("numalign.extender")

JSON = dict[str, Any]
TERMINAL = ("Succeeded", "Failed")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def pod_uid(pod: Mapping[str, Any]) -> str:
    meta = _meta(pod)
    uid = meta.get("uid")
    return str(uid) if uid else f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def pod_node(pod: Mapping[str, Any]) -> str | None:
    spec = pod.get("spec")
    node = spec.get("nodeName") if isinstance(spec, Mapping) else None
    return str(node) if node else None


def undecided(pod: Mapping[str, Any], verdict: Verdict) -> HeldPod | None:
    """The hold of a pod a fast verdict admitted (nothing known of it yet), or None
    when it was not admitted."""
    if not verdict.fits or not verdict.covered:
        return None
    meta = _meta(pod)
    ns = str(meta.get("namespace") or "default")
    name = str(meta.get("name") or "")
    return HeldPod(str(meta.get("uid") or f"{ns}/{name}"), name, ns, ())


def is_finished(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status")
    return isinstance(status, Mapping) and status.get("phase") in TERMINAL


class Fleet:
    def __init__(self, decider: Decider | None = None,
                 reservations: Reservations | None = None,
                 in_flight: InFlight | None = None) -> None:
        self.decider = decider if decider is not None else Decider()
        self.reservations = reservations if reservations is not None else Reservations()
        self.in_flight = in_flight if in_flight is not None else InFlight(
            clock=self.reservations.clock)
        self.bound: dict[str, str] = {}  # uid -> node, pods whose binding was handled
        # seconds one pod's filter may spend deciding (None: no bound); the nodes left
        # when it runs out pass undecided, so no pod holds up the others (and the probes)
        self.budget: float | None = None
        # filter leaves nodes whose pods in flight must be decided way by way for last
        # (Decider.filter's ``defer``)
        self.defer = True
        # what the last filter gave (pod uid and resourceVersion, verdicts by node):
        # prioritize right after it answers from it on the nodes not changed since
        # (``touched``; None: any may have)
        self._last: tuple[tuple[str, str], dict[str, Verdict]] | None = None
        self.touched: set[str] | None = set()

    def _touch(self, nodes: Iterable[str]) -> None:
        """What ``nodes`` hold changed (the last filter's verdicts there are stale)."""
        if self.touched is not None:
            self.touched.update(nodes)

    # ------------------------------------------------------------ NodeTopology

    def node_topology(self, event: str, nt: Mapping[str, Any]) -> None:
        """A NodeTopology watch event (ADDED, MODIFIED, DELETED)."""
        name = str(_meta(nt).get("name") or "")
        if not name:
            return
        self._touch((name,))
        if event == "DELETED":
            self.decider.remove(name)
            for held in self.reservations.on_node(name):
                self.reservations.drop(held.uid)
            return
        view = self.decider.update(nt)
        self.reservations.published(name, view.admitted)

    def load_nodetopologies(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full listing: the nodes not in it are forgotten."""
        names = set()
        for nt in items:
            names.add(str(_meta(nt).get("name") or ""))
            self.node_topology("ADDED", nt)
        for name in list(self.decider.views):
            if name not in names:
                self.node_topology("DELETED", {"metadata": {"name": name}})

    # ------------------------------------------------------------ pods

    def pod(self, event: str, pod: Mapping[str, Any]) -> None:
        """A Pod watch event (ADDED, MODIFIED, DELETED); only what :func:`slim` keeps of
        the pod is kept."""
        pod = slim(pod)
        uid = pod_uid(pod)
        node = pod_node(pod)
        if event == "DELETED" or is_finished(pod):
            gone = self.reservations.drop(uid)
            self._touch(self.in_flight.drop(uid))
            self.bound.pop(uid, None)
            if gone is not None:
                self._touch((gone.node,))
            if node is not None:
                self._touch((node,))
                meta = _meta(pod)
                for key in (uid, f"{meta.get('namespace') or 'default'}/{meta.get('name')}"):
                    self.decider.release(node, key)
            return
        if node is None or self.bound.get(uid) == node:
            return
        self.bound_to(pod, node)

    def bound_to(self, pod: Mapping[str, Any], node: str) -> None:
        """``pod`` is bound to ``node``: it is no longer in flight, and holds there, until
        its node lists it, what the node will give it."""
        uid = pod_uid(pod)
        self.bound[uid] = node
        self._touch((node, *self.in_flight.drop(uid)))
        view = self.decider.view(node)
        if view is None or uid in view.admitted:
            return
        held = self.decider.hold(pod, node, self.reservations.on_node(node, exclude=uid))
        if held is not None:
            self.reservations.add(node, held)

    def approved(self, uid: str, node: str) -> Mapping[str, Any] | None:
        """The pod ``uid`` as filter approved it for ``node`` lately, or None."""
        return self.in_flight.approved(uid, node)

    def claim(self, uid: str, node: str) -> Mapping[str, Any] | None:
        """The bind verb asks to bind the pod ``uid`` to ``node``: the pod as filter
        approved it for that node (then it counts as bound there, :meth:`bound_to`),
        or None when this process did not approve it there (lately): it binds only what
        it approved, onto a node it decided itself."""
        pod = self.approved(uid, node)
        if pod is not None:
            self.bound_to(pod, node)
        return pod

    def unclaim(self, uid: str, node: str) -> None:
        """The binding of a claimed pod failed: it holds nothing on ``node`` (the
        scheduler retries it, or the pod watch shows where it went)."""
        if self.bound.get(uid) == node:
            self._touch((node,))
            del self.bound[uid]
            self.reservations.drop(uid)

    def load_pods(self, items: Iterable[Mapping[str, Any]]) -> None:
        """A full listing of the pods (after the NodeTopology listing): reservations for
        the pods bound but not listed by their node, rebuilt; the rest forgotten."""
        present: set[str] = set()
        for pod in items:
            present.add(pod_uid(pod))
            self.pod("ADDED", pod)
        for uid in list(self.bound):
            if uid not in present:
                self.pod("DELETED", {"metadata": {"uid": uid}, "spec": {
                    "nodeName": self.bound[uid]}})

    def expire(self) -> list[Reservation]:
        if self.in_flight.expire():
            self.touched = None  # (rare: pods in flight that never bound)
        gone = self.reservations.expire()
        self._touch(r.node for r in gone)
        return gone

    # ------------------------------------------------------------ verbs

    def filter(self, pod: Mapping[str, Any], nodes: Sequence[str],
               approve: bool = True) -> list[Verdict]:
        """Verdicts for ``pod`` on ``nodes``, counting what is reserved and in flight
        there; ``approve`` (filter): pass or refuse, nodes alike sharing one decision
        (an admission may come without its allocation and score: :mod:`.feasible`),
        and the pod is then in flight on the nodes it fits. Else (prioritize): complete
        verdicts, those of the pod's last filter on the nodes nothing changed on since;
        the pod's in-flight holds then name what it would take on those nodes."""
        uid = pod_uid(pod)
        # (claims changing meanwhile, and pods in flight whose bind verb named another
        # node since, which only frees room, leave prioritize's ranking as filter saw it)
        seen = (uid, str(_meta(pod).get("resourceVersion") or ""))
        last: dict[str, Verdict] = {}
        if (not approve and self._last is not None and self._last[0] == seen
                and self.touched is not None):
            touched = self.touched
            last = {n: v for n, v in self._last[1].items() if n not in touched}
            if all(n in last and last[n].complete for n in nodes):
                return [last[n] for n in nodes]
        # prioritize right after filter: only the fast admissions are decided again
        ask = [n for n in nodes if n not in last or not last[n].complete]
        # (only the nodes holding any: most hold none)
        held = {n: self.reservations.on_node(n, exclude=uid)
                for n in self.reservations.among(ask)}
        flying = {n: self.in_flight.on_node(n, exclude=uid) for n in self.in_flight.among(ask)}
        verdicts = self.decider.filter(pod, ask, held, flying, budget=self.budget,
                                       complete=not approve, defer=approve and self.defer)
        if not approve:
            self.in_flight.complete(uid, {v.node: h for v in verdicts
                                          if (h := v.held_by(pod)) is not None})
            if last:
                got = {v.node: v for v in verdicts}
                verdicts = [got[n] if n in got else last[n] for n in nodes]
        if approve:
            # a fast admission holds what the node will decide for it: unknown yet
            # (an empty hold: the next pods decide it on that node first)
            holds = {v.node: h for v in verdicts
                     if (h := v.held_by(pod) if v.complete else undecided(pod, v))
                     is not None}
            # a node passed without deciding (no NodeTopology, or not decided) is no
            # approval: the bind verb leaves such pods to the scheduler
            self.in_flight.approve(pod, uid, holds,
                                   (v.node for v in verdicts if v.fits and v.covered))
            self._last = (seen, {v.node: v for v in verdicts})
            self.touched = set()
        return verdicts
