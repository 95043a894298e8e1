"""The extender's view of the cluster (numalign.extender.fleet): reservations from the pod
watch, dropped when the node publishes the pod, when it goes away, or on timeout; rebuilt
after a restart; a pod gone is room at once."""

from __future__ import annotations

from typing import Any

from test_extender_decide import node, pod, published, resolved_of

from agent_helpers import given
from numalign.agent.state import NodeState
from numalign.extender.fleet import Fleet
from numalign.extender.reservations import Reservations


def bound(p: dict[str, Any], node_name: str, phase: str = "Pending") -> dict[str, Any]:
    return {**p, "spec": {**p["spec"], "nodeName": node_name}, "status": {"phase": phase}}


def four(name: str) -> dict[str, Any]:
    return pod(name, {"cpu": "4", "memory": "1Gi"})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fleet_of(st: NodeState, clock: Clock | None = None) -> Fleet:
    fleet = Fleet(reservations=Reservations(60.0, clock or Clock()))
    fleet.load_nodetopologies([published(st, 1)])
    fleet.load_pods([])
    return fleet


def test_a_burst_is_held_until_the_node_publishes() -> None:
    st = node("fragmented-8numa")
    fleet = fleet_of(st)
    pods = [four(f"p{i}") for i in range(9)]
    for p in pods[:8]:  # each filtered, then seen bound before the node publishes
        assert fleet.filter(p, [st.name])[0].fits
        fleet.pod("MODIFIED", bound(p, st.name))
    assert len(fleet.reservations) == 8
    v = fleet.filter(pods[8], [st.name])[0]
    assert not v.fits and v.reason == "TopologyAffinityError"
    # the node admits the eight and publishes: the reservations give way to its list
    for p in pods[:8]:
        assert st.decide(p, given(resolved_of(p))).admit
    fleet.node_topology("MODIFIED", published(st, 2))
    assert len(fleet.reservations) == 0
    assert not fleet.filter(pods[8], [st.name])[0].fits
    # an update of a bound pod does not reserve it again
    fleet.pod("MODIFIED", bound(pods[0], st.name, "Running"))
    assert len(fleet.reservations) == 0


def test_a_pod_gone_frees_its_room_before_the_node_publishes() -> None:
    st = node("fragmented-8numa")
    pods = [four(f"p{i}") for i in range(8)]
    for p in pods:
        assert st.decide(p, given(resolved_of(p))).admit
    fleet = fleet_of(st)
    late = four("late")
    assert not fleet.filter(late, [st.name])[0].fits
    fleet.pod("DELETED", bound(pods[3], st.name, "Running"))
    assert fleet.filter(late, [st.name])[0].fits
    # the node publishes the release: nothing changes
    st.release("uid-p3")
    fleet.node_topology("MODIFIED", published(st, 2))
    assert fleet.filter(late, [st.name])[0].fits
    # a finished pod too
    fleet.pod("MODIFIED", bound(pods[5], st.name, "Succeeded"))
    assert fleet.decider.view(st.name) is not None
    assert len(fleet.decider.view(st.name).held) == 6  # type: ignore[union-attr]


def test_reservations_end_with_the_pod_or_the_timeout() -> None:
    st = node("dual-16core")
    clock = Clock()
    fleet = fleet_of(st, clock)
    a, b = four("a"), four("b")
    fleet.pod("ADDED", bound(a, st.name))
    fleet.pod("ADDED", bound(b, st.name))
    assert len(fleet.reservations) == 2
    fleet.pod("DELETED", bound(a, st.name))
    assert len(fleet.reservations) == 1 and "uid-b" in fleet.reservations
    clock.now += 61
    assert [r.uid for r in fleet.expire()] == ["uid-b"]
    assert len(fleet.reservations) == 0
    # a node without NodeTopology: nothing to hold
    fleet.pod("ADDED", bound(four("c"), "elsewhere"))
    assert len(fleet.reservations) == 0


