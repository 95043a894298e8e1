"""The pod-set fingerprint of a node, as github.com/k8stopologyawareschedwg/podfingerprint
(v1, ``pfp0v001``) computes it, so that scheduler-plugins' NodeResourceTopologyMatch can
trust a NodeResourceTopology in its reserve-aware ("overreserve") cache mode.

The algorithm (pure; no I/O):

* each pod is the 64-bit XXH64 of its name, seeded with the XXH64 (seed 0) of its
  namespace;
* the pod hashes are sorted as unsigned integers, written little-endian (8 bytes each)
  into one XXH64 stream (seed 0);
* the fingerprint is ``"pfp0" + "v001" + hex(digest)``, the digest's 8 bytes big-endian
  (16 lowercase hex digits).

Which pods: the scheduler recomputes the fingerprint from the pods its informer lists on
the node, and trusts the NodeResourceTopology only when both agree. With its default
pod informer (``informerMode: Dedicated``) that is every pod bound to the node whose
phase is not Pending (Running, and Succeeded or Failed ones not yet deleted: a pod the
node rejected counts); with ``informerMode: Shared``, Running pods only. With method
``with-exclusive-resources`` (``nodeTopologyPodsFingerprintMethod``) it keeps those that
hold exclusive resources as its ``resourcerequests.AreExclusiveForPod`` says: a
Guaranteed pod with an integral CPU request, or memory or hugepages, or any pod
requesting a non-native resource the NodeResourceTopology lists (sidecar init containers
count, other init containers do not). :func:`pod_entry` reads that from a pod once;
:func:`fingerprint` selects and signs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from numalign.topology.errors import TopologyError
from numalign.topology.pod import QOS_GUARANTEED, pod_from_dict

PREFIX = "pfp0"
VERSION = "v001"
ATTRIBUTE = "nodeTopologyPodsFingerprint"
ATTRIBUTE_METHOD = "nodeTopologyPodsFingerprintMethod"
METHOD_ALL = "all"
METHOD_EXCLUSIVE = "with-exclusive-resources"
METHODS: tuple[str, ...] = (METHOD_ALL, METHOD_EXCLUSIVE)
# scheduler-plugins' NodeResourceTopologyMatch cache informerMode: which pods it lists
INFORMER_DEDICATED = "Dedicated"
INFORMER_SHARED = "Shared"
INFORMER_MODES: tuple[str, ...] = (INFORMER_DEDICATED, INFORMER_SHARED)

_M64 = (1 << 64) - 1
_P1 = 0x9E3779B185EBCA87
_P2 = 0xC2B2AE3D27D4EB4F
_P3 = 0x165667B19E3779F9
_P4 = 0x85EBCA77C2B2AE63
_P5 = 0x27D4EB2F165667C5


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _round(acc: int, lane: int) -> int:
    acc = (acc + lane * _P2) & _M64
    return (_rotl(acc, 31) * _P1) & _M64


def _merge(acc: int, val: int) -> int:
    acc ^= _round(0, val)
    return (acc * _P1 + _P4) & _M64


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of ``data`` (the reference algorithm, as an unsigned 64-bit integer)."""
    n = len(data)
    seed &= _M64
    i = 0
    if n >= 32:
        v1 = (seed + _P1 + _P2) & _M64
        v2 = (seed + _P2) & _M64
        v3 = seed
        v4 = (seed - _P1) & _M64
        limit = n - 32
        while i <= limit:
            v1 = _round(v1, int.from_bytes(data[i:i + 8], "little"))
            v2 = _round(v2, int.from_bytes(data[i + 8:i + 16], "little"))
            v3 = _round(v3, int.from_bytes(data[i + 16:i + 24], "little"))
            v4 = _round(v4, int.from_bytes(data[i + 24:i + 32], "little"))
            i += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _M64
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + _P5) & _M64
    h = (h + n) & _M64
    while i + 8 <= n:
        h ^= _round(0, int.from_bytes(data[i:i + 8], "little"))
        h = (_rotl(h, 27) * _P1 + _P4) & _M64
        i += 8
    if i + 4 <= n:
        h ^= (int.from_bytes(data[i:i + 4], "little") * _P1) & _M64
        h = (_rotl(h, 23) * _P2 + _P3) & _M64
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _M64
        h = (_rotl(h, 11) * _P1) & _M64
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M64
    h ^= h >> 29
    h = (h * _P3) & _M64
    h ^= h >> 32
    return h


