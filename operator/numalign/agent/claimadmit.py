"""An emulated node admits a pod with ResourceClaims as the kubelet would admit it with
device-plugin devices on the same NUMA nodes.

kube-scheduler allocates the pod's claims (writing the devices in each claim's
``status.allocation``) before it binds the pod, so once bound the claims are facts: the
agent reads them by name (GET, in the pod's namespace: its RBAC allows reading
resourceclaims), maps their devices to NUMA nodes through the node's ResourceSlices
(:mod:`numalign.api.draclaims`) and admits the pod with them as fixed hints (the ``dra``
resource kind, :mod:`numalign.topology.managers.dra`), under the pod's own policy. A claim
not yet readable or allocated is read again for a while (:data:`WAIT_SECONDS`), then the
pod is rejected (``UnexpectedAdmissionError``, naming the claim). An allocated device
whose NUMA nodes cannot be told gives no hint; the pod gets a Warning event saying which
device and why (:data:`DEVICE_PROBLEM_REASON`). A pod refused by its policy gets an event
naming the devices it was decided with (:data:`REJECTED_DEVICES_REASON`): its claims are
released once it failed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from numalign.api.dra import NodeDraDevices
from numalign.api.draclaims import (
    DEVICE_PROBLEM_REASON,
    REJECTED_DEVICES_REASON,
    KindOf,
    PodDraDevices,
    claim_path,
    emulated_kind_of,
    pod_claims,
    pod_dra_devices,
    uses_claims,
)
from numalign.api.kube import ApiError, Kube
from numalign.topology.admit import ProviderKind
from numalign.topology.managers.dra import DraDevices

from .state import NodeState

log = logging.getLogger(__name__)

WAIT_SECONDS = 30.0  # how long a bound pod's claims may take to read as allocated
RETRY_SECONDS = 0.5
UNREADY_REASON = "UnexpectedAdmissionError"


async def read_claims(kube: Kube, pod: Mapping[str, Any]
                      ) -> tuple[dict[str, Mapping[str, Any] | None], dict[str, str]]:
    """The pod's ResourceClaim objects by name (None: not found), and why those that
    could not be read were not."""
    ns = str((pod.get("metadata") or {}).get("namespace") or "default")
    out: dict[str, Mapping[str, Any] | None] = {}
    errors: dict[str, str] = {}
    for ref in pod_claims(pod)[0]:
        if ref.claim and ref.claim not in out:
            try:
                out[ref.claim] = await kube.get_or_none(claim_path(ns, ref.claim))
            except ApiError as e:
                errors[ref.claim] = f"ResourceClaim {ns}/{ref.claim}: cannot read it: {e}"
    return out, errors


async def pod_devices(kube: Kube, pod: Mapping[str, Any],
                      node: Callable[[], NodeDraDevices | None],
                      machine: Collection[int], kind_of: KindOf, *,
                      wait: float = WAIT_SECONDS, retry: float = RETRY_SECONDS,
                      not_ready: Callable[[], None] | None = None
                      ) -> tuple[PodDraDevices, bool]:
    """The pod's claims and devices once all are allocated and the node's slices are
    read, and True; or, once ``wait`` has passed, as they stand and False. ``node``: the
    node's DRA devices as read now (None: not yet); ``not_ready``: called each time a
    read finds them not all allocated (or the slices not read) yet."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    while True:
        claims, errors = await read_claims(kube, pod)
        devices = node()
        got = pod_dra_devices(pod, claims, None if devices is None else devices.devices,
                              machine, kind_of)
        ready = got.ready and devices is not None
        if ready or loop.time() >= deadline:
            for i, c in enumerate(got.claims):  # not "not found": it could not be read
                if c.claim.claim in errors:
                    got.claims[i] = replace(c, problem=errors[c.claim.claim])
                    log.warning("pod %s: %s", (pod.get("metadata") or {}).get("name"),
                                errors[c.claim.claim])
            return got, ready
        if not_ready is not None:
            not_ready()
        await asyncio.sleep(retry)


@dataclass
class Verdict:
    """What reading a bound pod's claims says: the kinds to admit it with, or why it is
    refused; and a warning for its devices that give no hint."""

    kinds: list[ProviderKind] = field(default_factory=list)
    refusal: str | None = None
    warning: str | None = None
    devices: PodDraDevices | None = None


