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
from numalign.topology.demands import iterate_masks
from numalign.topology.errors import TopologyError
from numalign.topology.hints import NumaMask, TopologyHint
from numalign.topology.ledger import ContainerAllocation
from numalign.topology.machine import Machine
from numalign.topology.managers.base import Admission, Ask, ProviderKind
from numalign.topology.pod import Container

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
    """A resource kind (:class:`~numalign.topology.managers.base.ProviderKind`) of this
    admission only, for one device resource: the devices the kubelet assigned to each
    container, by NUMA node of ``machine``. Its provider claims the resource from the
    plain device provider and allocates every container requesting it."""

    name = "assigned-devices"
    hint_order = 40  # after the device manager's plain devices, before GPU groups

    def __init__(self, machine: Machine, resource: str, assigned: Assigned) -> None:
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

    def hints(self, unit: Sequence[Container], count: int) -> list[TopologyHint] | None:
        """The kubelet's hints for ``count`` devices of the decision of ``unit``."""
        if not self.domain:
            return None  # no device of the resource has a NUMA node: no preference
        ids = [i for c in unit for i in self.assigned.get(c.name, ())]
        narrowest = len(self.domain)
        hints: list[NumaMask] = []
        for mask in iterate_masks(self.domain):
            if self._in(mask, self.numa) >= count:
                narrowest = min(narrowest, mask.bit_count())
            if self._in(mask, ids) >= count:
                hints.append(mask)
        return [TopologyHint(m, m.bit_count() == narrowest) for m in hints]

    def for_pod(self, admission: Admission) -> AssignedProvider:
        return AssignedProvider(self, admission)


class AssignedProvider:
    """The hint provider of :class:`AssignedDevices` for one pod."""

    name = AssignedDevices.name
    manager = "devices"
    allocation_order = 0
    room_by_counts = False  # the devices the kubelet assigned, not any free ones

    def __init__(self, kind: AssignedDevices, admission: Admission) -> None:
        self.kind = kind
        self.a = admission
        self.claims = frozenset((kind.resource,))

    def ask(self, unit: Sequence[Container]) -> Ask:
        res = self.kind.resource
        if not any(res in c.requests for c in unit):
            return Ask()
        count = self.a.unit_value(unit, lambda c: int(c.request(res)))
        return Ask(fixed={res: self.kind.hints(unit, count)})

    def hints(self, ask: Ask,
              lists: Sequence[list[TopologyHint]]) -> dict[str, list[TopologyHint] | None]:
        return dict(ask.fixed)

    def allocate(self, c: Container, hint: TopologyHint, alloc: ContainerAllocation) -> None:
        ids = self.kind.assigned.get(c.name, [])
        if ids and self.kind.resource in c.requests:
            alloc.devices[self.kind.resource] = tuple(ids)

    def report(self) -> None:
        return None


def assigned_kinds(machine: Machine, assigned: Assigned) -> list[ProviderKind]:
    """One :class:`AssignedDevices` per resource the kubelet assigned to the pod."""
    resources = sorted({r for per in assigned.values() for r, ids in per.items() if ids})
    return [AssignedDevices(machine, r, assigned) for r in resources]
