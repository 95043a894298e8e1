"""The scheduler extender and the node never disagree (a differential test).

For random fleets (the fixture machines and synthetic ones, with random allocations
already held) and random pod sequences (policies, scopes and options from the pod's
``numalign.io/resolved`` or the node's default, Guaranteed and Burstable pods, devices,
hugepages, GPU group requests), each pod is filtered by the extender's state
(:class:`numalign.extender.fleet.Fleet`, fed as the extender's watches feed it: the
NodeTopology each node last published, read back as JSON, and the pod events) over the
nodes the scheduler's own resource fit lets through. Every verdict is compared with what
that node decides when the pod is bound there:

- an **emulated** node: the agent's admission (``NodeState.decide`` under
  ``effective_policy``, as ``agent/emulate.py`` calls it);
- a **numalign-managed** node: the NRI placer (``EnginePlacer.create`` at the pod's first
  container), with the kubelet's reserved CPUs, publishing ``status.kubelet`` and the
  ``NRIPlacement`` condition as the real-node agent does. Its pods ask for no device
  resources: there the kubelet's device manager picks the devices before numalign sees
  the pod, which no NodeTopology can foretell.

The pod is then bound to the best-scored approved node (at times another approved one;
with none, at times a refused one, as with the extender down), often only after the next
pods are filtered (the scheduler filters the next pod before this one is bound: it is in
flight meanwhile), by the extender's bind verb or seen on its pod watch; the extender
then reserves what the node will give it, and sees its phase on the pod watch; nodes
publish at random moments (the agent's coalesced writes); pods are deleted at random.
A verdict is compared with what the node decides once the pods ahead of it are bound;
where a pod in flight could have landed, the extender may refuse what the node then
admits (it counted the pod there), never the other way round.

Fits, reason and message must be equal, and an admitted pod's reservation must hold what
the node allocated. One exception is by design, and checked in its own direction: when
the agent has released a deleted pod before the extender saw the deletion, until the
node publishes after it, the extender holds room the node has freed: it may refuse a pod
the node would admit (the pod waits), never the other way round.

The random pods include init containers and sidecars (an app container reusing their
CPUs) and policies whose ``maxAllowableNumaNodes`` is below a machine's NUMA node count
(the node refuses the pod). A failure names the seed (``NUMALIGN_DIFF_SEED=<seed>``
replays one sequence; ``NUMALIGN_DIFF_EXAMPLES`` sets how many sequences the main test
runs, 150 by default).
"""

from __future__ import annotations

import copy
import json
import os
import random
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import testdata
from numalign.agent.kubelet_config import KubeletConfig
from numalign.agent.kubelet_view import kubelet_settings
from numalign.agent.nri.placer import EnginePlacer, PodView
from numalign.agent.nri.plugin import Rejected
from numalign.agent.publish import build_status, nodetopology_object
from numalign.agent.state import NodeState, PlacedPod
from numalign.api.allocation import Allocation
from numalign.api.effective import NodeKind, NodePolicy, effective_policy
from numalign.api.names import ANN_RESOLVED, EVENT_INVALID_GPU, REJECT_REASON
from numalign.api.nodestatus import HeldPod
from numalign.api.nodetopology import NRI_REGISTERED
from numalign.extender.decide import CANDIDATE_UID, Verdict
from numalign.extender.fleet import Fleet
from numalign.extender.reservations import Reservations
from numalign.topology.admit import UNEXPECTED_REASON
from numalign.topology.machine import Machine, load_machine
from numalign.topology.pod import is_extended, pod_from_dict
from numalign.topology.resourcefit import allocatable, check_fit, fit_requests
from random_fleet import FULL, Mix, fixture_machine, random_pod, random_spec, synthetic_machine

JSON = dict[str, Any]


@dataclass
class Outcome:
    admit: bool
    reason: str | None
    message: str | None
    allocation: Allocation | None = None