async def verdict(kube: Kube, st: NodeState, pod: Mapping[str, Any], *,
                  wait: float = WAIT_SECONDS,
                  not_ready: Callable[[], None] | None = None) -> Verdict:
    """Read the claims of ``pod`` bound to the emulated node of ``st`` (``not_ready``:
    as :func:`pod_devices` takes it)."""
    got, ready = await pod_devices(kube, pod, lambda: st.dra, st.machine.numa_ids,
                                   emulated_kind_of(st.machine), wait=wait,
                                   not_ready=not_ready)
    if not ready:
        return Verdict(refusal=unready_message(got), devices=got)
    return Verdict([dra_kind(got)], warning=device_problem_message(got), devices=got)


# how long a node's later pods wait for a pod whose claims were read as not allocated
ORDER_WAIT = 2.0


class Queue:
    """A node's pods waiting to be decided, in the order they were bound."""

    def __init__(self) -> None:
        self.pods: dict[str, Mapping[str, Any]] = {}  # uid -> pod, in order
        # pods whose claims a read found not allocated yet -> when it first did
        self.unallocated: dict[str, float] = {}
        self.passed: set[str] = set()  # such pods the later ones went past
        self.timer = False

    @property
    def uids(self) -> Collection[str]:
        return self.pods.keys()

    def add(self, uid: str, pod: Mapping[str, Any]) -> None:
        self.pods[uid] = pod

    def remove(self, uid: str) -> None:
        self.pods.pop(uid, None)
        self.unallocated.pop(uid, None)
        self.passed.discard(uid)


