"""DRA devices as a hint provider: the devices kube-scheduler allocated to a pod's
ResourceClaims, as fixed hints (pure).

The kubelet's Topology Manager never sees DRA devices; numalign aligns them as it aligns
device-plugin devices the kubelet's device manager already gave a container (on a
numalign-managed node: ``numalign.agent.nri.devices``). Once a claim is allocated its
devices are facts, not choices, and the hints are those the device manager regenerates
for devices already allocated (``generateDeviceTopologyHints`` with the allocated
devices as the only ones available). One claim request (:class:`DraRequest`, hint map
key ``dra:<pod claim>/<request>``) plays one extended resource:

- every NUMA mask, over the NUMA nodes of the devices of its kind on the node (its
  ``peers``), holding at least as many of the unit's allocated devices as the unit has
  is a hint (a device on several NUMA nodes counts in a mask holding any of them); the
  narrowest such masks over all its peers are preferred;
- a device whose NUMA node is unknown gives no hint (it is not counted); a request none
  of whose devices has a known NUMA node gives no preference (None);
- nothing is allocated: the devices are the scheduler's; :meth:`DraProvider.report`
  gives, per container, its devices (``driver/pool/device``) per request key.

So the pod's own policy (single-numa-node, restricted, best-effort, none; container or
pod scope) decides exactly as the kubelet would for device-plugin devices on the same
NUMA nodes, and rejects with its ``TopologyAffinityError``.

API: build a :class:`DraDevices` kind for one pod's admission from, per container
name, its :class:`DraRequest`s (``numalign.api.draclaims`` makes them from the pod, its
ResourceClaims and the node's ResourceSlices: ``PodDraDevices.requests()``), and pass it
to ``admit_pod(providers=[kind])`` (the agent: ``NodeState.decide(devices=[kind])``).
It is not registered globally: its facts belong to one pod.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..demands import iterate_masks
from ..hints import NumaMask, TopologyHint
from ..ledger import ContainerAllocation
from ..pod import Container
from .base import Admission, Ask

NAME = "dra"
KEY_PREFIX = "dra:"

NumaNodes = tuple[int, ...] | None


@dataclass(frozen=True)
class DraDeviceRef:
    """One allocated device: its driver, pool and name, and its NUMA nodes (None:
    unknown)."""

    driver: str
    pool: str
    device: str
    numa_nodes: NumaNodes

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True)
class DraRequest:
    """The devices of one claim request a container uses.

    ``claim``: the pod's name for the claim (``spec.resourceClaims[].name``);
    ``request``: the claim's request (the main request of ``<main>/<sub>``);
    ``devices``: the devices allocated to it; ``peers``: the NUMA nodes of every device
    of its kind on the node (the allocated ones included; the preferred hints' width
    comes from them, as from all devices of an extended resource)."""

    claim: str
    request: str
    devices: tuple[DraDeviceRef, ...]
    peers: tuple[NumaNodes, ...] = ()

    @property
    def key(self) -> str:
        return request_key(self.claim, self.request)


def request_key(claim: str, request: str) -> str:
    """The hint map's name of a claim request: ``dra:<claim>/<request>``."""
    return f"{KEY_PREFIX}{claim}/{request}"


def _any_in(mask: NumaMask, nodes: NumaNodes, machine: Collection[int]) -> bool:
    return nodes is not None and any(n in machine and mask >> n & 1 for n in nodes)


def device_hints(allocated: Iterable[NumaNodes], peers: Iterable[NumaNodes],
                 machine: Collection[int]) -> list[TopologyHint] | None:
    """The device manager's hints for devices already allocated on NUMA nodes
    ``allocated`` (None: unknown, not counted) among devices of their kind on ``peers``,
    on a machine with NUMA nodes ``machine``; None: no preference."""
    known = [n for n in allocated if n is not None]
    pool = [n for n in peers if n is not None] or known
    domain = tuple(sorted({i for nodes in pool + known for i in nodes} & set(machine)))
    if not known or not domain:
        return None
    count = len(known)
    narrowest = len(domain)
    masks: list[NumaMask] = []
    for mask in iterate_masks(domain):
        if sum(1 for n in pool if _any_in(mask, n, machine)) >= count:
            narrowest = min(narrowest, mask.bit_count())
        if sum(1 for n in known if _any_in(mask, n, machine)) >= count:
            masks.append(mask)
    return [TopologyHint(m, m.bit_count() == narrowest) for m in masks]


class DraDevices:
    """A resource kind (:class:`~numalign.topology.managers.base.ProviderKind`) of one
    pod's admission: per container name, the claim requests it uses."""

    name = NAME
    hint_order = 45  # after the device manager's devices, before GPU groups

    def __init__(self, containers: Mapping[str, Sequence[DraRequest]]) -> None:
        self.containers = {c: tuple(rs) for c, rs in containers.items() if rs}

    def for_pod(self, admission: Admission) -> DraProvider | None:
        names = {c.name for c in admission.pod.all_containers}
        if not any(c in names for c in self.containers):
            return None
        return DraProvider(self, admission)


class DraProvider:
    """The hint provider of :class:`DraDevices` for one pod."""

    name = NAME
    manager = "devices"  # the kubelet's device manager gives device hints
    allocation_order = 0
    claims: frozenset[str] = frozenset()
    # its hints come from the allocated devices and every device of their kind, never
    # from what is free: whatever other pods hold, they stay the same
    room_by_counts = True

    def __init__(self, kind: DraDevices, admission: Admission) -> None:
        self.kind = kind
        self.a = admission

    def ask(self, unit: Sequence[Container]) -> Ask:
        machine = self.a.machine.numa_ids
        devices: dict[str, dict[str, NumaNodes]] = {}  # key -> device id -> NUMA nodes
        peers: dict[str, tuple[NumaNodes, ...]] = {}
        for c in unit:
            for r in self.kind.containers.get(c.name, ()):
                got = devices.setdefault(r.key, {})
                for d in r.devices:  # a claim two containers share counts once
                    got[d.id] = d.numa_nodes
                peers.setdefault(r.key, r.peers)
        fixed: dict[str, list[TopologyHint] | None] = {
            key: device_hints(list(got.values()), peers[key], machine)
            for key, got in sorted(devices.items()) if got}
        return Ask(fixed=fixed)

    def hints(self, ask: Ask,
              lists: Sequence[list[TopologyHint]]) -> dict[str, list[TopologyHint] | None]:
        return dict(ask.fixed)

    def allocate(self, c: Container, hint: TopologyHint, alloc: ContainerAllocation) -> None:
        return None  # allocated by the scheduler already

    def report(self) -> dict[str, dict[str, list[str]]] | None:
        """Container -> request key -> its devices (``driver/pool/device``)."""
        out = {c: {r.key: [d.id for d in r.devices] for r in rs}
               for c, rs in sorted(self.kind.containers.items())}
        return out or None


__all__ = ["KEY_PREFIX", "NAME", "DraDeviceRef", "DraDevices", "DraProvider", "DraRequest",
           "device_hints", "request_key"]