def scheduler_fits(machine: Machine, pod: JSON, requests: list[dict[str, int]]) -> bool:
    """The scheduler's NodeResourcesFit: only nodes it lets through reach the extender.
    As the kubelet's fit check (:func:`check_fit`), except that an extended resource the
    node lacks does not fit."""
    model = pod_from_dict(pod)
    have = allocatable(machine)
    for res, q in model.effective_requests().items():
        if is_extended(res) and q > 0 and res not in have:
            return False
    return check_fit(machine, model, requests) is None


class Node:
    """One node: what it decides, and the NodeTopology it publishes."""

    kind = NodeKind.EMULATED

    def __init__(self, name: str, machine: Machine, spec: JSON) -> None:
        self.name = name
        self.machine = machine
        self.spec = spec
        self.state = NodeState(name, machine)
        self.state.set_spec(spec)
        self.rv = 0

    def published(self) -> JSON:
        """Its NodeTopology, as a client reads it back from the API server."""
        self.rv += 1
        nt = nodetopology_object(self.name)
        nt["metadata"]["resourceVersion"] = str(self.rv)
        nt["spec"] = dict(self.spec)
        nt["status"] = build_status(self._status_state())
        return dict(json.loads(json.dumps(nt)))

    def _status_state(self) -> NodeState:
        return self.state

    def requests(self) -> list[dict[str, int]]:
        return self.state.ledger.pod_requests()

    def bind(self, pod: JSON) -> Outcome:
        """The pod is bound here: the node decides it (and keeps it when admitted)."""
        eff = effective_policy(pod, NodePolicy(NodeKind.EMULATED, self.state.default))
        try:
            d = self.state.decide(pod, eff)
        except Exception as e:  # as agent/emulate.py: a pod the engine cannot decide
            self.state.decided[str(pod["metadata"]["uid"])] = False
            return Outcome(False, UNEXPECTED_REASON, str(e))
        return Outcome(d.admit, d.reason, d.message, d.allocation)

    def trial(self, pod: JSON) -> Outcome:
        """What the node would decide if the pod were bound here now (nothing kept)."""
        return copy.deepcopy(self).bind(pod)

    def delete(self, uid: str) -> None:
        self.state.release(uid)

    def admitted(self) -> list[str]:
        return sorted(self.state.admitted)


class ManagedNode(Node):
    """A numalign-managed real node: the NRI placer decides, the agent publishes the
    placer's allocations with the kubelet's settings (managers none, reserved CPUs)."""

    kind = NodeKind.NUMALIGN_MANAGED

    def __init__(self, name: str, machine: Machine, spec: JSON, reserved: tuple[int, ...]
                 ) -> None:
        super().__init__(name, machine, spec)
        self.views: dict[str, PodView] = {}
        self.placer = EnginePlacer(machine, self.views.get, reserved_cpus=reserved)
        self.state.kubelet = kubelet_settings(KubeletConfig(reserved_system_cpus=reserved),
                                              None)
        self.state.placement = (True, NRI_REGISTERED, "numalign places this node's pods")

    def _status_state(self) -> NodeState:
        self.state.admitted = {
            uid: PlacedPod(str(v.pod["metadata"]["namespace"]),
                             str(v.pod["metadata"]["name"]), uid, v.policy.resolved,
                             self.placer.allocations[uid])
            for uid, v in self.views.items() if uid in self.placer.allocations}
        return self.state

    def requests(self) -> list[dict[str, int]]:
        return [r for uid, r in ((u, p.requests) for u, p in self.placer.ledger.pods.items())
                if uid in self.placer.allocations]

    def bind(self, pod: JSON) -> Outcome:
        uid = str(pod["metadata"]["uid"])
        eff = effective_policy(pod, NodePolicy(NodeKind.NUMALIGN_MANAGED, self.state.default))
        self.views[uid] = PodView(pod, eff)
        self.placer.lookup = self.views.get  # this node's (a trial's copy has its own)
        first = pod["spec"]["containers"][0]
        try:
            self.placer.create(SimpleNamespace(uid=uid),
                               SimpleNamespace(name=first["name"], id=f"{uid}-0"))
        except Rejected as e:
            reason, _, message = str(e).partition(": ")
            return Outcome(False, reason, message)
        return Outcome(True, None, None, self.placer.allocations[uid])

    def delete(self, uid: str) -> None:
        if uid in self.placer.allocations:
            self.placer.released(SimpleNamespace(uid=uid), None)
        self.views.pop(uid, None)

    def admitted(self) -> list[str]:
        return sorted(self.placer.allocations)


