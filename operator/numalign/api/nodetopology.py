"""NodeTopology (``nt``): one per node, named after it. The operator writes ``spec``
(the node's default policy, pushed to its agent); the node agent writes ``status``
(zones, distances, devices, admitted pods)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from ..topology.quantity import parse_cpulist, parse_quantity
from .common import (
    CONDITIONS_LIST,
    MAX_NUMA_NODES,
    Condition,
    Count,
    CpuList,
    KubeletPolicy,
    Model,
    NumaId,
    Policy,
    Quantity,
    Scope,
    TopologyOptions,
)

# A node's devices, and the pods admitted on it (the kubelet's maxPods rarely passes 250).
MAX_DEVICES = 1024
MAX_ADMITTED = 1024
MAX_DRA_DEVICES = 1024

KIND = "NodeTopology"
PLURAL = "nodetopologies"
SINGULAR = "nodetopology"
SHORT_NAMES = ("nt",)

# Condition types in status.conditions.
READY = "Ready"  # the agent publishes this node's topology and admits its pods
POLICY_APPLIED = "PolicyApplied"  # status.observedPolicyGeneration == spec.policyGeneration
# real nodes started with the runtime's NRI socket: numalign places the containers
NRI_PLACEMENT = "NRIPlacement"
# Its reasons: True while the plugin is registered; False while it starts or the runtime is
# away (the node stays numalign-managed), or for good when the node is not managed.
NRI_REGISTERED = "Registered"
NRI_STARTING = "Starting"
NRI_RUNTIME_UNAVAILABLE = "RuntimeUnavailable"
NRI_NOT_MANAGED = "NotManaged"  # the Node lacks numalign.io/managed=nri
NRI_KUBELET_MANAGERS_ON = "KubeletManagersOn"  # refused: the kubelet's managers place
NRI_NOT_PLACING = (NRI_NOT_MANAGED, NRI_KUBELET_MANAGERS_ON)  # the kubelet decides there

ResourceList = dict[str, Quantity]


class NodeTopologySpec(Model):
    """The node's default policy, from the TopologyPolicies whose nodeSelector selects it."""

    policy: Policy | None = None
    """The default policy for pods on this node that no TopologyPolicy selects."""
    scope: Scope | None = None
    """The default scope: container or pod."""
    options: TopologyOptions | None = None
    """The default policy options."""
    source: str | None = None
    """Where the default came from: TopologyPolicy/<name> or node-default."""
    policy_generation: Count | None = None
    """Bumped by the operator on every change; the agent echoes it in
    status.observedPolicyGeneration once applied."""


class Zone(Model):
    """One NUMA node and its resources."""

    id: NumaId
    """The NUMA node id (sparse ids allowed, 0-255)."""
    cpus: CpuList = ""
    """The node's CPUs as a Linux cpulist, e.g. 0-15,32-47."""
    memory: Quantity | None = None
    """Memory of the NUMA node."""
    hugepages: dict[str, Quantity] | None = None
    """Hugepage memory by page size (2Mi, 1Gi)."""
    capacity: ResourceList | None = None
    """Capacity per resource (cpu, memory, hugepages-2Mi, devices) in this zone."""
    allocatable: ResourceList | None = None
    """Allocatable per resource (capacity less the reserved part)."""
    available: ResourceList | None = None
    """Allocatable not yet given to admitted pods."""


class DeviceGroup(Model):
    """One level of a device's grouping, e.g. level nvlink, id nv1."""

    level: Annotated[str, Field(min_length=1, max_length=63)]
    id: Annotated[str, Field(min_length=1, max_length=253)]


class Device(Model):
    """A device of an extended resource (GPUs, NICs, ...)."""

    resource: Annotated[str, Field(min_length=1, max_length=317)]
    """The extended resource, e.g. nvidia.com/gpu."""
    id: Annotated[str, Field(min_length=1, max_length=253)]
    """The device id."""
    numa_node: NumaId | None = None
    """The device's NUMA node; unset: no NUMA preference."""
    memory: Quantity | None = None
    """Device memory (GPUs)."""
    groups: list[DeviceGroup] | None = None
    """The device's groups, outermost level first (socket, nvlink, pcie ...)."""


