"""Which requests of a ResourceClaim a ``matchAttribute: resource.kubernetes.io/numaNode``
constraint can hold for, judged from the cluster's ResourceSlices and DeviceClasses
(pure; the ``numa-constraint`` webhook, :mod:`numalign.controller.claims`, reads them).

kube-scheduler's allocator gives a request under that constraint only devices that carry
the attribute (and all the same value), so a request whose devices publish no NUMA node
could never be allocated. A request qualifies when each of its candidate devices anywhere
in the cluster publishes the attribute as an integer (``int``) or a non-empty list
(``ints``, behind the ``DRAListTypeAttributes`` gate), and it has at least one candidate.

A device is a candidate of a request when it matches the request's DeviceClass and its
own selectors, read in the CEL subset of :mod:`numalign.api.draasks` (``device.driver
==`` and ``device.attributes[...].name ==`` terms joined by ``&&``); any other expression
"may match", so a device it may select counts as a candidate. Each way a request may be
allocated (``exactly``, or every ``firstAvailable`` subrequest) adds its candidates. Held
devices count as well (they may be freed before the claim is allocated).

Everything uncertain gives no constraint, never a wrong one: a DeviceClass not found, a
request with no candidate at all (its devices may appear later, without the attribute),
a claim spec that cannot be read, a listing cut short by the bounds
(:attr:`ClusterDevices.complete`). A missing constraint costs alignment only (the
extender still decides the node with every allocation the allocator could make, and the
node admits or rejects the pod as the kubelet would); a wrong one leaves the pod Pending
forever.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .dra import map_device
from .draasks import (
    NodeDevice,
    NodeOffer,
    Selector,
    claim_ask,
    device_attributes,
    selectors_of,
)
from .draclaims import PodClaim

MAX_DEVICES = 20_000  # devices judged (past that: incomplete, no constraint)
MAX_CLASSES = 1_000
MAX_DEVICES_PER_SLICE = 1_024


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def publishes_numa_node(device: Mapping[str, Any], driver: str = "") -> bool:
    """Whether a ResourceSlice device of ``driver`` carries ``resource.kubernetes.io/numaNode``
    as an integer or a non-empty list of integers (what a ``matchAttribute`` on it
    compares), read as the agent and the extender read it (:func:`numalign.api.dra.map_device`)."""
    attrs = device.get("attributes")
    if not isinstance(attrs, Mapping):
        return False
    return map_device(driver, attrs, None, None)[1] == "numaNode"


@dataclass(frozen=True)
class ClusterDevices:
    """The cluster's devices (every slice, any node) and DeviceClasses (name ->
    selectors); ``complete`` False: more than the bounds, so unknown devices may lack
    the attribute."""

    offer: NodeOffer
    classes: Mapping[str, list[Selector]]
    complete: bool = True

    @property
    def devices(self) -> list[NodeDevice]:
        return self.offer.devices


def cluster_devices(slices: Iterable[Mapping[str, Any]],
                    classes: Iterable[Mapping[str, Any]],
                    complete: bool = True) -> ClusterDevices:
    """The devices of ``slices`` (ResourceSlice objects) and the selectors of ``classes``
    (DeviceClass objects); ``complete``: whether the listings were whole."""
    out: list[NodeDevice] = []
    for s in slices:
        spec = _map(s.get("spec"))
        driver = spec.get("driver")
        pool = _map(spec.get("pool")).get("name")
        devices = spec.get("devices")
        if not isinstance(driver, str) or not isinstance(devices, list):
            continue  # a slice without devices (shared counters only) offers none
        for d in devices[:MAX_DEVICES_PER_SLICE]:
            name = _map(d).get("name")
            if not isinstance(name, str):
                continue
            if len(out) >= MAX_DEVICES:
                complete = False
                break
            out.append(NodeDevice(driver, str(pool or ""), name, None,
                                  publishes_numa_node(_map(d), driver),
                                  device_attributes(driver, _map(d).get("attributes"))))
        if len(devices) > MAX_DEVICES_PER_SLICE:
            complete = False
    selectors: dict[str, list[Selector]] = {}
    for c in classes:
        name = _map(c.get("metadata")).get("name")
        if isinstance(name, str) and name:
            if len(selectors) >= MAX_CLASSES:
                complete = False
                break
            selectors[name] = selectors_of(_map(c.get("spec")).get("selectors"))
    return ClusterDevices(NodeOffer(out), selectors, complete)


def numa_requests(spec: Mapping[str, Any], cluster: ClusterDevices) -> list[str]:
    """The names of the claim's requests (in their order) whose every candidate device
    publishes the NUMA attribute; empty when the claim or the cluster cannot be read
    wholly."""
    if not cluster.complete:
        return []
    ask = claim_ask(PodClaim("claim", "claim"), spec, "ResourceClaim")
    if ask.problem:
        return []
    out: list[str] = []
    for name, ways in ask.requests:
        candidates: list[NodeDevice] = []
        for way in ways:
            sel = cluster.classes.get(way.device_class)
            if sel is None:  # a class not found: its devices cannot be known
                candidates = []
                break
            candidates.extend(cluster.offer.matching(way, sel))
        if candidates and all(d.numa_attribute for d in candidates):
            out.append(name)
    return out


__all__ = ["ClusterDevices", "cluster_devices", "numa_requests", "publishes_numa_node"]
