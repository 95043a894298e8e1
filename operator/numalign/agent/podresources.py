"""The kubelet's PodResources API (v1) on a real node: what the kubelet allocated to each
running pod (``List``) and what it can allocate (``GetAllocatableResources``), read over
its unix socket with the generated client (numalign.kubeletapi), as plain data.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

MEMORY = "memory"


@dataclass(frozen=True)
class DeviceSet:
    """Devices of one resource, with the NUMA nodes the kubelet reports for them."""

    resource: str
    ids: tuple[str, ...]
    numa_nodes: tuple[int, ...]  # empty: no topology


@dataclass(frozen=True)
class MemoryBlock:
    kind: str  # "memory" or "hugepages-<size>"
    size: int  # bytes
    numa_nodes: tuple[int, ...]


@dataclass(frozen=True)
class ClaimDevice:
    """A DRA device the kubelet prepared for a container's ResourceClaim."""

    claim: str  # the ResourceClaim's name (in the pod's namespace)
    driver: str
    pool: str
    device: str

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclass(frozen=True)
class KubeletContainer:
    name: str
    cpus: tuple[int, ...] = ()
    devices: tuple[DeviceSet, ...] = ()
    memory: tuple[MemoryBlock, ...] = ()
    dra: tuple[ClaimDevice, ...] = ()  # its DRA devices (dynamic_resources)


@dataclass(frozen=True)
class KubeletPod:
    namespace: str
    name: str
    containers: tuple[KubeletContainer, ...] = ()


@dataclass(frozen=True)
class Allocatable:
    cpus: tuple[int, ...] = ()
    devices: tuple[DeviceSet, ...] = ()
    memory: tuple[MemoryBlock, ...] = ()


@dataclass
class Snapshot:
    """One reading of the PodResources API."""

    pods: list[KubeletPod] = field(default_factory=list)
    allocatable: Allocatable = field(default_factory=Allocatable)


def _numa(topology: Any) -> tuple[int, ...]:
    if topology is None:
        return ()
    return tuple(sorted({int(n.ID) for n in topology.nodes}))


def _devices(items: Iterable[Any]) -> tuple[DeviceSet, ...]:
    return tuple(DeviceSet(str(d.resource_name), tuple(str(i) for i in d.device_ids),
                           _numa(d.topology if d.HasField("topology") else None))
                 for d in items)


def _memory(items: Iterable[Any]) -> tuple[MemoryBlock, ...]:
    return tuple(MemoryBlock(str(m.memory_type), int(m.size),
                             _numa(m.topology if m.HasField("topology") else None))
                 for m in items)


def _claim_devices(items: Iterable[Any]) -> tuple[ClaimDevice, ...]:
    return tuple(ClaimDevice(str(d.claim_name), str(r.driver_name), str(r.pool_name),
                             str(r.device_name))
                 for d in items for r in d.claim_resources)


def pods_from_response(resp: Any) -> list[KubeletPod]:
    """A ``ListPodResourcesResponse`` as plain data (CPU ids sorted)."""
    out: list[KubeletPod] = []
    for p in resp.pod_resources:
        containers = tuple(
            KubeletContainer(str(c.name), tuple(sorted(int(i) for i in c.cpu_ids)),
                             _devices(c.devices), _memory(c.memory),
                             _claim_devices(c.dynamic_resources))
            for c in p.containers)
        out.append(KubeletPod(str(p.namespace), str(p.name), containers))
    return out


def allocatable_from_response(resp: Any) -> Allocatable:
    """An ``AllocatableResourcesResponse`` as plain data."""
    return Allocatable(tuple(sorted(int(i) for i in resp.cpu_ids)), _devices(resp.devices),
                       _memory(resp.memory))


class PodResourcesError(Exception):
    """The PodResources API could not be read (one line: where and why)."""


class PodResourcesClient:
    """Reads the PodResources API on ``socket`` (a path), ``timeout`` seconds a call."""

    def __init__(self, socket: str, timeout: float = 5.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self._channel: Any = None
        self._stub: Any = None

    def _connect(self) -> Any:
        if self._stub is None:
            import grpc.aio

            from numalign.kubeletapi.podresources_v1 import api_pb2_grpc

            self._channel = grpc.aio.insecure_channel(f"unix://{os.path.abspath(self.socket)}")
            self._stub = api_pb2_grpc.PodResourcesListerStub(  # type: ignore[no-untyped-call]
                self._channel)
        return self._stub

    async def close(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            await channel.close()

    async def snapshot(self) -> Snapshot:
        """List and GetAllocatableResources; PodResourcesError on any failure."""
        import grpc

        from numalign.kubeletapi.podresources_v1 import api_pb2

        if not os.path.exists(self.socket):
            raise PodResourcesError(f"{self.socket}: no pod-resources socket (is the kubelet "
                                    "running with this --root-dir?)")
        stub = self._connect()
        try:
            listed = await stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout)
            alloc = await stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(),
                                                       timeout=self.timeout)
        except grpc.RpcError as e:
            await self.close()  # a fresh channel next time (the kubelet may have restarted)
            code = e.code() if hasattr(e, "code") else None
            detail = e.details() if hasattr(e, "details") else str(e)
            name = code.name if code is not None else "error"
            raise PodResourcesError(f"{self.socket}: {name}: {detail}") from None
        try:
            return Snapshot(pods_from_response(listed), allocatable_from_response(alloc))
        except (AttributeError, TypeError, ValueError) as e:
            raise PodResourcesError(f"{self.socket}: unexpected answer: {e}") from None