def pod_hash(namespace: str, name: str) -> int:
    """One pod's hash: XXH64(name) seeded with XXH64(namespace)."""
    return xxh64(name.encode(), xxh64(namespace.encode()))


def sign(pods: Iterable[tuple[str, str]]) -> str:
    """The fingerprint of a set of (namespace, name) pairs (order does not matter)."""
    hashes = sorted(pod_hash(ns, name) for ns, name in pods)
    digest = xxh64(b"".join(h.to_bytes(8, "little") for h in hashes))
    return f"{PREFIX}{VERSION}{digest:016x}"


# ---------------------------------------------------------------- which pods


@dataclass(frozen=True, slots=True)
class PodEntry:
    """What the fingerprint needs of a pod: its name, its phase (as the node sets it) and
    whether it holds exclusive resources (``native``: CPUs, memory or hugepages of a
    Guaranteed pod; ``extended``: the non-native resources it requests, exclusive when
    the NRT lists them)."""

    namespace: str
    name: str
    phase: str = "Running"
    native: bool = False
    extended: frozenset[str] = frozenset()

    def listed(self, informer: str) -> bool:
        """Whether the scheduler's pod informer (``informer`` mode) counts the pod."""
        if informer == INFORMER_SHARED:
            return self.phase == "Running"
        return self.phase != "Pending"

    def exclusive(self, nrt_resources: frozenset[str] | set[str]) -> bool:
        return self.native or any(r in nrt_resources for r in self.extended)


def _native(resource: str) -> bool:
    """Kubernetes' IsNativeResource: no domain, or a ``kubernetes.io`` one."""
    return "/" not in resource or "kubernetes.io/" in resource


def pod_entry(pod: Mapping[str, Any], phase: str | None = None) -> PodEntry:
    """A pod as the fingerprint sees it; ``phase`` (default: the pod's) is the one the
    node gives it. A pod the engine cannot read holds nothing exclusive."""
    meta = pod.get("metadata") or {}
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    if phase is None:
        phase = str((pod.get("status") or {}).get("phase") or "Pending")
    try:
        model = pod_from_dict(pod)
    except TopologyError:
        return PodEntry(namespace, name, phase)
    guaranteed = model.qos == QOS_GUARANTEED
    native = False
    extended: set[str] = set()
    # what the pod holds in its steady state: its containers and sidecars
    for c in model.all_containers:
        if c.is_init:
            continue
        for r, amount in c.requests.items():
            if not _native(r):
                extended.add(r)
            elif guaranteed and amount > 0 and (
                    (r == "cpu" and amount == amount.to_integral_value())
                    or r == "memory" or r.startswith("hugepages-")):
                native = True
    return PodEntry(namespace, name, phase, native, frozenset(extended))


def fingerprint(pods: Iterable[PodEntry], method: str = METHOD_EXCLUSIVE,
                nrt_resources: frozenset[str] | set[str] = frozenset(),
                informer: str = INFORMER_DEDICATED) -> str:
    """The fingerprint of the pods the scheduler counts: those its ``informer`` lists,
    and under ``method`` ``with-exclusive-resources`` only those holding exclusive
    resources (``nrt_resources``: the resource names the NodeResourceTopology lists)."""
    if method not in METHODS:
        raise ValueError(f"fingerprint method: {method!r} is not one of {', '.join(METHODS)}")
    if informer not in INFORMER_MODES:
        raise ValueError(f"informer mode: {informer!r} is not one of "
                         f"{', '.join(INFORMER_MODES)}")
    return sign((p.namespace, p.name) for p in pods
                if p.listed(informer) and (method == METHOD_ALL or p.exclusive(nrt_resources)))
