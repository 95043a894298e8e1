"""A new kind of resource is one provider in the registry: a toy kind, FPGA slots whose
request must come from one card (the plain device manager would split it across cards),
admitted through ``admit_pod`` under the aligning policies, rejected as the kubelet
rejects, reported, published on the node's status by the agent, decided afresh by the
scheduler extender when pods are in flight, and gone again once unregistered."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from agent_helpers import given
from numalign.topology import managers
from numalign.topology.admit import UNEXPECTED_REASON, admit_pod
from numalign.topology.demands import iterate_masks
from numalign.topology.hints import TopologyHint, mask_ids, mask_of
from numalign.topology.ledger import ContainerAllocation, Ledger
from numalign.topology.machine import Machine, machine_from_dict
from numalign.topology.managers.base import Admission, AllocationFailed, Ask
from numalign.topology.merge import REJECT_MESSAGE, REJECT_REASON
from numalign.topology.pod import Container, Pod, pod_from_dict

RES = "example.com/fpga-slot"
KIND = "fpga-slots"


def toy_machine() -> Machine:
    """Two NUMA nodes of 4 CPUs; card fpga0 (2 slots) on node 0, fpga1 (4 slots) on 1."""
    slots = [("fpga0", 0, 2), ("fpga1", 1, 4)]
    return machine_from_dict({
        "name": "toy-fpga",
        "numaNodes": [{"id": 0, "cpus": "0-3", "memory": "8Gi"},
                      {"id": 1, "cpus": "4-7", "memory": "8Gi"}],
        "devices": [{"resource": RES, "id": f"{card}-s{i}", "numaNode": node,
                     "groups": {"card": card}}
                    for card, node, n in slots for i in range(n)]})


class FpgaSlotsProvider:
    """Every container's slots from one card: hints are the masks holding a card with
    enough usable slots (preferred: as narrow as any card of the machine allows)."""

    name = KIND
    manager = "devices"
    allocation_order = 0
    claims = frozenset((RES,))
    room_by_counts = False  # slots of one card, not any free ones

    def __init__(self, admission: Admission) -> None:
        self.a = admission
        self.cards: dict[str, list[str]] = {}
        self.node: dict[str, int] = {}
        for d in admission.machine.devices_of(RES):
            card = d.group("card") or d.id
            self.cards.setdefault(card, []).append(d.id)
            self.node[card] = d.numa_node or 0
        self.placed: dict[str, str] = {}  # container -> card

    def _usable(self) -> set[str]:
        return set(self.a.free_of([RES])[RES])

    def _holding(self, n: int, usable: set[str]) -> Iterator[str]:
        for card, ids in sorted(self.cards.items()):
            if sum(1 for i in ids if i in usable) >= n:
                yield card

    def ask(self, unit: Sequence[Container]) -> Ask:
        n = self.a.unit_value(unit, lambda c: int(c.request(RES)))
        if not n:
            return Ask()
        everything = {i for ids in self.cards.values() for i in ids}
        narrowest = min((1 for _ in self._holding(n, everything)), default=0)
        fit = {self.node[c] for c in self._holding(n, self._usable())}
        hints = [TopologyHint(m, m.bit_count() == narrowest)
                 for m in iterate_masks(tuple(sorted(set(self.node.values()))))
                 if any(m >> nd & 1 for nd in fit)]
        return Ask(fixed={RES: hints})

    def hints(self, ask: Ask,
              lists: Sequence[list[TopologyHint]]) -> dict[str, list[TopologyHint] | None]:
        return dict(ask.fixed)

    def allocate(self, c: Container, hint: TopologyHint, alloc: ContainerAllocation) -> None:
        n = int(c.request(RES))
        if not n:
            return
        usable = self._usable()
        # as the device manager: inside the affinity first, then anywhere
        cards = sorted(self._holding(n, usable), key=lambda card: (
            hint.mask is not None and not hint.mask >> self.node[card] & 1, card))
        if not cards:
            raise AllocationFailed(f"no card holds {n} free {RES}")
        card = cards[0]
        alloc.devices[RES] = tuple(sorted(i for i in self.cards[card] if i in usable)[:n])
        self.placed[c.name] = card

    def report(self) -> dict[str, str]:
        return self.placed


def _fpga_kind(admission: Admission) -> FpgaSlotsProvider | None:
    asks = any(RES in c.requests for c in admission.pod.all_containers)
    return FpgaSlotsProvider(admission) if asks else None


@pytest.fixture
def fpga() -> Iterator[None]:
    managers.register(managers.Kind(KIND, 60, _fpga_kind))
    try:
        yield
    finally:
        managers.unregister(KIND)


def pod(name: str, slots: int, cpus: int = 2, containers: int = 1) -> Pod:
    spec: list[dict[str, Any]] = [
        {"name": f"c{i}", "resources": {"limits": {"cpu": str(cpus), "memory": "1Gi",
                                                    RES: str(slots)}}}
        for i in range(containers)]
    return pod_from_dict({"metadata": {"name": name, "uid": name},
                          "spec": {"containers": spec}})


def held(ledger: Ledger, devices: Sequence[str] = (), cpus: Sequence[int] = ()) -> Ledger:
    if devices or cpus:
        ledger.allocate("other", "c", ContainerAllocation(
            cpus=tuple(cpus), devices={RES: tuple(devices)} if devices else {}))
    return ledger


def numa_of(m: Machine, ids: Sequence[str]) -> set[int]:
    return {d.numa_node or 0 for d in m.devices_of(RES) if d.id in ids}


def test_the_registry_walks_a_registered_kind_in_hint_order(fpga: None) -> None:
    assert managers.names() == ["cpu", "memory", "devices", "gpu-groups", KIND]
    with pytest.raises(ValueError, match="already registered"):
        managers.register(managers.Kind(KIND, 60, _fpga_kind))
    with pytest.raises(ValueError, match="built in"):
        managers.unregister("devices")


@pytest.mark.parametrize("policy", ["single-numa-node", "restricted", "best-effort"])
def test_a_toy_kind_is_aligned_on_one_card_under_every_aligning_policy(
        fpga: None, policy: str) -> None:
    m = toy_machine()
    ledger = Ledger(m)
    r = admit_pod(m, ledger, pod("p", 3), policy)
    assert r.admit, r.message
    app = r.containers["c0"].allocation
    # 3 slots fit on fpga1 only: node 1, with the CPUs
    assert sorted(app.devices[RES]) == ["fpga1-s0", "fpga1-s1", "fpga1-s2"]
    assert {m.cpus[c].numa for c in app.cpus} == {1}
    assert r.hint == TopologyHint(mask_of([1]), True)
    assert r.reports[KIND] == {"c0": "fpga1"}
    assert r.gpus == {}
    # slots of one card are not counts per NUMA node: the extender decides afresh
    assert not r.room_by_counts
    # the hints stand in the device manager's map, labelled by their provider
    dec = r.decisions[0]
    assert dec.provider_names == ["cpu", "memory", "devices"]
    assert dec.sources[RES] == KIND
    # committed: the ledger holds the slots, the next pod takes the rest
    r2 = admit_pod(m, ledger, pod("q", 1), policy)
    assert r2.admit and r2.containers["c0"].allocation.devices[RES] == ("fpga0-s0",)
    assert r2.reports[KIND] == {"c0": "fpga0"}


def test_no_card_with_the_slots_is_the_kubelets_topology_affinity_error(fpga: None) -> None:
    m = toy_machine()
    # fpga1 keeps two free slots: 4 slots are free in all, but no card holds 3
    ledger = held(Ledger(m), ["fpga1-s0", "fpga1-s1"])
    before = ledger.requested()
    for policy in ("single-numa-node", "restricted"):
        r = admit_pod(m, ledger, pod("p", 3), policy)
        assert (r.admit, r.reason, r.message) == (False, REJECT_REASON, REJECT_MESSAGE)
        assert r.containers == {} and r.reports == {}
    assert ledger.requested() == before and "p" not in ledger.pods
    # best-effort admits whatever the hints say; the kind's Allocate then fails, as a
    # device plugin's would
    r = admit_pod(m, ledger, pod("p", 3), "best-effort")
    assert (r.admit, r.reason, r.failed) == (False, UNEXPECTED_REASON, ("c0", "devices"))
    assert r.message is not None and f"no card holds 3 free {RES}" in r.message
    assert "p" not in ledger.pods


def test_restricted_wants_the_preferred_hint_best_effort_takes_another(fpga: None) -> None:
    m = toy_machine()
    # node 1's CPUs are taken: the card that holds 3 slots is on the other node
    ledger = held(Ledger(m), cpus=[4, 5, 6, 7])
    r = admit_pod(m, ledger, pod("p", 3), "restricted")
    assert (r.admit, r.reason) == (False, REJECT_REASON)
    # best-effort takes the narrowest non-preferred hint (the CPUs' node); the slots
    # come from the card that holds them, outside it
    r = admit_pod(m, ledger, pod("p", 3), "best-effort", commit=False)
    assert r.admit and r.hint == TopologyHint(mask_of([0]), False)
    app = r.containers["c0"].allocation
    assert numa_of(m, app.devices[RES]) == {1} and {m.cpus[c].numa for c in app.cpus} == {0}


def test_each_container_gets_its_own_card_at_container_and_pod_scope(fpga: None) -> None:
    m = toy_machine()
    r = admit_pod(m, Ledger(m), pod("p", 2, cpus=1, containers=2), "single-numa-node")
    assert r.admit
    assert r.reports[KIND] == {"c0": "fpga0", "c1": "fpga1"}
    for name, node in (("c0", 0), ("c1", 1)):
        a = r.containers[name].allocation
        assert numa_of(m, a.devices[RES]) == {node} == {m.cpus[c].numa for c in a.cpus}
    # pod scope: 4 slots for the pod, only fpga1 holds them: one NUMA node for both
    r = admit_pod(m, Ledger(m), pod("p", 2, cpus=1, containers=2), "single-numa-node",
                  "pod")
    assert r.admit and mask_ids(r.hint.mask or 0) == [1]
    assert r.reports[KIND] == {"c0": "fpga1", "c1": "fpga1"}


def test_without_the_kind_the_device_manager_splits_the_request() -> None:
    m = toy_machine()
    assert KIND not in managers.names()
    # the plain device manager counts slots per NUMA node, not per card: with fpga1's
    # two free slots and fpga0's two, 3 slots are placed across both cards
    ledger = held(Ledger(m), ["fpga1-s0", "fpga1-s1"])
    r = admit_pod(m, ledger, pod("p", 3), "best-effort", commit=False)
    assert r.admit and KIND not in r.reports and r.room_by_counts
    got = r.containers["c0"].allocation.devices[RES]
    assert len(got) == 3 and numa_of(m, got) == {0, 1}


def test_the_kinds_allocation_reaches_the_nodes_status(fpga: None) -> None:
    """The agent's admission walks the same registry: the slots the kind placed are the
    container's devices on the wire record the node publishes."""
    from numalign.agent.publish import build_status
    from numalign.agent.state import NodeState
    from numalign.api.resolved import Resolved

    st = NodeState("n", toy_machine())
    res = {"cpu": "2", "memory": "1Gi", RES: "3"}
    d = st.decide({"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
                   "spec": {"containers": [{"name": "main", "resources": {
                       "requests": res, "limits": res}}]}},
                  given(Resolved("single-numa-node", "container", {}, "pod")))
    assert d.admit and d.allocation is not None
    assert d.allocation.numa_nodes == [1]
    assert d.allocation.containers["main"].devices == {
        RES: ["fpga1-s0", "fpga1-s1", "fpga1-s2"]}
    (entry,) = build_status(st)["admitted"]
    (main,) = entry["containers"]
    assert main["devices"] == {RES: ["fpga1-s0", "fpga1-s1", "fpga1-s2"]}


