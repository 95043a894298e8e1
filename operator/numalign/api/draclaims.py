"""A pod's ResourceClaims, their allocated devices and those devices' NUMA nodes (pure).

Reads, leniently and bounded (no Kubernetes client here):

- the pod's claims: ``spec.resourceClaims[]`` (``name`` with ``resourceClaimName``, a
  claim shared by name, or ``resourceClaimTemplateName``) and, for a template, the name
  of the claim generated for the pod in ``status.resourceClaimStatuses[]`` (``name``,
  ``resourceClaimName``);
- which claims each container uses: ``resources.claims[]`` (``name``, optional
  ``request``: only that request's devices; without it every device of the claim), of
  init containers and containers;
- a ResourceClaim's allocation: ``status.allocation.devices.results[]`` (``request``,
  ``driver``, ``pool``, ``device``; a request ``<main>/<sub>`` counts as ``<main>``);
- the node's DRA devices (:class:`numalign.api.dra.DraDevice`, from its ResourceSlices):
  each allocated device's NUMA nodes.

API: :func:`pod_claims` (the pod's claims, and the names of the ResourceClaim objects to
read), :func:`pod_dra_devices` (everything, given those objects and the node's devices)
giving :class:`PodDraDevices`: per claim whether it is allocated and its devices
(:class:`ClaimDevice`: driver, pool, device, NUMA nodes or None, and a problem when its
NUMA nodes cannot be told), per container the claim requests it uses, and
:meth:`PodDraDevices.requests`: the fixed-hint input of the ``dra`` resource kind
(:mod:`numalign.topology.managers.dra`). A device whose NUMA node is unknown gives no
hint and says why (never guessed); a device the node's slices give a bad or absent NUMA
node (a malformed ``numaNode``, a NUMA node the machine lacks) says so, naming the slice,
the device and the attribute; neither spoils any other device or pod.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from numalign.topology.machine import Machine
from numalign.topology.managers.dra import DraDeviceRef, DraRequest, NumaNodes

from .dra import DraDevice
from .draemulated import DRIVER, device_names

# Warning events of a node admitting a pod with claims: devices that give no hint, and
# the devices a refused pod was decided with (its claims are released once it failed).
DEVICE_PROBLEM_REASON = "DRADeviceTopology"
REJECTED_DEVICES_REASON = "DRADevicesAtRejection"

MAX_POD_CLAIMS = 32  # spec.resourceClaims (the API's own bound)
MAX_RESULTS = 256  # allocated devices read per claim
MAX_CONTAINER_CLAIMS = 64  # resources.claims per container
MAX_TEXT = 253
DRA_API = "/apis/resource.k8s.io/v1"  # the API group and version every DRA path is under

JSON = dict[str, Any]

# A device's kind among the node's devices: devices of one kind are the peers whose
# NUMA nodes set the preferred hints' width (an extended resource's devices, for the
# kubelet). Default: the driver and pool.
KindOf = Callable[[DraDevice], str]


def _str(v: Any) -> str | None:
    return v[:MAX_TEXT] if isinstance(v, str) and v else None


def _list(v: Any, bound: int) -> list[Any]:
    return list(v[:bound]) if isinstance(v, list) else []


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


@dataclass(frozen=True)
class PodClaim:
    """One entry of ``spec.resourceClaims``: the pod's name for it, the ResourceClaim
    object's name (None: the template's claim is not generated yet), the template's name
    when it comes from one; ``shared``: named by ``resourceClaimName`` (never the pod's
    own: a redeploy leaves it alone)."""

    name: str
    claim: str | None
    template: str | None = None

    @property
    def shared(self) -> bool:
        return self.template is None


def pod_claims(pod: Mapping[str, Any]) -> tuple[list[PodClaim], list[str]]:
    """The pod's claims and problems reading them (each naming the field)."""
    spec, status = _map(pod.get("spec")), _map(pod.get("status"))
    generated: dict[str, str | None] = {}
    for s in _list(status.get("resourceClaimStatuses"), MAX_POD_CLAIMS):
        name = _str(_map(s).get("name"))
        if name:
            generated[name] = _str(_map(s).get("resourceClaimName"))
    out: list[PodClaim] = []
    problems: list[str] = []
    raw = spec.get("resourceClaims")
    if raw is not None and not isinstance(raw, list):
        return [], ["spec.resourceClaims: want a list"]
    for i, rc in enumerate(_list(raw, MAX_POD_CLAIMS)):
        where = f"spec.resourceClaims[{i}]"
        name = _str(_map(rc).get("name"))
        if name is None:
            problems.append(f"{where}: no name")
            continue
        shared = _str(_map(rc).get("resourceClaimName"))
        template = _str(_map(rc).get("resourceClaimTemplateName"))
        if shared:
            out.append(PodClaim(name, shared))
        elif template:
            out.append(PodClaim(name, generated.get(name), template))
        else:
            problems.append(f"{where} ({name}): neither resourceClaimName nor "
                            "resourceClaimTemplateName")
    return out, problems