@dataclass
class Counts:
    sequences: int = 0
    verdicts: int = 0
    refused: int = 0
    binds: int = 0
    stale: int = 0
    crowded: int = 0  # refusals where a pod in flight could have landed first
    managed: int = 0  # verdicts on numalign-managed nodes
    by_reason: dict[str, int] = field(default_factory=dict)




@dataclass
class Flight:
    """A pod filtered at ``step``, the node the scheduler picked (None: none), bound once
    the pods ahead of it are, at step ``due``: by the bind verb or seen on the pod watch.
    ``crowded``: the candidates where a pod in flight could land first."""

    step: int
    pod: JSON
    candidates: list[Node]
    verdicts: list[Verdict]
    crowded: set[str]
    chosen: Node | None
    due: int
    by_bind_verb: bool


def make_fleet(rng: random.Random, mix: Mix) -> list[Node]:
    fleet: list[Node] = []
    for i in range(rng.randint(2, 5)):
        machine = fixture_machine(rng) if rng.random() < 0.6 else synthetic_machine(rng, i)
        spec = random_spec(rng, i + 1, mix)
        if rng.random() < 0.3:
            cpus = sorted(machine.cpus)
            reserved = tuple(cpus[:rng.choice((0, 1, 2))]) if len(cpus) > 4 else ()
            fleet.append(ManagedNode(f"n{i}", machine, spec, reserved))
        else:
            fleet.append(Node(f"n{i}", machine, spec))
    return fleet


def _same(v: Verdict, o: Outcome, uid: str = CANDIDATE_UID) -> bool:
    """The same answer; a message naming the pod names it by ``uid`` on the node and by
    the placeholder the extender decides a pod's shape under."""
    if v.fits != o.admit:
        return False
    return v.fits or (v.reason, (v.message or "").replace(CANDIDATE_UID, uid)) == (
        o.reason, o.message)


def _held_equals(held: HeldPod, alloc: Allocation) -> bool:
    """The extender's reservation holds what the node allocated: the same CPUs, memory
    and hugepages per NUMA node, devices (per pod: a CPU an app container reuses from
    its init container may be listed under either)."""
    cpus: set[int] = set()
    memory: dict[tuple[str, int], int] = {}
    devices: set[tuple[str, str]] = set()
    for _, a in held.containers:
        cpus.update(a.cpus)
        for kind, per in a.memory.items():
            for zone, b in per.items():
                memory[(kind, zone)] = memory.get((kind, zone), 0) + b
        devices.update((r, i) for r, ids in a.devices.items() for i in ids)
    node_memory: dict[tuple[str, int], int] = {}
    for c in alloc.containers.values():
        per_kind = {"memory": c.memory, **{f"hugepages-{k}": v for k, v in c.hugepages.items()}}
        for kind, per_zone in per_kind.items():
            for z, b in per_zone.items():
                node_memory[(kind, int(z))] = node_memory.get((kind, int(z)), 0) + b
    return (cpus, {k: v for k, v in memory.items() if v}, devices) == (
        set(alloc.cpus), {k: v for k, v in node_memory.items() if v},
        {(r, i) for r, ids in alloc.devices.items() for i in ids})