def test_restart_rebuilds_reservations_from_bound_unpublished_pods() -> None:
    st = node("fragmented-8numa")
    admitted = [four(f"old{i}") for i in range(3)]
    for p in admitted:
        assert st.decide(p, given(resolved_of(p))).admit
    fleet = Fleet()
    fleet.load_nodetopologies([published(st, 7)])
    waiting = [four(f"new{i}") for i in range(3)]
    fleet.load_pods([*(bound(p, st.name, "Running") for p in admitted),
                     *(bound(p, st.name) for p in waiting[:2]),
                     bound(waiting[2], st.name, "Running"),  # its node has not published it
                     bound(four("gone"), st.name, "Failed")])
    assert sorted(r.uid for r in (fleet.reservations.get(f"uid-new{i}") for i in range(3))
                  if r is not None) == ["uid-new0", "uid-new1", "uid-new2"]
    assert len(fleet.reservations) == 3
    # 3 admitted + 3 reserved of 8 NUMA nodes: two more fit, not three
    fits = 0
    for i in range(3):
        p = four(f"more{i}")
        if fleet.filter(p, [st.name])[0].fits:
            fleet.pod("ADDED", bound(p, st.name))
            fits += 1
    assert fits == 2
    # a relisting without a pod forgets it
    fleet.load_pods([bound(p, st.name) for p in waiting[:2]])
    assert "uid-new2" not in fleet.reservations


def test_node_topology_deleted_forgets_the_node() -> None:
    st = node("dual-16core")
    fleet = fleet_of(st)
    fleet.pod("ADDED", bound(four("a"), st.name))
    fleet.node_topology("DELETED", {"metadata": {"name": st.name}})
    assert len(fleet.reservations) == 0
    v = fleet.filter(four("b"), [st.name])[0]
    assert v.fits and not v.covered


def test_pods_approved_but_not_bound_yet_are_counted_where_they_may_go() -> None:
    """The scheduler filters the next pod before the previous one's binding is seen:
    the previous one counts on every node it was approved for, until it is bound (then
    only there), goes away, or its time runs out."""
    clock = Clock()
    one, two = node("dual-16core", "one"), node("dual-16core", "two")
    fleet = Fleet(reservations=Reservations(60.0, clock))
    fleet.load_nodetopologies([published(one, 1), published(two, 1)])
    fleet.load_pods([])
    six = [pod(f"s{i}", {"cpu": "6", "memory": "1Gi"}) for i in range(10)]
    for p in six[:7]:  # 2 per NUMA node, 8 in all: seven bound, one slot left (on two)
        v = {x.node: x for x in fleet.filter(p, ["one", "two"])}
        target = "one" if v["one"].fits else "two"
        fleet.pod("ADDED", bound(p, target))
    assert len(fleet.reservations) == 7 and len(fleet.in_flight) == 0
    first = fleet.filter(six[7], ["one", "two"])
    assert [v.fits for v in first] == [False, True]
    # not bound yet: the next pod finds no room
    second = fleet.filter(six[8], ["one", "two"])
    assert [v.fits for v in second] == [False, False]
    # its binding seen: what filter approved becomes the reservation
    fleet.pod("ADDED", bound(six[7], "two"))
    assert len(fleet.in_flight) == 0 and len(fleet.reservations) == 8
    assert [v.fits for v in fleet.filter(six[9], ["one", "two"])] == [False, False]
    # an approval that never binds runs out
    fleet.pod("DELETED", bound(six[7], "two"))
    assert fleet.filter(six[8], ["one", "two"])[1].fits
    assert not fleet.filter(six[9], ["one", "two"])[1].fits
    clock.now += 6
    fleet.expire()
    assert fleet.filter(six[9], ["one", "two"])[1].fits