def claim_path(namespace: str, name: str) -> str:
    """The API path of ResourceClaim ``namespace/name`` (resource.k8s.io/v1)."""
    return (f"{DRA_API}/namespaces/{quote(namespace, safe='')}/resourceclaims/"
            f"{quote(name, safe='')}")


def uses_claims(pod: Mapping[str, Any]) -> bool:
    """Whether the pod names any ResourceClaim."""
    return bool(_list(_map(pod.get("spec")).get("resourceClaims"), 1))


def container_claims(pod: Mapping[str, Any]) -> dict[str, list[tuple[str, str | None]]]:
    """Container name -> (pod claim name, request or None: all of it) it uses."""
    spec = _map(pod.get("spec"))
    out: dict[str, list[tuple[str, str | None]]] = {}
    for key in ("initContainers", "containers"):
        for c in _list(spec.get(key), 1024):
            name = _str(_map(c).get("name"))
            claims = _list(_map(_map(c).get("resources")).get("claims"), MAX_CONTAINER_CLAIMS)
            refs = [(n, _str(_map(r).get("request"))) for r in claims
                    if (n := _str(_map(r).get("name")))]
            if name and refs:
                out[name] = refs
    return out


@dataclass(frozen=True)
class ClaimDevice:
    """One device allocated to a claim: the claim's request (``<main>`` of
    ``<main>/<sub>``), its driver, pool and name, its NUMA nodes (None: unknown) and why
    they are unknown (or bad)."""

    request: str
    driver: str
    pool: str
    device: str
    numa_nodes: NumaNodes
    source: str = "unknown"
    problem: str | None = None

    @property
    def id(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"

    def ref(self) -> DraDeviceRef:
        return DraDeviceRef(self.driver, self.pool, self.device, self.numa_nodes)

    def to_json(self) -> JSON:
        out: JSON = {"request": self.request, "driver": self.driver, "pool": self.pool,
                     "device": self.device, "source": self.source}
        if self.numa_nodes is not None:
            out["numaNodes"] = list(self.numa_nodes)
        if self.problem:
            out["problem"] = self.problem
        return out


@dataclass(frozen=True)
class ClaimState:
    """One of the pod's claims as read: allocated or not, its devices, a problem."""

    claim: PodClaim
    allocated: bool
    devices: tuple[ClaimDevice, ...] = ()
    problem: str | None = None

    def to_json(self) -> JSON:
        out: JSON = {"name": self.claim.name, "allocated": self.allocated,
                     "devices": [d.to_json() for d in self.devices]}
        if self.claim.claim:
            out["resourceClaim"] = self.claim.claim
        if self.claim.template:
            out["template"] = self.claim.template
        if self.problem:
            out["problem"] = self.problem
        return out


@dataclass
class PodDraDevices:
    """A pod's claims and their devices on one node (:func:`pod_dra_devices`)."""

    claims: list[ClaimState] = field(default_factory=list)
    # container -> (pod claim name, request or None) it uses
    containers: dict[str, list[tuple[str, str | None]]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)  # reading the pod or its claims
    # (driver, pool, device) kind -> NUMA nodes of the node's devices of that kind
    peers: dict[str, tuple[NumaNodes, ...]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)  # device id -> its kind

    @property
    def ready(self) -> bool:
        """Every claim allocated (the pod can be admitted)."""
        return all(c.allocated for c in self.claims)

    @property
    def pending(self) -> list[str]:
        """The pod's names of the claims not allocated yet."""
        return [c.claim.name for c in self.claims if not c.allocated]

    def device_problems(self) -> list[str]:
        """Why allocated devices give no hint (each naming the claim and the device)."""
        return [f"claim {c.claim.name}: device {d.id}: {d.problem}"
                for c in self.claims for d in c.devices if d.problem]

    def devices_of(self, container: str) -> list[tuple[str, ClaimDevice]]:
        """(pod claim name, device) for every device ``container`` uses."""
        by_name = {c.claim.name: c for c in self.claims}
        out: list[tuple[str, ClaimDevice]] = []
        for name, request in self.containers.get(container, ()):
            st = by_name.get(name)
            for d in st.devices if st else ():
                if request is None or d.request == request:
                    out.append((name, d))
        return out

    def requests(self) -> dict[str, list[DraRequest]]:
        """Per container, its claim requests with their devices and peers: the input of
        :class:`numalign.topology.managers.dra.DraDevices`."""
        out: dict[str, list[DraRequest]] = {}
        for container in self.containers:
            grouped: dict[tuple[str, str], list[ClaimDevice]] = {}
            for name, d in self.devices_of(container):
                grouped.setdefault((name, d.request), []).append(d)
            reqs: list[DraRequest] = []
            for (name, request), devs in sorted(grouped.items()):
                kinds = sorted({self.kinds.get(d.id, _default_kind(d.driver, d.pool))
                                for d in devs})
                peers = tuple(p for k in kinds for p in self.peers.get(k, ()))
                reqs.append(DraRequest(name, request, tuple(d.ref() for d in devs), peers))
            if reqs:
                out[container] = reqs
        return out

    def to_json(self) -> JSON:
        return {"claims": [c.to_json() for c in self.claims],
                "containers": {k: [{"claim": n, **({"request": r} if r else {})}
                                   for n, r in v] for k, v in self.containers.items()},
                "problems": list(self.problems)}


def _default_kind(driver: str, pool: str) -> str:
    return f"{driver}/{pool}"


def default_kind(d: DraDevice) -> str:
    return _default_kind(d.driver, d.pool)


def emulated_kind_of(machine: Machine) -> KindOf:
    """Device kinds on an emulated node (:mod:`.draemulated`): a device of the emulated
    driver is of its machine-file resource (a GPU's peers are the node's GPUs, as for the
    device manager); any other driver's device: its driver and pool."""
    devices = list(machine.devices)
    resource = dict(zip(device_names(devices), (d.resource for d in devices), strict=True))

    def kind_of(d: DraDevice) -> str:
        if d.driver == DRIVER and d.device in resource:
            return f"{DRIVER}/{resource[d.device]}"
        return default_kind(d)

    return kind_of


def status_devices(entries: Iterable[Any]) -> list[DraDevice]:
    """The node's DRA devices as its NodeTopology ``status.draDevices`` lists them (the
    entries that cannot be read are left out)."""
    out: list[DraDevice] = []
    for e in entries:
        m = _map(e)
        driver, pool, device = _str(m.get("driver")), _str(m.get("pool")), _str(m.get("device"))
        numa = m.get("numaNodes")
        ok = isinstance(numa, list) and all(
            isinstance(n, int) and not isinstance(n, bool) for n in numa)
        if driver and pool and device:
            source = m.get("source")
            out.append(DraDevice(str(m.get("slice") or ""), driver, pool, device,
                                 tuple(numa) if ok and numa else None,
                                 source if source in _SOURCES else "unknown",
                                 problem=_str(m.get("problem"))))
    return out


_SOURCES = ("numaNode", "pcieRoot", "pciBusID", "driverAttribute", "unknown")


def allocation_results(claim: Mapping[str, Any]) -> tuple[bool, list[JSON], str | None]:
    """(allocated, results, problem) of a ResourceClaim object."""
    alloc = _map(claim.get("status")).get("allocation")
    if not isinstance(alloc, Mapping):
        return False, [], None
    results = _map(alloc.get("devices")).get("results")
    if results is None:
        return True, [], None
    if not isinstance(results, list):
        return True, [], "status.allocation.devices.results: want a list"
    return True, [dict(r) for r in results[:MAX_RESULTS] if isinstance(r, Mapping)], None


def pod_dra_devices(pod: Mapping[str, Any], claims: Mapping[str, Mapping[str, Any] | None],
                    node: Iterable[DraDevice] | None, machine: Collection[int] | None = None,
                    kind_of: KindOf = default_kind) -> PodDraDevices:
    """The pod's claims on a node: ``claims``: the pod's ResourceClaim objects by name
    (None or absent: not found); ``node``: the node's DRA devices (None: not read yet);
    ``machine``: its NUMA node ids (a device on another is a problem); ``kind_of``: the
    kind of a node device (its peers: the devices of the same kind)."""
    refs, problems = pod_claims(pod)
    out = PodDraDevices(containers=container_claims(pod), problems=problems)
    index: dict[tuple[str, str, str], DraDevice] = {}
    for d in node or ():
        if d.device is None:
            continue
        index.setdefault((d.driver, d.pool, d.device), d)
        kind = kind_of(d)
        out.kinds[f"{d.driver}/{d.pool}/{d.device}"] = kind
        out.peers.setdefault(kind, ())
        out.peers[kind] += (d.numa_nodes,)
    for ref in refs:
        if ref.claim is None:
            out.claims.append(ClaimState(ref, False, problem=(
                f"the claim for template {ref.template} is not generated yet")))
            continue
        obj = claims.get(ref.claim)
        if obj is None:
            out.claims.append(ClaimState(ref, False, problem=(
                f"ResourceClaim {ref.claim} not found")))
            continue
        allocated, results, problem = allocation_results(obj)
        if problem:
            problem = f"ResourceClaim {ref.claim}: {problem}"
        if not allocated:
            out.claims.append(ClaimState(ref, False, problem=(
                f"ResourceClaim {ref.claim} is not allocated yet")))
            continue
        devices: list[ClaimDevice] = []
        for i, r in enumerate(results):
            request, driver = _str(r.get("request")), _str(r.get("driver"))
            pool, device = _str(r.get("pool")), _str(r.get("device"))
            if not (request and driver and pool and device):
                problem = (f"ResourceClaim {ref.claim}: status.allocation.devices."
                           f"results[{i}]: want request, driver, pool and device")
                continue
            main = request.partition("/")[0]
            found = index.get((driver, pool, device))
            if node is None:
                devices.append(ClaimDevice(main, driver, pool, device, None, "unknown",
                                           "this node's ResourceSlices are not read yet"))
            elif found is None:
                devices.append(ClaimDevice(main, driver, pool, device, None, "unknown",
                                           "not in this node's ResourceSlices"))
            else:
                numa = found.numa_nodes
                if numa is not None and machine is not None and any(
                        n not in machine for n in numa):
                    devices.append(ClaimDevice(
                        main, driver, pool, device, None, "unknown",
                        f"ResourceSlice {found.slice}: NUMA nodes "
                        f"{','.join(map(str, numa))} are not all on this machine"))
                else:
                    devices.append(ClaimDevice(main, driver, pool, device, numa,
                                               found.source, found.problem))
        out.claims.append(ClaimState(ref, True, tuple(devices), problem))
    return out


__all__ = ["DEVICE_PROBLEM_REASON", "DRA_API", "REJECTED_DEVICES_REASON", "ClaimDevice",
           "ClaimState",
           "KindOf", "PodClaim", "PodDraDevices",
           "allocation_results", "container_claims", "default_kind", "emulated_kind_of",
           "pod_claims", "pod_dra_devices", "status_devices", "uses_claims"]