class ClaimAdmission:
    """The emulator's part for pods with claims (mixed into
    :class:`numalign.agent.emulate.Emulator`, which gives what is declared here)."""

    kube: Kube
    _claims_reading: set[str]  # pods whose claims are being read
    _order: dict[str, Queue]  # node -> its pods deciding in bind order
    _claim_verdicts: dict[str, Verdict]  # pods whose claims were read, not decided yet
    _finalizing: set[str]
    _seen: dict[str, float]
    publisher: Any

    def _spawn(self, coro: Any) -> None:
        raise NotImplementedError

    async def _event(self, st: NodeState, pod: Mapping[str, Any], reason: str,
                     message: str) -> None:
        raise NotImplementedError

    async def _write_rejected(self, st: NodeState, pod: Mapping[str, Any], reason: str,
                              message: str, problem: str | None) -> None:
        raise NotImplementedError

    def _decide(self, st: NodeState, pod: Mapping[str, Any],
                devices: Sequence[ProviderKind] = ()) -> None:
        raise NotImplementedError

    # A pod with claims is decided once its claims are read (a GET, usually a few ms;
    # up to WAIT_SECONDS when they are not allocated yet). The pods bound to the node
    # after it wait for it: the node decides its pods in the order they were bound, as
    # the kubelet admits them one after another, and as the scheduler extender counted
    # them (each pod's hold decided with those bound before it). Deciding a later pod
    # first could give it the CPUs the earlier pod was counted on, next to that pod's
    # device, and refuse the earlier pod (the DRA placement bench saw that). They wait
    # while its claims are being read (however slow the API server is to answer: the
    # read's own timeout bounds it), and ORDER_WAIT more once a read found them not
    # allocated (kube-scheduler allocates a pod's claims before it binds the pod, so
    # that is an exception: such a pod is decided on its own once they are).

    def _admit_in_order(self, st: NodeState, pod: Mapping[str, Any]) -> None:
        """Queue ``pod`` (bound to ``st``'s node) behind the pods bound before it that
        are not decided yet; read its claims when it has any."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        q = self._order.setdefault(st.name, Queue())
        if uid in q.uids:
            return
        q.add(uid, pod)
        if uses_claims(pod) and uid not in self._claims_reading:
            self._claims_reading.add(uid)
            self._spawn(self._read_then_drain(st, pod))
        self._drain(st)

    async def _read_then_drain(self, st: NodeState, pod: Mapping[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        def not_ready() -> None:
            q = self._order.get(st.name)
            if q is not None and uid in q.pods and uid not in q.unallocated:
                q.unallocated[uid] = asyncio.get_running_loop().time()
                self._drain(st)

        try:
            self._claim_verdicts[uid] = await verdict(self.kube, st, pod, not_ready=not_ready)
        finally:
            self._claims_reading.discard(uid)
            self._drain(st)

    def _drain(self, st: NodeState) -> None:
        """Decide the node's queued pods in order, up to the first whose claims are
        still being read (past it once a read found them not allocated ORDER_WAIT ago:
        such a pod holds the node's other pods up no longer)."""
        q = self._order.get(st.name)
        if q is None:
            return
        loop = asyncio.get_running_loop()
        for uid, pod in list(q.pods.items()):
            if uses_claims(pod) and uid not in self._claim_verdicts:
                if uid not in self._claims_reading:  # the read failed: nothing to decide
                    q.remove(uid)
                    continue
                since = q.unallocated.get(uid)
                if since is None:  # the first read is under way: its end drains again
                    return
                left = ORDER_WAIT - (loop.time() - since)
                if left > 0:
                    if not q.timer:
                        q.timer = True
                        loop.call_later(left, self._redrain, st)
                    return
                if uid not in q.passed and any(u != uid for u in q.pods):
                    q.passed.add(uid)
                    log.warning("%s: pods bound after %s/%s are decided before it: its "
                                "claims were not allocated %gs after it was bound", st.name,
                                (pod.get("metadata") or {}).get("namespace"),
                                (pod.get("metadata") or {}).get("name"), ORDER_WAIT)
                continue  # decided on its own once read
            q.remove(uid)
            v = self._claim_verdicts.pop(uid, None)
            if v is not None:
                self._admit_with_claims(st, pod, v)
            elif uid not in st.decided and uid not in self._finalizing and uid in self._seen:
                self._decide(st, pod)
        if not q.pods:
            del self._order[st.name]

    def _redrain(self, st: NodeState) -> None:
        q = self._order.get(st.name)
        if q is not None:
            q.timer = False
            self._drain(st)

    def _admit_with_claims(self, st: NodeState, pod: Mapping[str, Any], v: Verdict) -> None:
        """Admit the bound pod with its claims' devices (or refuse it)."""
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if uid in st.decided or uid in self._finalizing or uid not in self._seen:
            return  # decided, deleted or gone meanwhile
        if v.warning:
            self._spawn(self._event(st, pod, DEVICE_PROBLEM_REASON, v.warning))
        if v.refusal is not None:
            st.refuse(pod, UNREADY_REASON, v.refusal)
            self.publisher.mark(st.name)
            self._spawn(self._write_rejected(st, pod, UNREADY_REASON, v.refusal, None))
        else:
            self._decide(st, pod, v.kinds)
            if st.decided.get(uid) is False and v.devices is not None:
                # the claims are released once the pod failed: say what it was refused with
                self._spawn(self._event(st, pod, REJECTED_DEVICES_REASON,
                                        devices_message(v.devices)))


def dra_kind(got: PodDraDevices) -> DraDevices:
    """The ``dra`` resource kind of the pod's admission."""
    return DraDevices(got.requests())


def unready_message(got: PodDraDevices) -> str:
    """Why a pod with claims cannot be admitted yet (each claim named)."""
    why = [f"claim {c.claim.name}: {c.problem or 'not allocated'}"
           for c in got.claims if not c.allocated]
    return "DRA: " + ("; ".join(why) or "this node's ResourceSlices are not read yet")


def devices_message(got: PodDraDevices) -> str:
    """The claim devices a pod was decided with, and their NUMA nodes."""
    parts = []
    for c in got.claims:
        for d in c.devices:
            numa = ",".join(map(str, d.numa_nodes)) if d.numa_nodes else "unknown"
            parts.append(f"claim {c.claim.name} request {d.request}: {d.id} on NUMA {numa}")
    return ("decided with DRA devices: " + "; ".join(parts))[:1000]


def device_problem_message(got: PodDraDevices) -> str | None:
    """The Warning event's message for allocated devices that give no hint, or None."""
    problems = got.device_problems() + got.problems
    if not problems:
        return None
    return "DRA devices without a NUMA hint (not aligned): " + "; ".join(problems)[:900]


__all__ = [
    "DEVICE_PROBLEM_REASON",
    "UNREADY_REASON",
    "Verdict",
    "device_problem_message",
    "dra_kind",
    "emulated_kind_of",
    "pod_devices",
    "read_claims",
    "unready_message",
    "verdict",
]
