"""`numalign explain` offline: the explanation of real decisions on the fixture machines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import testdata
from numalign.api.nodestatus import held_from_document, ledger_from_held, machine_from_status
from numalign.commands import explain as cmd
from numalign.commands.explain_text import render_text
from numalign.topology.errors import TopologyError
from numalign.topology.explain import explain_pod
from numalign.topology.hints import mask_of
from numalign.topology.ledger import Ledger
from numalign.topology.machine import load_machine
from numalign.topology.pod import pod_from_dict
from numalign.topology.policyconfig import PolicyOptions

MACHINES = testdata.MACHINES
SEED = MACHINES / "seed-figure1.yaml"
FRAG = MACHINES / "fragmented-8numa.yaml"
GPU = "gpu-vendor.com/gpu"
NIC = "nic-vendor.com/nic"


def pod(name: str, limits: dict[str, str], uid: str | None = None,
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}",
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}}


GPU_NIC = pod("c", {"cpu": "2", "memory": "1Gi", GPU: "1", NIC: "1"})

# Figure 1: the GPU of node 1 and the NIC of node 0 are taken, so no node has both.
CROSSED = {"status": {"admitted": [
    {"pod": "x", "namespace": "default", "uid": "ux", "policy": "best-effort",
     "scope": "container", "source": "pod", "numaNodes": [1],
     "containers": [{"name": "c", "numaNodes": [1], "cpus": "4",
                     "devices": {GPU: ["gpu1"]}}]},
    {"pod": "y", "namespace": "default", "uid": "uy", "policy": "best-effort",
     "scope": "container", "source": "pod", "numaNodes": [0], "cpus": "0",
     "memory": {"0": "1Gi"}, "devices": {NIC: ["nic0"]}},
]}}


def explain(machine_path: Path, doc: dict[str, Any], policy: str, *, scope: str = "container",
            options: PolicyOptions | None = None, allocated: Any = None) -> Any:
    machine = load_machine(machine_path)
    p = pod_from_dict(doc)
    ledger = Ledger(machine)
    if allocated is not None:
        ledger, notes = ledger_from_held(machine, held_from_document(allocated))
        assert notes == []
    return explain_pod(machine, p, policy, scope, options, ledger)


def test_preferred_single_node_lowest_ids() -> None:
    e = explain(SEED, GPU_NIC, "restricted")
    assert e.admit and e.hint.mask == mask_of([0]) and e.hint.preferred
    (d,) = e.decisions
    assert [(r.provider, r.resource) for r in d.resources] == [
        ("cpu", "cpu"), ("memory", "memory"), ("devices", GPU), ("devices", NIC)]
    for r in d.resources:
        assert r.hints is not None
        assert [(h.mask, h.preferred) for h in r.hints][:2] == [(1, True), (2, True)]
        assert r.prefers_winner == "yes"
    assert [(c.mask, c.preferred, c.width) for c in d.candidates] == [(1, True, 1), (2, True, 1)]
    assert "preferred by every resource" in d.why
    assert "lowest NUMA node ids (ahead of {1})" in d.why
    assert "admitted" in d.admit_why
    c = e.allocation["containers"]["main"]
    assert c["cpus"] == [0, 1] and c["memory"] == {"0": 1 << 30}
    assert c["devices"] == {GPU: ["gpu0"], NIC: ["nic0"]}


@pytest.mark.parametrize("policy,admit", [("best-effort", True), ("restricted", False)])
def test_crossed_devices_non_preferred(policy: str, admit: bool) -> None:
    e = explain(SEED, GPU_NIC, policy, allocated=CROSSED)
    assert e.admit is admit
    (d,) = e.decisions
    hints = {r.resource: r for r in d.resources}
    assert hints[GPU].hints is not None and hints[GPU].hints[0].mask == mask_of([0])
    assert hints[NIC].hints is not None and hints[NIC].hints[0].mask == mask_of([1])
    assert hints[NIC].prefers_winner == "no" and hints[GPU].prefers_winner == "yes"
    assert d.hint.mask == mask_of([0]) and not d.hint.preferred
    assert all(not c.preferred for c in d.candidates)
    assert d.best_non_preferred == 1
    assert "No NUMA mask is preferred by every resource" in d.why
    assert f"{NIC} does not prefer it" in d.why
    assert "B = 1" in d.why
    if admit:
        assert "best-effort admits" in d.admit_why
        assert e.allocation["containers"]["main"]["devices"] == {GPU: ["gpu0"], NIC: ["nic1"]}
    else:
        assert e.reason == "TopologyAffinityError"
        assert "rejected" in e.summary and "not preferred" in e.summary
        assert e.allocation["containers"] == {}


def test_single_numa_node_no_affinity_rejects() -> None:
    e = explain(SEED, GPU_NIC, "single-numa-node", allocated=CROSSED)
    assert not e.admit and e.reason == "TopologyAffinityError"
    (d,) = e.decisions
    assert d.hint.mask is None and not d.hint.preferred
    assert d.candidates == []
    assert "single-numa-node" in d.why and "no affinity" in d.why
    assert "no NUMA affinity" in e.summary


def test_no_hints_for_best_effort_pod() -> None:
    doc = pod("be", {})
    e = explain(SEED, doc, "restricted")
    assert e.admit and e.qos == "BestEffort"
    (d,) = e.decisions
    assert d.resources == []
    assert "No provider has a preference" in d.why
    assert d.hint.mask == mask_of([0, 1]) and d.hint.preferred


def test_policy_none() -> None:
    e = explain(SEED, GPU_NIC, "none")
    assert e.admit
    assert "Policy none" in e.decisions[0].why
    assert "policy none" in e.summary


WIDE = pod("w", {"cpu": "6", "memory": "20Gi"})
BUSY = {"admitted": [{"pod": "busy", "namespace": "default", "uid": "ub", "cpus": "4-15"}]}


def test_narrowest_then_lowest_ids_without_closest() -> None:
    e = explain(FRAG, WIDE, "restricted", allocated=BUSY)
    (d,) = e.decisions
    assert d.hint.mask == mask_of([0, 4]) and d.hint.preferred
    assert d.candidates[0].width == 2 and d.candidates[0].distance_sum is None
    assert d.preferred_candidates is not None and d.preferred_candidates > len(d.candidates)
    assert "lowest NUMA node ids" in d.why
    assert e.allocation["containers"]["main"]["cpus"] == [0, 1, 2, 3, 16, 17]


def test_prefer_closest_numa_nodes() -> None:
    e = explain(FRAG, WIDE, "restricted", allocated=BUSY,
                options=PolicyOptions(prefer_closest_numa_nodes=True))
    (d,) = e.decisions
    assert d.hint.mask == mask_of([4, 5])
    assert d.candidates[0].to_json()["averageDistance"] == 13
    assert "closest" in d.why and "13" in d.why
    text = render_text(e)
    assert "AVG DISTANCE" in text and "prefer-closest-numa-nodes" in text


def test_narrowest_wins_over_wider() -> None:
    # 5 CPUs fit one node of seed-figure1 (4 CPUs) only across two: one preferred {0,1}.
    e = explain(SEED, pod("five", {"cpu": "5", "memory": "1Gi"}), "best-effort")
    (d,) = e.decisions
    cpu = next(r for r in d.resources if r.resource == "cpu")
    assert cpu.hints is not None
    assert [(h.mask, h.preferred) for h in cpu.hints] == [(3, True)]
    # memory prefers one node, CPUs only both: nothing is preferred by both
    assert not d.hint.preferred and d.hint.mask == mask_of([0, 1])
    assert "B = 2" in d.why


def test_pod_scope_one_decision() -> None:
    doc = pod("ps", {"cpu": "2", "memory": "1Gi", GPU: "1"})
    doc["spec"]["containers"].append(
        {"name": "side", "resources": {"limits": {"cpu": "1", "memory": "1Gi", NIC: "1"}}})
    e = explain(SEED, doc, "single-numa-node", scope="pod")
    assert [d.unit for d in e.decisions] == ["pod"]
    assert e.admit and e.hint.mask == mask_of([0])
    assert set(e.allocation["containers"]) == {"main", "side"}


def test_container_scope_one_decision_each() -> None:
    doc = pod("cs", {"cpu": "2", "memory": "1Gi"})
    doc["spec"]["initContainers"] = [
        {"name": "init", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]
    e = explain(SEED, doc, "restricted")
    assert [d.unit for d in e.decisions] == ["init", "main"]


def test_gpu_groups_provider() -> None:
    machine = MACHINES / "group4-gpu.yaml"
    m = load_machine(machine)
    res = m.device_resources[0]
    doc = pod("g", {"cpu": "1", "memory": "1Gi", res: "2"},
              annotations={"numalign.io/gpus": json.dumps([{"count": 2}])})
    e = explain(machine, doc, "best-effort")
    (d,) = e.decisions
    assert any(r.provider == "gpu-groups" and r.resource == res for r in d.resources)
    assert e.admit and sum(len(v) for v in e.allocation["gpus"].values()) == 2


def test_json_and_text_views() -> None:
    e = explain(SEED, GPU_NIC, "best-effort", allocated=CROSSED)
    doc = e.to_json()
    json.dumps(doc)
    assert doc["decisions"][0]["winner"] == {"numaNodes": [0], "preferred": False}
    assert doc["decisions"][0]["providers"][3]["prefersWinner"] == "no"
    text = render_text(e)
    assert "PROVIDER" in text and "Merged candidates" in text and "Why:" in text
    assert "{1}* {0,1}" in text  # the NIC's hints, preferred marked


def test_machine_and_ledger_from_nodetopology_status() -> None:
    status = {
        "zones": [{"id": 0, "cpus": "0-3", "memory": "32Gi"},
                  {"id": 1, "cpus": "4-7", "memory": "32Gi", "hugepages": {"2Mi": "1Gi"}}],
        "distances": {"0": {"0": 10, "1": 21}, "1": {"0": 21, "1": 10}},
        "devices": [{"resource": GPU, "id": "gpu0", "numaNode": 0},
                    {"resource": GPU, "id": "gpu1", "numaNode": 1,
                     "groups": [{"level": "nvlink", "id": "nv1"}]}],
        "admitted": [{"pod": "other", "namespace": "ns", "uid": "u-other", "cpus": "0-1",
                      "memory": {"0": "1Gi"}, "devices": {GPU: ["gpu0"]}},
                     {"pod": "me", "namespace": "default", "uid": "u-me", "cpus": "4"}],
    }
    m = machine_from_status(status, "n1")
    assert m.numa_ids == [0, 1] and m.distances == {0: {0: 10, 1: 21}, 1: {0: 21, 1: 10}}
    assert m.node(1).hugepages == {"2Mi": 1 << 30}
    assert m.devices[1].groups == (("nvlink", "nv1"),)
    ledger, notes = ledger_from_held(m, held_from_document(status),
                                     ("u-me", "default", "me"))
    assert notes == [] and set(ledger.pods) == {"u-other"}
    assert ledger.free_cpus() == {2, 3, 4, 5, 6, 7}
    with pytest.raises(TopologyError, match="zones"):
        machine_from_status({"zones": []})


def test_allocated_from_admit_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = tmp_path / "a.yaml"
    a.write_text(yaml.safe_dump(pod("a", {"cpu": "4", "memory": "1Gi"})))
    from numalign.commands import admit

    assert admit.main(["--machine", str(SEED), "--policy", "restricted", str(a)]) == 0
    lines = capsys.readouterr().out
    alloc = tmp_path / "alloc.jsonl"
    alloc.write_text(lines)
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(pod("p", {"cpu": "2", "memory": "1Gi"})))
    assert cmd.main(["--machine", str(SEED), "--pod", str(p), "--policy", "restricted",
                     "--allocated", str(alloc), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    cpu = out["decisions"][0]["providers"][0]
    assert cpu["resource"] == "cpu" and cpu["hints"][0] == {"numaNodes": [1], "preferred": True}
    assert out["hint"] == {"numaNodes": [1], "preferred": True}
    assert out["allocation"]["containers"]["main"]["cpus"] == [4, 5]


def test_allocated_memory_nodes_from_admit_output(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Replayed from numalign admit's output, a container's memory block holds the NUMA
    nodes its memory may use (memoryNumaNodes), not every node the container touches."""
    docs = [pod("a", {"cpu": "4", "memory": "1Gi"}), pod("b", {"cpu": "2", "memory": "1Gi"})]
    a = tmp_path / "a.yaml"
    a.write_text(yaml.safe_dump_all(docs))
    from numalign.commands import admit

    assert admit.main(["--machine", str(SEED), "--policy", "none", str(a)]) == 0
    lines = capsys.readouterr().out
    b = json.loads(lines.splitlines()[1])["containers"]["main"]
    # b's CPUs are on node 1 (node 0's are a's), its memory on node 0 (the default hint)
    assert b["numaNodes"] == [0, 1] and b["memoryNumaNodes"] == [0]
    alloc = tmp_path / "alloc.jsonl"
    alloc.write_text(lines)
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(pod("p", {"cpu": "1", "memory": "1Gi"})))
    assert cmd.main(["--machine", str(SEED), "--pod", str(p), "--policy", "single-numa-node",
                     "--allocated", str(alloc), "-o", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["admit"] is True and out["hint"] == {"numaNodes": [1], "preferred": True}


def test_command_text_and_policy_from_annotation(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(pod("p", {"cpu": "2", "memory": "1Gi"},
                                    annotations={"numalign.io/policy": "single-numa-node"})))
    assert cmd.main(["--machine", str(SEED), "--pod", str(p)]) == 0
    out = capsys.readouterr().out
    assert "Policy:   single-numa-node, scope container" in out
    assert "Winner: NUMA nodes {0}, preferred" in out


@pytest.mark.parametrize("argv,needle", [
    ([], "offline mode needs both"),
    (["--machine", str(SEED), "--pod", "missing.yaml", "--policy", "restricted"],
     "cannot read the pod"),
    (["--machine", "missing.yaml", "--pod", "POD", "--policy", "restricted"], "machine file"),
    (["--machine", str(SEED), "--pod", "POD"], "no policy"),
    (["--machine", str(SEED), "--pod", "POD", "--policy", "strict"], "unknown policy"),
    (["--machine", str(SEED), "--pod", "POD", "--policy", "restricted", "--scope", "node"],
     "unknown scope"),
    (["--machine", str(SEED), "--pod", "POD", "--policy", "restricted", "--option", "x"],
     "KEY=VALUE"),
    (["--machine", str(SEED), "--pod", "POD", "--policy", "restricted",
      "--option", "prefer-closest-numa-nodes=maybe"], "ParseBool"),
    (["--machine", str(SEED), "--pod", "POD", "--policy", "restricted", "--allocated", "POD"],
     "allocations"),
    (["--frobnicate"], "unrecognized arguments"),
    (["mypod", "--machine", str(SEED)], "not both"),
])
def test_command_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     argv: list[str], needle: str) -> None:
    good = tmp_path / "pod.yaml"
    good.write_text(yaml.safe_dump(GPU_NIC))
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(pod("big", {"cpu": "64", "memory": "1Gi"})))
    argv = [str(good) if a == "POD" else str(big) if a == "BIG" else a for a in argv]
    assert cmd.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("numalign explain: ") and err.count("\n") == 1, err
    assert needle in err and "Traceback" not in err


def test_a_pod_bigger_than_the_machine_is_explained_as_a_rejection(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The kubelet rejects such a pod (it is no input error): explain says why."""
    big = tmp_path / "big.yaml"
    big.write_text(yaml.safe_dump(pod("big", {"cpu": "64", "memory": "1Gi"})))
    assert cmd.main(["--machine", str(SEED), "--pod", str(big), "--policy", "restricted"]) == 0
    out = capsys.readouterr().out
    assert "REJECTED (TopologyAffinityError)" in out and "cannot satisfy" in out


def test_live_mode_bad_kubeconfig(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cmd.main(["mypod", "--kubeconfig", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--kubeconfig" in err
