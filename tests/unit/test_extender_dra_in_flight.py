"""Pods in flight with claims, checked against the node itself.

The extender approves a pod on a node while pods it approved before are still in flight
(not bound yet, their claims not allocated): each may land on that node or not, with
whatever devices the allocator then picks. Whatever happens, a pod the extender approved
must be admitted by the node: here random nodes, random pods in flight (with and without
claims, under single-numa-node, restricted and best-effort) and random landings (a
subset of the pods in flight, in their order, each with devices the allocator could give
it) are decided by the emulated node's admission (``NodeState.decide`` with the claims'
devices, as the agent reads them), and every pod the extender approved must be admitted.
The extender decides quickly where the pods in flight surely leave room
(``extender.inflight.room_left`` with what each pod in flight can reach) and else decides
every way they may land: both paths are exercised, and the shortcut is compared with
deciding every way."""

from __future__ import annotations

import copy
import random
from typing import Any

import testdata
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api import draemulated as de
from numalign.api.dra import node_devices
from numalign.api.draasks import NUMA_ATTRIBUTE
from numalign.api.draclaims import emulated_kind_of, pod_dra_devices
from numalign.api.effective import NodeKind, NodePolicy, effective_policy
from numalign.api.names import ANN_RESOLVED, IN_FLIGHT_REASON
from numalign.api.nodestatus import HeldPod
from numalign.api.resolved import Resolved
from numalign.extender.decide import Decider
from numalign.extender.dra import DraCatalog
from numalign.topology.machine import Machine, load_machine
from numalign.topology.managers.dra import DraDevices

JSON = dict[str, Any]
MACHINES = [load_machine(testdata.MACHINES / f) for f in ("group4-gpu.yaml",
                                                            "dgx-a100-like.yaml")]
GPU_CLASS = de.device_class_name("nvidia.com/gpu")
NODE = "n0"
SEEDS = 60
# (policy, GPUs by claim (0: no claim), a numaNode matchAttribute, CPUs low-high)
SHAPES = [("single-numa-node", 1, True, (1, 6)), ("single-numa-node", 2, True, (2, 8)),
          ("restricted", 1, False, (1, 6)), ("best-effort", 2, False, (2, 5)),
          ("best-effort", 1, False, (1, 4)), ("single-numa-node", 0, False, (2, 10)),
          ("restricted", 0, False, (1, 8)), ("best-effort", 0, False, (1, 6))]


def make_pod(rng: random.Random, name: str) -> tuple[JSON, JSON | None]:
    """A random pod (and its claim, unallocated)."""
    policy, gpus, constraint, (lo, hi) = rng.choice(SHAPES)
    cpu = str(rng.randint(lo, hi))
    res = {"cpu": cpu, "memory": f"{rng.choice((1, 2, 4))}Gi"}
    c: JSON = {"name": "c", "resources": {"requests": res, "limits": dict(res)}}
    pod: JSON = {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                              "annotations": {ANN_RESOLVED: Resolved(policy, "pod", source="pod")
                                              .annotation()}},
                 "spec": {"containers": [c]}}
    if not gpus:
        return pod, None
    c["resources"]["claims"] = [{"name": "gpus"}]
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": f"{name}-gpus"}]
    devices: JSON = {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": GPU_CLASS, "count": gpus}}]}
    if constraint:
        devices["constraints"] = [{"matchAttribute": NUMA_ATTRIBUTE}]
    return pod, {"metadata": {"name": f"{name}-gpus", "namespace": "ns"},
                 "spec": {"devices": devices}}


class Node:
    """One emulated DRA node: its machine, what it holds, and the extender's view."""

    def __init__(self, rng: random.Random, machine: Machine) -> None:
        self.machine = machine
        self.numa = [n.id for n in machine.numa_nodes]
        self.slices = de.resource_slices(machine, NODE)
        self.cat = DraCatalog()
        self.cat.load("deviceclasses", de.device_classes({d.resource for d in machine.devices}))
        self.cat.load("resourceslices", self.slices)
        self.cat.load("resourceclaims", [])
        self.cat.load("resourceclaimtemplates", [])
        self.gpus = [d for d in self.cat.offer(NODE, self.numa).devices
                     if all(s.matches(d) for s in self.cat.classes[GPU_CLASS])]
        self.state = NodeState(NODE, machine)
        self.used: set[str] = set()
        # some pods already there (with their devices), leaving the node part full
        for i in range(rng.randint(0, 6)):
            pod, claim = make_pod(rng, f"old{i}")
            self.land(rng, pod, claim, self.state, self.used)
        self.decider = Decider(dra=self.cat)
        self.decider.update({"metadata": {"name": NODE, "resourceVersion": "1"}, "spec": {},
                             "status": build_status(self.state)})

    def pick(self, rng: random.Random, claim: JSON, used: set[str]) -> list[Any] | None:
        """Devices the allocator could give ``claim`` among those not ``used``."""
        (req,) = claim["spec"]["devices"]["requests"]
        count = req["exactly"]["count"]
        free = [d for d in self.gpus if d.id not in used]
        if claim["spec"]["devices"].get("constraints"):
            groups: dict[Any, list[Any]] = {}
            for d in free:
                groups.setdefault(d.numa_nodes, []).append(d)
            fits = [g for g in groups.values() if len(g) >= count]
            return rng.sample(rng.choice(fits), count) if fits else None
        return rng.sample(free, count) if len(free) >= count else None

    def land(self, rng: random.Random, pod: JSON, claim: JSON | None, state: NodeState,
             used: set[str]) -> bool | None:
        """The node admits ``pod`` with devices the allocator could give it (None: no
        devices left for it, the scheduler would not bind it here)."""
        kinds = []
        if claim is not None:
            got = self.pick(rng, claim, used)
            if got is None:
                return None
            used |= {d.id for d in got}
            done = {**claim, "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": d.driver, "pool": d.pool, "device": d.device}
                for d in got]}}}}
            if pod["metadata"]["name"].startswith("old"):
                self.cat.event("resourceclaims", "ADDED", done)  # held by another claim
            devices = node_devices(self.slices, NODE, None, self.numa).devices
            kinds.append(DraDevices(pod_dra_devices(
                pod, {claim["metadata"]["name"]: done}, devices, self.numa,
                emulated_kind_of(self.machine)).requests()))
        placed = {**pod, "spec": {**pod["spec"], "nodeName": NODE}}
        eff = effective_policy(placed, NodePolicy(NodeKind.EMULATED, state.default))
        return bool(state.decide(placed, eff, devices=kinds).admit)