class DraDevice(Model):
    """A DRA device of one of the node's ResourceSlices (resource.k8s.io/v1), with its
    NUMA nodes when known (numalign.api.dra says by which rule)."""

    slice: Annotated[str, Field(max_length=253)]
    """The ResourceSlice."""
    driver: Annotated[str, Field(max_length=253)]
    """The DRA driver."""
    pool: Annotated[str, Field(max_length=253)]
    """The pool in the driver."""
    device: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    """The device's name in the pool; unset on an entry about a slice that cannot be read."""
    numa_nodes: Annotated[list[NumaId], Field(max_length=MAX_NUMA_NODES)] | None = None
    """The device's NUMA nodes (equally close ones, the physical one first); unset:
    unknown (never guessed)."""
    source: Literal["numaNode", "pcieRoot", "pciBusID", "driverAttribute", "unknown"]
    """Which rule gave the NUMA nodes: the standard numaNode attribute, pcieRoot or
    pciBusID resolved through the node's sysfs, a known driver's own attribute; or unknown."""
    attributes: Annotated[dict[str, str], Field(max_length=8)] | None = None
    """The attributes numalign used, with their values (as JSON, shortened)."""
    problem: Annotated[str, Field(max_length=512)] | None = None
    """Why the NUMA nodes are unknown, when something was wrong or unresolvable."""


class CpuSocket(Model):
    """One socket and its NUMA nodes."""

    id: Count
    """The socket (physical package) id."""
    numa_nodes: list[NumaId] | None = None
    """The NUMA nodes whose CPUs sit on this socket."""
    cpus: CpuList | None = None
    """The socket's CPUs, listed (on every socket) only when a NUMA node spans sockets."""


class CpuTopology(Model):
    """Core and socket of every CPU, compactly (numalign.topology.cputopo): sibling
    threads are cpu N and N + (total / threadsPerCore) with the core id of the lowest,
    unless siblings lists the cores."""

    threads_per_core: Annotated[int, Field(ge=1, le=64)] = 1
    """Hardware threads per core."""
    sockets: list[CpuSocket] | None = None
    """The sockets; a NUMA node in none is its own socket."""
    siblings: list[CpuList] | None = None
    """One cpulist per core (sibling threads), in core id order, when the cores are not
    numbered as threadsPerCore says."""
    core_ids: list[Count] | None = None
    """The core id of each siblings entry (default: 0, 1, ...)."""


class AdmittedContainer(Model):
    """What one container was given."""

    name: str
    """The container's name."""
    numa_nodes: list[NumaId] | None = None
    """The container's NUMA affinity."""
    cpus: CpuList | None = None
    """Exclusive CPUs (static CPU policy), as a cpulist."""
    memory: dict[str, Quantity] | None = None
    """Memory per NUMA node id (the key)."""
    hugepages: dict[str, dict[str, Quantity]] | None = None
    """Hugepage memory per page size (2Mi, 1Gi), then per NUMA node id."""
    devices: dict[str, list[str]] | None = None
    """Device ids per resource."""
    memory_numa_nodes: list[NumaId] | None = None
    """The NUMA nodes its memory may use (the memory manager's block affinity), when
    known; it can differ from numaNodes, and a restarted agent or the scheduler extender
    rebuilding the node's state needs it."""
    dra_devices: dict[str, list[str]] | None = None
    """DRA devices kube-scheduler allocated to the container's ResourceClaims: per claim
    request (dra:<claim>/<request>), driver/pool/device."""