def run_sequence(seed: int, counts: Counts | None = None, mix: Mix = FULL) -> Counts:
    counts = counts if counts is not None else Counts()
    rng = random.Random(seed)
    fleet = make_fleet(rng, mix)
    devices = sorted({d.resource for n in fleet for d in n.machine.devices})
    levels = sorted({lvl for n in fleet for d in n.machine.devices for lvl, _ in d.groups})
    extender = Fleet(reservations=Reservations(timeout=1e9))
    pods: dict[str, JSON] = {}  # uid -> the pod as bound
    unseen: list[JSON] = []  # deleted pods whose DELETED event the extender has not seen
    # Nodes where a pod was released before the extender saw it go, until they publish
    # after the extender saw it: meanwhile the extender holds room the node has freed
    # (the pod's own, and what it reserves may name other CPUs than the node gives).
    lagging: set[str] = set()
    index = 0

    def where(step: int, node: Node, pod: JSON) -> str:
        return (f"seed {seed} (NUMALIGN_DIFF_SEED={seed}), step {step}, node {node.name} "
                f"({node.kind}, machine {node.machine.name}), pod "
                f"{json.dumps(pod, sort_keys=True)}")

    def publish(node: Node) -> None:
        extender.node_topology("MODIFIED", node.published())
        if not any(p["spec"]["nodeName"] == node.name for p in unseen):
            lagging.discard(node.name)

    def delete(node: Node, uid: str) -> None:
        node.delete(uid)
        pod = pods.pop(uid)
        if rng.random() < 0.7:
            extender.pod("DELETED", pod)
        else:  # the agent released it at its deletionTimestamp; the event comes later
            unseen.append(pod)
            lagging.add(node.name)

    # What the nodes hold already, published; the extender sees those pods bound.
    for node in fleet:
        managed = isinstance(node, ManagedNode)
        for _ in range(rng.randint(0, 12)):
            index += 1
            pod = bound_to(random_pod(rng, index, devices, levels, managed, mix), node.name)
            if scheduler_fits(node.machine, pod, node.requests()) and node.bind(pod).admit:
                pods[str(pod["metadata"]["uid"])] = pod
        for uid in node.admitted():
            if rng.random() < 0.25:
                node.delete(uid)
                del pods[uid]
        publish(node)
    extender.load_pods(dict(p, status={"phase": "Running"}) for p in pods.values())

    # Pods in flight: filtered, a node picked, not bound yet (the scheduler filters the
    # next pod before this one's binding reaches the extender), bound in order.
    flying: list[Flight] = []

    def land(f: Flight) -> None:
        """The pods ahead of ``f`` are bound: the nodes now decide ``f``'s pod as its
        verdicts said (where a pod in flight could have landed, the extender may refuse
        what the node admits: never the other way round), then it is bound."""
        pod, uid = f.pod, str(f.pod["metadata"]["uid"])
        for node, verdict in zip(f.candidates, f.verdicts, strict=True):
            truth = node.trial(pod)
            counts.verdicts += 1
            counts.managed += node.kind == NodeKind.NUMALIGN_MANAGED
            assert verdict.covered, f"{where(f.step, node, pod)}: not covered: {verdict.note}"
            if node.name in lagging or (node.name in f.crowded and not verdict.fits):
                counts.stale += node.name in lagging
                counts.crowded += node.name not in lagging
                assert not verdict.fits or truth.admit, (
                    f"{where(f.step, node, pod)}: the extender approves, the node rejects: "
                    f"{truth.reason}: {truth.message}")
                continue
            assert _same(verdict, truth, uid), (
                f"{where(f.step, node, pod)}: the extender says "
                f"{json.dumps(verdict.to_json())}, the node decides admit={truth.admit} "
                f"{truth.reason}: {truth.message}")
            if not truth.admit:
                counts.refused += 1
                counts.by_reason[str(truth.reason)] = counts.by_reason.get(
                    str(truth.reason), 0) + 1
        if f.chosen is None:
            return
        chosen = f.chosen
        pod = bound_to(pod, chosen.name)
        # the bind verb (the scheduler asks the extender to bind it), or the binding seen
        # on the pod watch (the scheduler bound it itself)
        approved = any(v.fits and n is chosen for n, v in zip(f.candidates, f.verdicts,
                                                                strict=True))
        if f.by_bind_verb:
            claimed = extender.claim(uid, chosen.name)
            assert (claimed is not None) == approved, where(f.step, chosen, pod)
        if not f.by_bind_verb or not approved:
            extender.pod("MODIFIED", pod)
        reserved = extender.reservations.get(uid)
        got = chosen.bind(pod)
        counts.binds += 1
        if got.admit and chosen.name not in lagging:
            assert reserved is not None and got.allocation is not None, (
                f"{where(f.step, chosen, pod)}: admitted, not reserved")
            assert _held_equals(reserved.held, got.allocation), (
                f"{where(f.step, chosen, pod)}: the extender reserves {reserved.held}, "
                f"the node allocated {got.allocation}")
        phase = "Running" if got.admit else "Failed"
        if got.admit:
            pods[uid] = pod
        extender.pod("MODIFIED", {**pod, "status": {"phase": phase, "reason": got.reason}})

    for step in range(rng.randint(6, 16)):
        index += 1
        managed_only = any(isinstance(n, ManagedNode) for n in fleet) and rng.random() < 0.4
        pod = random_pod(rng, index, devices, levels, managed_only, mix)
        uid = str(pod["metadata"]["uid"])
        # the scheduler's own fit counts the pods it has picked a node for
        picked = {n.name: [fit_requests(pod_from_dict(f.pod)) for f in flying
                           if f.chosen is n] for n in fleet}
        candidates = [n for n in fleet
                      if scheduler_fits(n.machine, pod, n.requests() + picked[n.name])
                      and (not isinstance(n, ManagedNode) or managed_only
                           or not _asks_devices(pod))]
        crowded = {n.name for n in candidates if extender.in_flight.on_node(n.name)}
        verdicts = extender.filter(pod, [n.name for n in candidates])
        # The scheduler binds to an approved node (the best scored, at times another);
        # with none, at times to a refused one anyway (as with the extender down).
        approved = [(v.score, i) for i, v in enumerate(verdicts) if v.fits]
        chosen: Node | None = None
        if approved:
            pick = max(approved) if rng.random() < 0.8 else rng.choice(approved)
            chosen = candidates[pick[1]]
        elif candidates and rng.random() < 0.3:
            chosen = rng.choice(candidates)
        lag = 0 if rng.random() < 0.5 else rng.choice((1, 2))
        if chosen is not None and not approved:
            lag = 0  # the extender is down: nothing is in flight, bound at once
            for f in flying:
                f.due = step
        flying.append(Flight(step, pod, candidates, verdicts, crowded, chosen,
                             step + lag, rng.random() < 0.5))
        while flying and flying[0].due <= step:
            land(flying.pop(0))
        # Deletions (while nothing is in flight: the nodes then decide the pods in
        # flight as the extender saw them), late events and publications at random.
        for node in fleet:
            if not flying and rng.random() < 0.1 and node.admitted():
                delete(node, rng.choice(node.admitted()))
            if rng.random() < 0.35:
                publish(node)
        for pod in list(unseen):
            if rng.random() < 0.5:
                unseen.remove(pod)
                extender.pod("DELETED", pod)
    while flying:
        land(flying.pop(0))
    counts.sequences += 1
    return counts


