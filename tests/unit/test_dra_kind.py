"""DRA devices a claim was allocated align a pod's CPUs as device-plugin devices the kubelet
already gave it would: the same pod with the same devices' NUMA nodes gets the same
decision (admit, reason, merged hint, CPUs) under every policy and scope."""

from __future__ import annotations

from itertools import combinations
from typing import Any

import pytest

from numalign.agent.nri.devices import assigned_kinds
from numalign.topology.admit import AdmitResult, admit_pod
from numalign.topology.hints import TopologyHint, mask_of
from numalign.topology.ledger import ContainerAllocation, Ledger
from numalign.topology.machine import Machine, machine_from_dict
from numalign.topology.managers.dra import (
    DraDeviceRef,
    DraDevices,
    DraRequest,
    device_hints,
    request_key,
)
from numalign.topology.merge import REJECT_MESSAGE, REJECT_REASON
from numalign.topology.pod import Pod, pod_from_dict

GPU = "nvidia.com/gpu"
# 4 NUMA nodes of 4 CPUs; GPUs: 2 on node 0, 1 on node 1, 1 on node 3
GPUS = {"gpu0": 0, "gpu1": 0, "gpu2": 1, "gpu3": 3}


def machine() -> Machine:
    return machine_from_dict({
        "name": "four-numa",
        "numaNodes": [{"id": i, "cpus": f"{4 * i}-{4 * i + 3}", "memory": "8Gi"}
                      for i in range(4)],
        "devices": [{"resource": GPU, "id": d, "numaNode": n} for d, n in GPUS.items()]})


def pod(cpus: int, gpus: int, containers: int = 1, dra: bool = False) -> Pod:
    res: dict[str, str] = {"cpu": str(cpus), "memory": "1Gi"}
    if not dra:
        res[GPU] = str(gpus)
    spec: list[dict[str, Any]] = [{"name": f"c{i}", "resources": {"limits": dict(res)}}
                                  for i in range(containers)]
    return pod_from_dict({"metadata": {"name": "p", "uid": "p"}, "spec": {"containers": spec}})


def dra_kind(per_container: dict[str, list[str]]) -> DraDevices:
    peers = tuple((n,) for n in GPUS.values())
    return DraDevices({c: [DraRequest(f"claim-{c}", "gpus", tuple(
        DraDeviceRef("gpu.example.com", "node", d, (GPUS[d],)) for d in ids), peers)]
        for c, ids in per_container.items()})


def outcome(r: AdmitResult) -> tuple[Any, ...]:
    cpus = {n: sorted(c.allocation.cpus) for n, c in r.containers.items()}
    return (r.admit, r.reason, r.message, r.hint if r.admit else None, cpus)


ASSIGNMENTS = [list(c) for k in (1, 2) for c in combinations(sorted(GPUS), k)]


@pytest.mark.parametrize("policy", ["single-numa-node", "restricted", "best-effort", "none"])
@pytest.mark.parametrize("scope", ["container", "pod"])
@pytest.mark.parametrize("cpus", [2, 4, 6])
def test_claim_devices_decide_as_assigned_device_plugin_devices(
        policy: str, scope: str, cpus: int) -> None:
    m = machine()
    seen_reject = seen_admit = False
    for ids in ASSIGNMENTS:
        for held in ([], [0, 1, 2]):  # node 0's CPUs partly taken
            plugin_ledger, dra_ledger = Ledger(m), Ledger(m)
            if held:
                for lg in (plugin_ledger, dra_ledger):
                    lg.allocate("other", "c", ContainerAllocation(cpus=tuple(held)))
            assigned = {"c0": {GPU: ids}}
            want = admit_pod(m, plugin_ledger, pod(cpus, len(ids)), policy, scope,
                             providers=assigned_kinds(m, assigned))
            got = admit_pod(m, dra_ledger, pod(cpus, len(ids), dra=True), policy, scope,
                            providers=[dra_kind({"c0": ids})])
            assert outcome(got) == outcome(want), (ids, held)
            seen_admit |= got.admit
            seen_reject |= not got.admit
            if got.admit:
                assert got.reports["dra"] == {"c0": {request_key("claim-c0", "gpus"): [
                    f"gpu.example.com/node/{d}" for d in ids]}}
    if cpus <= 4 or policy in ("best-effort", "none"):  # more CPUs than one node has
        assert seen_admit
    if policy in ("single-numa-node", "restricted"):
        assert seen_reject


def test_two_containers_each_aligned_with_their_own_claim() -> None:
    m = machine()
    r = admit_pod(m, Ledger(m), pod(2, 1, containers=2, dra=True), "single-numa-node",
                  providers=[dra_kind({"c0": ["gpu2"], "c1": ["gpu3"]})])
    assert r.admit
    assert {m.cpus[c].numa for c in r.containers["c0"].allocation.cpus} == {1}
    assert {m.cpus[c].numa for c in r.containers["c1"].allocation.cpus} == {3}
    # pod scope: both claims' devices in one decision: nodes 1 and 3 are not one node
    r = admit_pod(m, Ledger(m), pod(2, 1, containers=2, dra=True), "single-numa-node", "pod",
                  providers=[dra_kind({"c0": ["gpu2"], "c1": ["gpu3"]})])
    assert (r.admit, r.reason, r.message) == (False, REJECT_REASON, REJECT_MESSAGE)


def test_split_devices_are_refused_by_single_numa_node_never_by_best_effort() -> None:
    m = machine()
    kind = dra_kind({"c0": ["gpu0", "gpu2"]})  # two GPUs on nodes 0 and 1
    r = admit_pod(m, Ledger(m), pod(2, 2, dra=True), "single-numa-node", providers=[kind])
    assert (r.admit, r.reason) == (False, REJECT_REASON)
    r = admit_pod(m, Ledger(m), pod(2, 2, dra=True), "best-effort", providers=[kind])
    assert r.admit and r.hint == TopologyHint(mask_of([0, 1]), False)
    # the decision's hint map names the claim request, labelled by the kind
    key = request_key("claim-c0", "gpus")
    assert r.decisions[0].sources[key] == "dra"


def test_unknown_numa_nodes_give_no_hint() -> None:
    m = machine()
    assert device_hints([None], [(0,), None], m.numa_ids) is None
    # a known device still counts; the unknown one is left out of the count
    assert device_hints([(1,), None], [(0,), (1,)], m.numa_ids) == [
        TopologyHint(mask_of(ids), len(ids) == 1) for ids in
        ([1], [0, 1])]
    # a device on a NUMA node the machine lacks is counted in no mask
    assert device_hints([(7,)], [(7,)], m.numa_ids) is None
    unknown = DraDevices({"c0": [DraRequest("c", "r", (
        DraDeviceRef("d", "p", "x", None),), ((0,),))]})
    r = admit_pod(m, Ledger(m), pod(2, 1, dra=True), "single-numa-node", providers=[unknown])
    assert r.admit
    dec = r.decisions[0]
    assert dec.provider_names == ["cpu", "memory", "devices"]
    assert dec.providers[2] == {"dra:c/r": None}  # no preference


def test_a_device_on_several_numa_nodes_counts_in_any_of_them() -> None:
    m = machine()
    hints = device_hints([(0, 1)], [(0, 1)], m.numa_ids)
    assert hints is not None
    assert TopologyHint(mask_of([0]), True) in hints
    assert TopologyHint(mask_of([1]), True) in hints