class UnalignedDraDevice(Model):
    """A DRA device of a container that the kubelet left on other NUMA nodes than the
    container's exclusive CPUs (its Topology Manager never sees DRA devices)."""

    container: str
    """The container's name."""
    device: Annotated[str, Field(max_length=800)]
    """The device: driver/pool/device."""
    numa_nodes: list[NumaId]
    """The device's NUMA nodes (from the node's ResourceSlices)."""
    cpu_numa_nodes: list[NumaId]
    """The NUMA nodes of the container's exclusive CPUs."""


class AdmittedPod(Model):
    """A pod the agent admitted, with its NUMA affinity and allocation."""

    pod: str
    """The pod's name."""
    namespace: str
    """The pod's namespace."""
    uid: str
    """The pod's uid."""
    policy: Policy
    """The policy it was admitted under."""
    scope: Scope
    """The scope it was admitted under."""
    options: TopologyOptions | None = None
    """The policy options it was admitted under."""
    source: str
    """Where the policy came from: pod, TopologyPolicy/<name>, node-default or none."""
    numa_nodes: list[NumaId] | None = None
    """The pod's NUMA affinity (the union over its containers)."""
    cpus: CpuList | None = None
    """Exclusive CPUs, as a cpulist."""
    memory: dict[str, Quantity] | None = None
    """Memory per NUMA node id (the key)."""
    devices: dict[str, list[str]] | None = None
    """Device ids per resource."""
    gpus: dict[str, list[str]] | None = None
    """numalign.io/gpus requests mapped to device ids."""
    containers: list[AdmittedContainer] | None = None
    """Per-container detail."""
    dra_unaligned: Annotated[list[UnalignedDraDevice], Field(max_length=64)] | None = None
    """Kubelet-managed nodes: the pod's DRA devices the kubelet left unaligned with its
    containers' exclusive CPUs."""


class NodeTopologySummary(Model):
    """Totals shown by kubectl get nt."""

    numa_nodes: Count | None = None
    """NUMA nodes."""
    cpus: str | None = None
    """Allocatable CPUs free/total, e.g. 12/16."""
    devices: str | None = None
    """Devices free/total."""
    pods: Count | None = None
    """Admitted pods."""
    dra_devices: Count | None = None
    """DRA devices in the node's ResourceSlices (status.draDevices lists them)."""


class KubeletSettings(Model):
    """On a real node: the kubelet's own alignment settings, from its configuration file
    (the kubelet, not the operator's node default, admits the pods there)."""

    topology_manager_policy: KubeletPolicy
    """The kubelet's topologyManagerPolicy."""
    topology_manager_scope: Scope
    """The kubelet's topologyManagerScope."""
    topology_manager_policy_options: dict[str, str] | None = None
    """The kubelet's topologyManagerPolicyOptions."""
    cpu_manager_policy: Literal["none", "static"]
    """The kubelet's cpuManagerPolicy."""
    memory_manager_policy: Literal["None", "Static", "BestEffort"]
    """The kubelet's memoryManagerPolicy."""
    reserved_system_cpus: Annotated[CpuList | None, Field(alias="reservedSystemCPUs")] = None
    """The kubelet's reservedSystemCPUs."""
    pod_resources: str | None = None
    """Why the kubelet's allocations could not be read (PodResources API), when they
    could not; unset when the last reading succeeded."""