def test_the_extender_decides_afresh_a_kind_placed_by_more_than_counts(fpga: None) -> None:
    """Pods in flight leave as many free slots on the pod's NUMA node as it takes, but no
    card with them all: the scheduler extender does not keep the verdict it gave without
    them (a shortcut that counts devices per NUMA node), it decides with them held."""
    from numalign.agent.publish import build_status
    from numalign.agent.state import NodeState
    from numalign.api.names import ANN_RESOLVED
    from numalign.api.nodestatus import HeldPod
    from numalign.api.resolved import Resolved
    from numalign.extender.decide import Decider

    m = machine_from_dict({
        "name": "toy-fpga-2cards",
        "numaNodes": [{"id": 0, "cpus": "0-3", "memory": "8Gi"},
                      {"id": 1, "cpus": "4-7", "memory": "8Gi"}],
        "devices": [{"resource": RES, "id": f"{card}-s{i}", "numaNode": 1,
                     "groups": {"card": card}}
                    for card in ("fpga1", "fpga2") for i in range(3)]})
    st = NodeState("n0", m)
    decider = Decider()
    decider.update({"metadata": {"name": "n0", "resourceVersion": "1"}, "spec": {},
                    "status": build_status(st)})
    annotation = Resolved("single-numa-node", "container", source="pod").annotation()

    def k8s(name: str) -> dict[str, Any]:
        res = {"cpu": "1", "memory": "1Gi", RES: "2"}
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}",
                             "annotations": {ANN_RESOLVED: annotation}},
                "spec": {"containers": [{"name": "main", "image": "pause",
                                         "resources": {"limits": res}}]}}

    p = k8s("p")
    assert decider.decide(p, "n0").fits
    flying: list[tuple[dict[str, Any], HeldPod]] = []
    for name in ("f1", "f2"):  # two slots of fpga1, then two of fpga2
        f = k8s(name)
        held = decider.decide(f, "n0", in_flight=flying).held_by(f)
        assert held is not None
        flying.append((f, held))
    assert [sorted(i for _, a in h.containers for i in a.devices[RES])
            for _, h in flying] == [["fpga1-s0", "fpga1-s1"], ["fpga2-s0", "fpga2-s1"]]
    v = decider.decide(p, "n0", in_flight=flying)
    assert (v.fits, v.reason) == (False, REJECT_REASON)
