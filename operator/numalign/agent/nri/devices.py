"""The devices the kubelet's device manager assigned, as fixed hints for the engine (pure).

On a numalign-managed node the kubelet's Topology Manager is ``none``: its device manager
has already picked each container's devices (at pod admission, before the sandbox) when the
runtime asks numalign about the pod's first container. Those devices are facts, not
choices: the engine takes them as the kubelet's Topology Manager would see them after
allocation (its device manager regenerates hints from the devices it already gave,
``generateDeviceTopologyHints`` with the allocated devices as the only ones available):

- every NUMA mask, over the NUMA nodes that have devices of the resource, holding at least
  the unit's count of its assigned devices is a hint; the narrowest such masks over all the
  resource's devices are preferred;
- a resource none of whose devices has a NUMA node gives no preference;
- the allocation of each container is exactly its assigned devices.

So a pod whose CPUs cannot be aligned with its devices under its policy is rejected the way
the kubelet's Topology Manager would reject it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from numalign.agent.podresources import KubeletPod
from numalign.topology.admit import DeviceOverride, OverrideAllocation, OverrideRequest
from numalign.topology.errors import TopologyError
from numalign.topology.hints import NumaMask, TopologyHint
from numalign.topology.machine import Machine
from numalign.topology.providers import iterate_masks

# container name -> resource -> device ids
Assigned = Mapping[str, Mapping[str, Sequence[str]]]

# Requests that are not device resources (the kubelet's device manager serves the rest).
NATIVE = ("cpu", "memory", "ephemeral-storage", "pods")


def is_device_resource(name: str) -> bool:
    return name not in NATIVE and not name.startswith("hugepages-")


def asks_for_devices(pod: Mapping[str, object]) -> bool:
    """Whether any container of ``pod`` (a Kubernetes Pod) requests a device resource: only
    then is the kubelet asked what it assigned."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return False
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            res = c.get("resources") or {} if isinstance(c, Mapping) else {}
            for part in ("requests", "limits"):
                if any(is_device_resource(str(r)) for r in (res.get(part) or {})):
                    return True
    return False


def assigned_of(pod: KubeletPod) -> dict[str, dict[str, list[str]]]:
    """The devices a PodResources reading shows for one pod, per container and resource."""
    out: dict[str, dict[str, list[str]]] = {}
    for c in pod.containers:
        for ds in c.devices:
            out.setdefault(c.name, {}).setdefault(ds.resource, []).extend(ds.ids)
    return out


class AssignedDevices:
    """A :class:`~numalign.topology.admit.DeviceOverride` for one device resource: the
    devices the kubelet assigned to each container, by NUMA node of ``machine``."""

    per_container = True  # allocate() is asked for every container requesting the resource

    def __init__(self, machine: Machine, resource: str, assigned: Assigned) -> None:
        self.resources: tuple[str, ...] = (resource,)
        self.resource = resource
        self.assigned = {c: list(per.get(resource, ())) for c, per in assigned.items()}
        devices = machine.devices_of(resource)
        self.numa = {d.id: d.numa_node for d in devices}
        self.domain = tuple(sorted({d.numa_node for d in devices if d.numa_node is not None}
                                   & set(machine.numa_ids)))
        unknown = sorted({i for ids in self.assigned.values() for i in ids} - set(self.numa))
        if unknown:
            raise TopologyError(f"devices {resource}",
                                f"the kubelet assigned {', '.join(unknown)}, which the node "
                                "does not report")

    def _in(self, mask: NumaMask, ids: Iterable[str]) -> int:
        n = 0
        for i in ids:
            node = self.numa.get(i)
            if node is not None and mask >> node & 1:
                n += 1
        return n

    def hints(self, req: OverrideRequest) -> list[TopologyHint] | None:
        if not self.domain:
            return None  # no device of the resource has a NUMA node: no preference
        ids = [i for c in req.containers for i in self.assigned.get(c.name, ())]
        count = req.count
        narrowest = len(self.domain)
        hints: list[NumaMask] = []
        for mask in iterate_masks(self.domain):
            if self._in(mask, self.numa) >= count:
                narrowest = min(narrowest, mask.bit_count())
            if self._in(mask, ids) >= count:
                hints.append(mask)
        return [TopologyHint(m, m.bit_count() == narrowest) for m in hints]

    def allocate(self, req: OverrideRequest, mask: NumaMask | None) -> OverrideAllocation:
        got: dict[str, list[str]] = {}
        for c in req.containers:
            ids = self.assigned.get(c.name, [])
            if ids:
                got.setdefault(self.resource, []).extend(ids)
        return OverrideAllocation(got)


def assigned_overrides(machine: Machine, assigned: Assigned) -> list[DeviceOverride]:
    """One :class:`AssignedDevices` per resource the kubelet assigned to the pod."""
    resources = sorted({r for per in assigned.values() for r, ids in per.items() if ids})
    return [AssignedDevices(machine, r, assigned) for r in resources]
