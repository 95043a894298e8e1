"""The allocation ledger: allocate, release, free views, persistence, invariants."""

from __future__ import annotations

import json

import pytest

import testdata
from numalign.topology.ledger import ContainerAllocation, Ledger, LedgerError
from numalign.topology.machine import Machine, load_machine, machine_from_dict

MACHINES = testdata.MACHINES
MI = 2**20


def _machine() -> Machine:
    return machine_from_dict({
        "name": "two",
        "numaNodes": [{"id": 0, "cpus": "0-3", "memory": "1Gi", "hugepages": {"2Mi": "64Mi"}},
                      {"id": 1, "cpus": "4-7", "memory": "1Gi"}],
        "devices": [{"resource": "x.com/gpu", "id": "g0", "numaNode": 0},
                    {"resource": "x.com/gpu", "id": "g1", "numaNode": 1}],
    })


def test_allocate_release_and_free_view() -> None:
    led = Ledger(_machine())
    a = ContainerAllocation(cpus=(0, 1), memory={"memory": {0: 100 * MI}}, memory_mask=1,
                            devices={"x.com/gpu": ("g0",)})
    led.allocate("u1", "c", a, pod_name="p1")
    free = led.free_view()
    assert free["0"]["cpus"] == [2, 3]
    assert free["0"]["memory"] == 924 * MI
    assert free["0"]["hugepages-2Mi"] == 64 * MI
    assert free["0"]["devices"] == {"x.com/gpu": []}
    assert free["1"]["devices"] == {"x.com/gpu": ["g1"]}
    assert led.assignments == {0: 1} and led.cells == {0: 1}
    assert led.release("u1")
    assert not led.release("u1")
    assert led.free_view()["0"]["cpus"] == [0, 1, 2, 3]
    assert led.assignments == {}


def test_double_allocation_is_refused_and_nothing_changes() -> None:
    led = Ledger(_machine())
    led.allocate("u1", "c", ContainerAllocation(cpus=(0, 1)))
    before = json.dumps(led.to_json(), sort_keys=True)
    with pytest.raises(LedgerError, match="cpu 1 is already held by u1/c"):
        led.allocate("u2", "c", ContainerAllocation(cpus=(2, 1)))
    led.allocate("u2", "d", ContainerAllocation(devices={"x.com/gpu": ("g1",)}))
    with pytest.raises(LedgerError, match=r"device g1 of x\.com/gpu is already held"):
        led.allocate("u3", "c", ContainerAllocation(cpus=(5,), devices={"x.com/gpu": ("g1",)}))
    assert 5 in led.free_cpus()
    with pytest.raises(LedgerError, match="bytes short"):
        led.allocate("u3", "c", ContainerAllocation(memory={"memory": {1: 2 * 1024 * MI}}))
    with pytest.raises(LedgerError, match="not on this machine"):
        led.allocate("u3", "c", ContainerAllocation(cpus=(99,)))
    with pytest.raises(LedgerError, match="already holds"):
        led.allocate("u1", "c", ContainerAllocation(cpus=(6,)))
    # a batch is all or nothing
    with pytest.raises(LedgerError):
        led.allocate_many("u4", [("a", ContainerAllocation(cpus=(6,))),
                                 ("b", ContainerAllocation(cpus=(6,)))])
    assert 6 in led.free_cpus() and "u4" not in led.pods
    assert json.loads(before)["pods"][0]["uid"] == "u1"


def test_init_container_cpus_are_handed_over_within_the_pod() -> None:
    led = Ledger(_machine())
    led.allocate("u1", "init", ContainerAllocation(cpus=(0, 1), reusable=True))
    assert led.reusable_cpus("u1") == {0, 1}
    with pytest.raises(LedgerError):  # another pod may not take them
        led.allocate("u2", "c", ContainerAllocation(cpus=(0,)))
    led.allocate("u1", "app", ContainerAllocation(cpus=(0, 2)))
    assert led.pods["u1"].containers["init"].cpus == (1,)
    assert led.cpu_owner[0] == ("u1", "app")