def approve(node: Node, rng: random.Random, count: int
            ) -> list[tuple[JSON, JSON | None, HeldPod]]:
    """Up to ``count`` pods the extender approves one after another (each counting the
    ones before in flight), with their claims and holds."""
    flying: list[tuple[JSON, JSON | None, HeldPod]] = []
    for i in range(count):
        pod, claim = make_pod(rng, f"f{i}")
        if claim is not None:
            node.cat.event("resourceclaims", "ADDED", claim)
        v = node.decider.decide(pod, NODE, in_flight=[(p, h) for p, _, h in flying])
        hold = v.held_by(pod)
        if v.fits and hold is not None:
            flying.append((pod, claim, hold))
    return flying


def check_seed(seed: int, landings: int = 12) -> tuple[int, int]:
    """(candidates approved, landings checked) for one random node; raises on a pod the
    extender approved and the node refused."""
    rng = random.Random(seed)
    node = Node(rng, rng.choice(MACHINES))
    flying = approve(node, rng, rng.randint(2, 6))
    approved = checked = 0
    for j in range(4):
        pod, claim = make_pod(rng, f"c{j}")
        if claim is not None:
            node.cat.event("resourceclaims", "ADDED", claim)
        v = node.decider.decide(pod, NODE, in_flight=[(p, h) for p, _, h in flying])
        if not v.fits:
            continue
        approved += 1
        for t in range(landings):
            state, used = copy.deepcopy(node.state), set(node.used)
            landed = []
            for p, c, _ in flying:
                if rng.random() < 0.8:
                    landed.append((p["metadata"]["name"], node.land(rng, p, c, state, used)))
            ok = node.land(rng, pod, claim, state, used)
            if ok is None:
                continue
            checked += 1
            assert ok, (f"seed {seed}, candidate {j} ({pod['metadata']['annotations']}, "
                        f"{pod['spec']['containers'][0]['resources']}), landing {t}: the "
                        f"extender approved it, the node refused it after {landed}")
    return approved, checked


def test_an_approved_pod_is_admitted_however_the_pods_in_flight_land() -> None:
    total = [check_seed(s, landings=6) for s in range(SEEDS)]
    # enough approvals and landings for the check to mean something
    assert sum(a for a, _ in total) >= 100
    assert sum(c for _, c in total) >= 300


def test_the_room_shortcut_agrees_with_deciding_every_way() -> None:
    """Where the room check admits, deciding every way the pods in flight may land
    admits too (the check is a sufficient condition, never a looser answer); and it
    answers for most candidates."""
    shortcut = both = 0
    for seed in range(SEEDS):
        rng = random.Random(seed)
        node = Node(rng, rng.choice(MACHINES))
        flying = approve(node, rng, rng.randint(2, 6))
        in_flight = [(p, h) for p, _, h in flying]
        for j in range(4):
            pod, claim = make_pod(rng, f"c{j}")
            if claim is not None:
                node.cat.event("resourceclaims", "ADDED", claim)
            v = node.decider.decide(pod, NODE, in_flight=in_flight)
            node.decider.room_check = False
            node.decider._cache.clear()
            every = node.decider.decide(pod, NODE, in_flight=in_flight)
            node.decider.room_check = True
            node.decider._cache.clear()
            if every.reason == IN_FLIGHT_REASON:
                continue  # too many ways to decide each: the shortcut may answer
            assert v.fits == every.fits, f"seed {seed}, candidate {j}"
            both += 1
            shortcut += v.fits and bool(in_flight)
    assert both >= 150 and shortcut >= 50
