"""Policies as objects: the engine asks the policy, never its name. A fifth policy is one
module and one registry entry; here a toy one, registered only for the test, goes
through the merge, hint generation, admission, ``explain`` and ``numalign merge``
without any of them knowing it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import testdata
from numalign.commands.merge import decide
from numalign.topology.admit import admit_pod
from numalign.topology.errors import TopologyError
from numalign.topology.explain import explain_pod
from numalign.topology.hints import TopologyHint
from numalign.topology.ledger import Ledger
from numalign.topology.machine import load_machine
from numalign.topology.merge import REJECT_REASON, merge
from numalign.topology.pod import pod_from_dict
from numalign.topology.policies import (
    BUILTIN,
    get_policy,
    kubelet_names,
    names,
    register,
    unregister,
)
from numalign.topology.policyconfig import PolicyOptions
from toy_policy import AtMostTwo


@pytest.fixture
def toy() -> Iterator[str]:
    register(AtMostTwo())
    try:
        yield AtMostTwo.name
    finally:
        unregister(AtMostTwo.name)


def _guaranteed(cpus: int) -> dict[str, object]:
    # as much memory as CPUs ask NUMA nodes for (4 CPUs and 16Gi a node), so both
    # resources prefer the same width
    res = {"cpu": str(cpus), "memory": f"{cpus * 4 - 4}Gi"}
    return {"metadata": {"name": f"p{cpus}", "uid": f"u{cpus}"},
            "spec": {"containers": [{"name": "app", "resources": {"limits": res}}]}}


def test_builtin_policies_are_the_kubelets() -> None:
    kubelet = ("none", "best-effort", "restricted", "single-numa-node")
    assert tuple(p.name for p in BUILTIN) == kubelet_names() == names() == kubelet
    assert [get_policy(n).aligns for n in kubelet] == [False, True, True, True]
    assert [n for n in kubelet if get_policy(n).single_numa] == ["single-numa-node"]


def test_unknown_policy_is_refused_in_the_kubelets_words() -> None:
    with pytest.raises(TopologyError, match='policy: unknown policy: "strict"'):
        get_policy("strict")
    with pytest.raises(TopologyError, match="unknown policy"):
        merge("strict", [], [0], None, PolicyOptions())


def test_a_registered_policy_goes_through_the_whole_engine(toy: str) -> None:
    assert toy in names()
    machine = load_machine(testdata.MACHINES / "fragmented-8numa.yaml")  # 8 x 4 CPUs
    hints = {"cpu": [TopologyHint(0b111, True)]}
    assert not merge(toy, [hints], list(range(8)), None, PolicyOptions()).admit
    assert merge("restricted", [hints], list(range(8)), None, PolicyOptions()).admit
    # admission: 12 CPUs (44Gi) need three NUMA nodes (preferred: restricted admits them);
    # 8 (28Gi) fit two
    led = Ledger(machine)
    wide = admit_pod(machine, led, pod_from_dict(_guaranteed(12)), toy)
    assert (wide.admit, wide.reason) == (False, REJECT_REASON)
    assert admit_pod(machine, Ledger(machine), pod_from_dict(_guaranteed(12)),
                     "restricted").admit
    two = admit_pod(machine, led, pod_from_dict(_guaranteed(8)), toy)
    assert two.admit and len(two.containers["app"].numa_nodes) == 2
    # explain words it by the interface's defaults
    ex = explain_pod(machine, pod_from_dict(_guaranteed(12)), toy, "container")
    assert not ex.admit
    assert ex.decisions[0].admit_why == \
        f"at-most-two does not admit this hint: rejected with {REJECT_REASON}."
    assert "is preferred, yet at-most-two does not admit it" in ex.summary
    # numalign merge takes it by name
    out = decide({"policy": toy, "numaNodes": [0, 1, 2],
                  "providers": [{"cpu": [{"numaNodes": [0, 1], "preferred": True}]}]})
    assert out == {"hint": {"numaNodes": [0, 1], "preferred": True}, "admit": True}


def test_registry_refuses_a_taken_name_and_keeps_the_builtins() -> None:
    with pytest.raises(ValueError, match="taken"):
        register(AtMostTwo.__mro__[1]())  # an unnamed policy
    with pytest.raises(ValueError, match="built-in"):
        unregister("restricted")