def test_round_trip_restores_state() -> None:
    led = Ledger(_machine())
    led.allocate("u1", "c", ContainerAllocation(
        cpus=(0, 1), memory={"memory": {0: 10 * MI}, "hugepages-2Mi": {0: 4 * MI}},
        memory_mask=1, devices={"x.com/gpu": ("g0",)}), pod_name="p", namespace="ns")
    led.allocate("u2", "c", ContainerAllocation(memory={"memory": {0: MI, 1: MI}},
                                                memory_mask=3))
    doc = json.loads(json.dumps(led.to_json()))
    back = Ledger.from_json(led.machine, doc)
    assert back.to_json() == led.to_json()
    assert back.free_view() == led.free_view()
    assert back.cells == {0: 3, 1: 3} and back.assignments == {0: 3, 1: 1}
    # a restored state that double-books is refused
    doc["pods"][1]["containers"]["c"]["cpus"] = [1]
    with pytest.raises(LedgerError, match="cpu 1 is already held"):
        Ledger.from_json(led.machine, doc)
    with pytest.raises(LedgerError):
        Ledger.from_json(led.machine, {"pods": [{"uid": "x", "containers": {"c": 5}}]})


def test_copy_is_independent() -> None:
    led = Ledger(_machine())
    work = led.copy()
    work.allocate("u1", "c", ContainerAllocation(cpus=(3,)))
    assert 3 in led.free_cpus() and 3 not in work.free_cpus()
    led.replace_with(work)
    assert 3 not in led.free_cpus()


def _state(led: Ledger) -> str:
    return json.dumps([led.to_json(), sorted(led.cpu_owner.items()),
                       sorted(led.device_owner.items()), sorted(led.memory_used.items()),
                       sorted(led.assignments.items()), sorted(led.cells.items())],
                      sort_keys=True)


def test_copies_share_nothing_they_change() -> None:
    """Copies share records until one writes: a hand-over, a release, new info or a
    refused batch in one never shows in the other, whichever way round."""
    led = Ledger(_machine())
    led.allocate_many("u1", [("init", ContainerAllocation(
        cpus=(0, 1), memory={"memory": {0: MI}}, memory_mask=1,
        devices={"x.com/gpu": ("g0",)}, reusable=True))], info={"k": "v"})
    led.allocate("u2", "c", ContainerAllocation(cpus=(4,)))
    before = _state(led)
    free = led.free_cpus()
    work = led.copy()
    assert work.free_cpus() == free and work.requested() == led.requested() == (2, {})
    work.allocate("u1", "app", ContainerAllocation(cpus=(0,), devices={"x.com/gpu": ("g0",)}))
    assert work.requested() == (2, {}) and 0 not in work.free_cpus()
    work.annotate("u1", {"k": "w"}, {"cpu": 1})
    assert work.requested() == (2, {"cpu": 1})
    work.release("u2", "c")
    assert work.free_cpus() == free | {4} and work.requested() == (1, {"cpu": 1})
    assert led.free_cpus() == free and led.requested() == (2, {})
    with pytest.raises(LedgerError):
        work.allocate_many("u1", [("x", ContainerAllocation(cpus=(2,))),
                                  ("y", ContainerAllocation(cpus=(2,)))])
    assert _state(led) == before
    assert work.pods["u1"].containers["init"].cpus == (1,)
    assert work.pods["u1"].containers["init"].devices == {"x.com/gpu": ()}
    assert work.cpu_owner[0] == ("u1", "app") and "u2" not in work.pods
    # the other way round: the source changes, a copy taken before does not
    after = _state(work)
    led.allocate("u1", "app", ContainerAllocation(cpus=(1,)))
    led.annotate("u1", {"k": "x"})
    led.release("u1", "init")
    assert _state(work) == after
    # a commit of a copy, then changes to either: independent again
    led.replace_with(work)
    assert _state(led) == after
    work.allocate("u1", "late", ContainerAllocation(cpus=(1,)))
    work.annotate("u1", {"k": "late"})
    assert _state(led) == after
    led.release("u1")
    assert "u1" in work.pods and work.pods["u1"].info["k"] == "late"
    assert 1 in led.free_cpus() and 1 not in work.free_cpus()
    with pytest.raises(LedgerError, match="not held"):
        led.annotate("u1", {})


def test_cpu_less_nodes_have_memory_only() -> None:
    path = MACHINES / "gb200-like-34numa.yaml"
    led = Ledger(load_machine(path))
    free = led.free_view()
    assert free["5"]["cpus"] == [] and free["5"]["memory"] == 23 * 1024 * MI
    assert free["0"]["hugepages-2Mi"] == 32 * 1024 * MI