def test_a_pod_whose_bind_verb_names_a_node_counts_in_flight_there_alone() -> None:
    """Approved on two nodes, a pod whose bind verb names one of them (its binding not
    landed yet) takes the last room there only: the other node admits the next pod."""
    one, two = node("dual-16core", "one"), node("dual-16core", "two")
    fleet = Fleet(reservations=Reservations(60.0, Clock()))
    fleet.load_nodetopologies([published(one, 1), published(two, 1)])
    fleet.load_pods([])
    six = [pod(f"s{i}", {"cpu": "6", "memory": "1Gi"}) for i in range(9)]
    for i, p in enumerate(six[:6]):  # three on each node: one slot left on each
        target = ("one", "two")[i % 2]
        assert {x.node: x.fits for x in fleet.filter(p, ["one", "two"])}[target]
        fleet.pod("ADDED", bound(p, target))
    assert [v.fits for v in fleet.filter(six[6], ["one", "two"])] == [True, True]
    fleet.filter(six[6], ["one", "two"], approve=False)  # prioritize: holds decided
    # in flight on both: the next pod fits on neither
    assert [v.fits for v in fleet.filter(six[7], ["one", "two"])] == [False, False]
    uid = six[6]["metadata"]["uid"]
    fleet.in_flight.heading(uid, "two")  # the bind verb names "two"
    assert fleet.approved(uid, "two") is not None
    assert [v.fits for v in fleet.filter(six[8], ["one", "two"])] == [True, False]
    assert fleet.in_flight.before(six[8]["metadata"]["uid"], "one") == []


def test_a_node_listing_a_pod_by_name_ends_its_reservation() -> None:
    """A real node's kubelet may list a pod the agent names without its uid."""
    st = node("dual-16core")
    fleet = fleet_of(st)
    a = four("a")
    fleet.pod("ADDED", bound(a, st.name))
    assert len(fleet.reservations) == 1
    assert st.decide(a, given(resolved_of(a))).admit
    nt = published(st, 2)
    for entry in nt["status"]["admitted"]:
        entry.pop("uid")
    fleet.node_topology("MODIFIED", nt)
    assert len(fleet.reservations) == 0
    view = fleet.decider.view(st.name)
    assert view is not None and "default/a" in view.admitted
    # and its room is not counted twice
    assert len(view.ledger().pods) == 1


def test_prioritize_reuses_the_filters_verdicts_until_something_changes() -> None:
    """Prioritize right after the pod's filter answers from that filter's verdicts (no
    engine run); after a watch event it decides again, and equals what it would give."""
    st = node("fragmented-8numa")
    fleet = fleet_of(st)
    first, second = four("first"), four("second")
    filtered = fleet.filter(first, [st.name])
    runs = fleet.decider.hits + fleet.decider.misses
    assert fleet.filter(first, [st.name], approve=False) == filtered
    assert fleet.decider.hits + fleet.decider.misses == runs
    assert st.decide(second, given(resolved_of(second))).admit  # the node takes NUMA node 0
    fleet.node_topology("MODIFIED", published(st, 2))  # a change: decided again
    again = fleet.filter(first, [st.name], approve=False)
    assert fleet.decider.hits + fleet.decider.misses > runs
    assert again == Fleet(reservations=fleet.reservations, in_flight=fleet.in_flight,
                          decider=fleet.decider).filter(first, [st.name], approve=False)
    assert again[0].fits and again[0].numa_nodes != filtered[0].numa_nodes


def test_prioritize_decides_again_only_the_nodes_changed_since_the_filter() -> None:
    """Watch events between a pod's filter and its prioritize (a big fleet has them all
    the time) make prioritize decide again only on the nodes they changed: a pod not
    bound yet changes none, a node's NodeTopology that node."""
    one, two = node("fragmented-8numa", "one"), node("fragmented-8numa", "two")
    fleet = Fleet(reservations=Reservations(60.0, Clock()))
    fleet.load_nodetopologies([published(one, 1), published(two, 1)])
    fleet.load_pods([])
    first, second = four("first"), four("second")
    filtered = fleet.filter(first, ["one", "two"], approve=False)  # complete verdicts
    fleet.filter(first, ["one", "two"])
    fleet.pod("ADDED", four("waiting"))  # not bound: changes nothing
    assert two.decide(second, given(resolved_of(second))).admit
    fleet.node_topology("MODIFIED", published(two, 2))
    asked = fleet.decider.hits + fleet.decider.misses
    again = fleet.filter(first, ["one", "two"], approve=False)
    assert fleet.decider.hits + fleet.decider.misses == asked + 1  # "two" only
    assert again[0] == filtered[0]
    assert again[1].fits and again[1].numa_nodes != filtered[1].numa_nodes
    fresh = Fleet(reservations=fleet.reservations, in_flight=fleet.in_flight,
                  decider=fleet.decider).filter(first, ["one", "two"], approve=False)
    assert again == fresh
