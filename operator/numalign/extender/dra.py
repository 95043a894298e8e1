"""The extender's read model of Dynamic Resource Allocation (resource.k8s.io/v1): the
DeviceClasses, ResourceClaimTemplates, ResourceClaims and ResourceSlices of the
cluster, fed by their watches (:meth:`DraCatalog.event`, :meth:`DraCatalog.load`), kept
slim (a claim: its spec's devices and its allocation's results; a slice: its driver,
pool, node and devices).

For a node it gives the devices its slices offer, each with its NUMA nodes as the agent
reads them (:func:`numalign.api.dra.node_devices`: the ``numaNode`` attribute, else a
known driver's own; the extender has no sysfs, so ``pcieRoot`` / ``pciBusID`` give
unknown) and its attributes for the selectors (:class:`numalign.api.draasks.NodeDevice`),
built once per change of the node's slices; which devices claims hold; and, for a pod,
its device choices on a node (:meth:`DraCatalog.choices`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from numalign.api.dra import node_devices
from numalign.api.draasks import (
    ClaimAsk,
    NodeDevice,
    NodeOffer,
    PodChoices,
    Selector,
    device_attributes,
    pod_choices,
    pod_claim_asks,
    selectors_of,
)
from numalign.api.draclaims import DRA_API, pod_claims

JSON = dict[str, Any]
KINDS = ("deviceclasses", "resourceclaimtemplates", "resourceclaims", "resourceslices")
PATHS = {k: f"{DRA_API}/{k}" for k in KINDS}


def _map(v: Any) -> Mapping[str, Any]:
    return v if isinstance(v, Mapping) else {}


def _name(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = _map(obj.get("metadata"))
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _results(claim: Mapping[str, Any]) -> list[str]:
    """The ids (driver/pool/device) of the devices a claim holds."""
    alloc = _map(_map(claim.get("status")).get("allocation"))
    results = _map(alloc.get("devices")).get("results")
    out = []
    for r in results if isinstance(results, list) else ():
        parts = [_map(r).get(k) for k in ("driver", "pool", "device")]
        if all(isinstance(p, str) and p for p in parts):
            out.append("/".join(str(p) for p in parts))
    return out


POD_CLAIM_NAME = "resource.kubernetes.io/pod-claim-name"


def _generated_for(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """(owner pod uid, the pod's name for the claim) of a claim generated for a pod."""
    meta = _map(obj.get("metadata"))
    name = _map(meta.get("annotations")).get(POD_CLAIM_NAME)
    refs = meta.get("ownerReferences")
    for r in refs if isinstance(refs, list) else ():
        if _map(r).get("kind") == "Pod" and isinstance(name, str) and _map(r).get("uid"):
            return str(_map(r)["uid"]), name
    return None


def _slim_claim(obj: Mapping[str, Any]) -> JSON:
    status = _map(obj.get("status"))
    out: JSON = {"metadata": {"name": _name(obj)[1]},
                 "spec": {"devices": _map(_map(obj.get("spec")).get("devices"))}}
    if "allocation" in status:
        alloc = _map(status.get("allocation"))
        out["status"] = {"allocation": {"devices": {
            "results": _map(alloc.get("devices")).get("results") or []}}}
    return out


class DraCatalog:
    """DeviceClasses, templates, claims and slices as the watches show them."""

    def __init__(self) -> None:
        self.classes: dict[str, list[Selector]] = {}
        self.templates: dict[str, dict[str, JSON]] = {}  # namespace -> name -> template
        self.claims: dict[str, dict[str, JSON]] = {}  # namespace -> name -> slim claim
        self.in_use: dict[str, str] = {}  # device id -> namespace/claim holding it
        # pod uid -> the pod's claim name -> the claim generated for it (and back)
        self.generated: dict[str, dict[str, str]] = {}
        self._owner: dict[str, tuple[str, str]] = {}
        self.slices: dict[str, JSON] = {}
        self._slice_node: dict[str, str] = {}  # slice -> its node ("" : per device)
        self._node_cache: dict[tuple[str, frozenset[int] | None], NodeOffer] = {}
        self.listed: set[str] = set()  # the kinds listed once
        self.changes = 0

    @property
    def ready(self) -> bool:
        """Every kind listed once (before, pods with claims are not decided)."""
        return len(self.listed) == len(KINDS)

    # ------------------------------------------------------------ feeding

    def load(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        """A full listing of ``kind`` (one of :data:`KINDS`): what it lacks is forgotten."""
        if kind == "deviceclasses":
            self.classes.clear()
        elif kind == "resourceclaimtemplates":
            self.templates.clear()
        elif kind == "resourceclaims":
            self.claims.clear()
            self.in_use.clear()
            self.generated.clear()
            self._owner.clear()
        elif kind == "resourceslices":
            self.slices.clear()
            self._slice_node.clear()
            self._node_cache.clear()
        for obj in items:
            self.event(kind, "ADDED", obj)
        self.listed.add(kind)

    def event(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        """A watch event (ADDED, MODIFIED, DELETED) of ``kind``."""
        self.changes += 1
        ns, name = _name(obj)
        gone = event == "DELETED"
        if kind == "deviceclasses":
            if gone:
                self.classes.pop(name, None)
            else:
                self.classes[name] = selectors_of(_map(obj.get("spec")).get("selectors"))
        elif kind == "resourceclaimtemplates":
            if gone:
                self.templates.get(ns, {}).pop(name, None)
            else:
                spec = _map(_map(obj.get("spec")).get("spec"))
                self.templates.setdefault(ns, {})[name] = {
                    "spec": {"spec": {"devices": _map(spec.get("devices"))}}}
        elif kind == "resourceclaims":
            self._claim(ns, name, None if gone else obj)
        elif kind == "resourceslices":
            self._slice(name, None if gone else obj)

    def _claim(self, ns: str, name: str, obj: Mapping[str, Any] | None) -> None:
        key = f"{ns}/{name}"
        old = self.claims.get(ns, {}).pop(name, None)
        for d in _results(old) if old is not None else ():
            if self.in_use.get(d) == key:
                del self.in_use[d]
        owner = self._owner.pop(key, None)
        if owner is not None:
            mine = self.generated.get(owner[0], {})
            mine.pop(owner[1], None)
            if not mine:
                self.generated.pop(owner[0], None)
        if obj is None:
            return
        slim = _slim_claim(obj)
        self.claims.setdefault(ns, {})[name] = slim
        made = _generated_for(obj)
        if made is not None:
            self.generated.setdefault(made[0], {})[made[1]] = name
            self._owner[key] = made
        for d in _results(slim):
            self.in_use[d] = key

    def _slice(self, name: str, obj: Mapping[str, Any] | None) -> None:
        for node in {self._slice_node.pop(name, None)} - {None}:
            self._forget(str(node))
        self.slices.pop(name, None)
        if obj is None:
            return
        spec = _map(obj.get("spec"))
        node = str(spec.get("nodeName") or "") if spec.get("perDeviceNodeSelection") \
            is not True else ""
        if not node and spec.get("perDeviceNodeSelection") is not True:
            return  # devices of all nodes or a node selector: not bound to one node's NUMA
        self.slices[name] = {"metadata": {"name": name}, "spec": dict(spec)}
        self._slice_node[name] = node
        self._forget(node)

    def _forget(self, node: str) -> None:
        for key in [k for k in self._node_cache if k[0] == node or not node]:
            del self._node_cache[key]

    # ------------------------------------------------------------ reading

    def node_devices(self, node: str, numa: Collection[int] | None = None) -> list[NodeDevice]:
        """The devices ``node``'s slices offer; ``numa``: the machine's NUMA nodes (a
        device on another is of unknown NUMA node, as the agent reads it)."""
        return self.offer(node, numa).devices

    def offer(self, node: str, numa: Collection[int] | None = None) -> NodeOffer:
        """:meth:`node_devices`, with what pods' choices read of them (built once per
        change of the node's slices)."""
        key = (node, frozenset(numa) if numa is not None else None)
        hit = self._node_cache.get(key)
        if hit is not None:
            return hit
        mine = [s for n, s in ((self._slice_node.get(k), s) for k, s in self.slices.items())
                if n in (node, "")]
        attrs: dict[tuple[str, str, str], dict[str, Any]] = {}
        shared: set[tuple[str, str, str]] = set()
        for s in mine:
            spec = _map(s.get("spec"))
            driver = str(spec.get("driver") or "")
            pool = str(_map(spec.get("pool")).get("name") or "")
            for d in spec.get("devices") or () if isinstance(spec.get("devices"), list) else ():
                dname = _map(d).get("name")
                if isinstance(dname, str):
                    attrs[(driver, pool, dname)] = device_attributes(
                        driver, _map(d).get("attributes"))
                    if _map(d).get("allowMultipleAllocations") is True:
                        shared.add((driver, pool, dname))
        out = []
        for d in node_devices(mine, node, None, numa).devices:
            if d.device is None:
                continue
            a = attrs.get((d.driver, d.pool, d.device), {})
            out.append(NodeDevice(d.driver, d.pool, d.device, d.numa_nodes,
                                  d.source == "numaNode", a,
                                  (d.driver, d.pool, d.device) in shared))
        offer = self._node_cache[key] = NodeOffer(out)
        return offer

    def asks(self, pod: Mapping[str, Any]) -> tuple[list[ClaimAsk], list[str]]:
        """The pod's claims, read against the claims and templates of its namespace."""
        meta = _map(pod.get("metadata"))
        ns, uid = str(meta.get("namespace") or "default"), str(meta.get("uid") or "")
        mine = self.generated.get(uid) if uid else None
        return pod_claim_asks(pod, self.claims.get(ns, {}), self.templates.get(ns, {}), mine)

    def claim_names(self, pod: Mapping[str, Any]) -> list[str]:
        """The names of the pod's ResourceClaims as known now: shared by name, or
        generated from a template (the pod's status, else the claim's owner)."""
        meta = _map(pod.get("metadata"))
        mine = self.generated.get(str(meta.get("uid") or ""), {})
        refs, _ = pod_claims(pod)
        return [n for n in (r.claim or mine.get(r.name) for r in refs) if n]

    def class_selectors(self, names: Iterable[str]) -> dict[str, list[Selector] | None]:
        return {n: self.classes.get(n) for n in names}

    def choices(self, pod: Mapping[str, Any], node: str,
                numa: Collection[int] | None = None,
                asks: tuple[list[ClaimAsk], list[str]] | None = None) -> PodChoices:
        """The pod's device choices on ``node`` (``asks``: :meth:`asks` of the pod, when
        the caller has it)."""
        claims, problems = asks if asks is not None else self.asks(pod)
        names = {w.device_class for a in claims for _, ways in a.requests for w in ways}
        return pod_choices(pod, claims, self.offer(node, numa), self.in_use,
                           self.class_selectors(names), problems)


__all__ = ["KINDS", "PATHS", "DraCatalog"]