def bound_to(pod: JSON, node: str) -> JSON:
    return {**pod, "spec": {**pod["spec"], "nodeName": node}}


def _asks_devices(pod: JSON) -> bool:
    return any(is_extended(r) for r in pod_from_dict(pod).effective_requests())


INVALID_GPU_REASON = EVENT_INVALID_GPU
SEEDS = int(os.environ.get("NUMALIGN_DIFF_EXAMPLES", "150"))
@pytest.mark.skipif("NUMALIGN_DIFF_SEED" in os.environ, reason="replaying one seed")
@settings(max_examples=SEEDS, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_extender_and_node_never_disagree(seed: int) -> None:
    run_sequence(seed, mix=FULL)


@pytest.mark.skipif("NUMALIGN_DIFF_SEED" not in os.environ,
                    reason="NUMALIGN_DIFF_SEED=<seed> replays one")
def test_replay_one_seed() -> None:
    run_sequence(int(os.environ["NUMALIGN_DIFF_SEED"]), mix=FULL)


def test_the_sequences_exercise_both_answers() -> None:
    """The random sequences reach refusals of each kind and numalign-managed nodes, not
    only admissions (so the differential test compares verdicts that matter)."""
    counts = Counts()
    for seed in range(40):
        run_sequence(seed, counts, FULL)
    assert counts.by_reason.get(REJECT_REASON, 0) > 20, counts
    assert counts.by_reason.get(INVALID_GPU_REASON, 0) > 0, counts
    assert counts.verdicts > 400 and counts.binds > 200 and counts.managed > 50, counts


def _pod(name: str, cpu: str, init_cpu: str | None = None, options: JSON | None = None
         ) -> JSON:
    res = {"cpu": cpu, "memory": "1Gi"}
    spec: JSON = {"containers": [{"name": "c", "resources": {"requests": res,
                                                              "limits": res}}]}
    if init_cpu is not None:
        init = {"cpu": init_cpu, "memory": "64Mi"}
        spec["initContainers"] = [{"name": "init", "resources": {"requests": init,
                                                                 "limits": init}}]
    ann = {}
    if options is not None:
        ann[ANN_RESOLVED] = json.dumps({"policy": "single-numa-node", "scope": "pod",
                                        "options": options, "source": "pod"})
    return {"metadata": {"name": name, "namespace": "a", "uid": f"uid-{name}",
                         "annotations": ann}, "spec": spec}


def _burst(machine: str, pods: list[JSON], spec: JSON) -> list[tuple[Verdict, Outcome]]:
    """Filter and bind ``pods`` one after the other on one node that publishes only at
    the start: (the extender's verdict, the node's decision) for each."""
    node = Node("n0", load_machine(testdata.MACHINES / f"{machine}.yaml"), spec)
    extender = Fleet()
    extender.load_nodetopologies([node.published()])
    out = []
    for pod in pods:
        (v,) = extender.filter(pod, ["n0"])
        extender.pod("MODIFIED", bound_to(pod, "n0"))
        out.append((v, node.bind(pod)))
    return out


SNN_POD = {"policy": "single-numa-node", "scope": "pod"}


def test_reservation_holds_a_burst_off_one_numa_node() -> None:
    """Three single-numa-node pods that each fill one NUMA node of seed-figure1, bound
    one after the other before the node publishes: the first two are approved on
    different NUMA nodes, the third refused, as the node decides them."""
    got = _burst("seed-figure1", [_pod(f"p{i}", "4") for i in range(3)], SNN_POD)
    assert all(_same(v, o) for v, o in got), got
    assert [v.fits for v, _ in got] == [True, True, False]
    assert got[2][0].reason == REJECT_REASON
    assert sorted({n for v, _ in got[:2] for n in v.numa_nodes}) == [0, 1]


def test_burst_of_pods_with_init_containers() -> None:
    """An app container reusing its init container's CPUs: the reservation holds what
    the node keeps (each CPU once), so the burst spreads over the NUMA nodes as the node
    decides it."""
    got = _burst("seed-figure1", [_pod(f"p{i}", "4", init_cpu="2") for i in range(3)],
                 SNN_POD)
    assert all(_same(v, o) for v, o in got), got
    assert [v.fits for v, _ in got] == [True, True, False]
    assert sorted({n for v, _ in got[:2] for n in v.numa_nodes}) == [0, 1]


def test_max_allowable_below_the_machines_numa_nodes() -> None:
    """The node refuses a policy whose maxAllowableNumaNodes is below its NUMA node
    count; the extender refuses it with the same reason and message."""
    ((v, o),) = _burst("wide64", [_pod("p0", "2", options={"maxAllowableNumaNodes": 8})],
                       {})
    assert not o.admit
    assert v.covered and _same(v, o), (v, o)