class NodeTopologyStatus(Model):
    """The node's topology and allocations, published by its agent."""

    zones: Annotated[
        list[Zone],
        Field(
            max_length=MAX_NUMA_NODES,
            json_schema_extra={"x-kubernetes-list-type": "map",
                               "x-kubernetes-list-map-keys": ["id"]}
        ),
    ] | None = None
    """One entry per NUMA node."""
    cpu_topology: CpuTopology | None = None
    """Core and socket of every CPU (the NUMA node of each is in zones)."""
    distances: dict[str, dict[str, int]] | None = None
    """NUMA distances: distances[from][to], keys are NUMA node ids."""
    devices: Annotated[list[Device], Field(max_length=MAX_DEVICES)] | None = None
    """Devices with their NUMA node, memory and groups."""
    admitted: Annotated[list[AdmittedPod], Field(max_length=MAX_ADMITTED)] | None = None
    """Pods admitted on the node with their affinity and allocation."""
    rejected: Count | None = None
    """Pods rejected with TopologyAffinityError since the agent started."""
    dra_devices: Annotated[list[DraDevice], Field(max_length=MAX_DRA_DEVICES)] | None = None
    """DRA devices of the node's ResourceSlices with their NUMA nodes (at most 1024;
    summary.draDevices counts them all)."""
    observed_policy_generation: Count | None = None
    """The spec.policyGeneration the agent applies."""
    conditions: Annotated[list[Condition], Field(json_schema_extra=CONDITIONS_LIST)] | None = None
    """Ready, PolicyApplied."""
    summary: NodeTopologySummary | None = None
    """Totals shown by kubectl get nt (written by the agent with the rest of the status)."""
    kubelet: KubeletSettings | None = None
    """Real nodes only: the kubelet's alignment settings; the admitted pods and the zones'
    allocatable are then what the kubelet reports (PodResources API)."""


def _cpu_count(resources: ResourceList | None) -> int | None:
    if resources and "cpu" in resources:
        return int(parse_quantity(resources["cpu"]))
    return None


def summarize(status: NodeTopologyStatus) -> NodeTopologySummary:
    """The printer-column totals of a status: NUMA nodes, free/total CPUs and devices,
    admitted pods. Free CPUs come from the zones' ``available`` (else all allocatable),
    used devices from the admitted pods' device and GPU ids."""
    zones = status.zones or []
    total = free = 0
    for zone in zones:
        z_total = _cpu_count(zone.allocatable)
        if z_total is None:
            z_total = len(parse_cpulist(zone.cpus))
        z_free = _cpu_count(zone.available)
        total += z_total
        free += z_total if z_free is None else z_free
    devices = status.devices or []
    used: set[tuple[str, str]] = set()
    known = {(d.resource, d.id) for d in devices}
    for pod in status.admitted or []:
        for resource, ids in (pod.devices or {}).items():
            used.update((resource, i) for i in ids)
        for ids in (pod.gpus or {}).values():
            used.update((d.resource, d.id) for d in devices if d.id in ids)
    n_used = len(used & known)
    return NodeTopologySummary(
        numa_nodes=len(zones),
        cpus=f"{free}/{total}",
        devices=f"{len(devices) - n_used}/{len(devices)}",
        pods=len(status.admitted or []),
        dra_devices=None if status.dra_devices is None else len(status.dra_devices),
    )


class NodeTopology(Model):
    """A NodeTopology object as a whole (metadata kept as a plain mapping)."""

    model_config = ConfigDict(extra="ignore")

    api_version: Literal["numalign.io/v1alpha1"] = "numalign.io/v1alpha1"
    kind: Literal["NodeTopology"] = "NodeTopology"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: NodeTopologySpec = Field(default_factory=NodeTopologySpec)
    status: NodeTopologyStatus | None = None

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Policy", "type": "string", "jsonPath": ".spec.policy"},
    {"name": "Scope", "type": "string", "jsonPath": ".spec.scope"},
    {"name": "NUMA", "type": "integer", "jsonPath": ".status.summary.numaNodes",
     "description": "NUMA nodes"},
    {"name": "CPUs", "type": "string", "jsonPath": ".status.summary.cpus",
     "description": "allocatable CPUs free/total"},
    {"name": "Devices", "type": "string", "jsonPath": ".status.summary.devices",
     "description": "devices free/total"},
    {"name": "Pods", "type": "integer", "jsonPath": ".status.summary.pods",
     "description": "admitted pods"},
    {"name": "Rejected", "type": "integer", "jsonPath": ".status.rejected",
     "description": "pods rejected with TopologyAffinityError"},
    {"name": "DRA", "type": "integer", "jsonPath": ".status.summary.draDevices",
     "description": "DRA devices in the node's ResourceSlices"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
SELECTABLE_FIELDS = [".spec.policy"]
