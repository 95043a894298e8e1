"""The agent's admission of pods with ``numalign.io/gpus``: GPU group placement on a
valid request, refusal (``InvalidGpuRequest``, nothing held) on a malformed one."""

from __future__ import annotations

import json
from typing import Any

import testdata
from agent_helpers import given
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api.admission import INVALID_GPU_REASON
from numalign.api.resolved import Resolved
from numalign.topology.machine import load_machine

MACHINES = testdata.MACHINES
SNN = Resolved("single-numa-node", "pod", {}, "pod")


def _pod(name: str, gpus: str) -> dict[str, Any]:
    res = {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "2", "nvidia.com/hca": "1"}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "annotations": {"numalign.io/gpus": gpus}},
            "spec": {"containers": [{"name": "main", "resources": {"requests": res,
                                                                   "limits": res}}]}}


def test_gpu_pair_with_its_nic() -> None:
    machine = load_machine(MACHINES / "dgx-a100-like.yaml")
    st = NodeState("n", machine)
    gpus = json.dumps([{"count": 2, "sameGroup": "pcie", "withResource": "nvidia.com/hca"}])
    d = st.decide(_pod("a", gpus), given(SNN))
    assert d.admit and d.allocation is not None
    (ids,) = d.allocation.gpus.values()
    devs = {x.id: x for x in machine.devices}
    pair = [devs[i] for i in ids]
    assert len(pair) == 2 and pair[0].group("pcie") == pair[1].group("pcie")
    main = d.allocation.containers["main"]
    (nic,) = main.devices["nvidia.com/hca"]
    assert devs[nic].group("pcie") == pair[0].group("pcie")
    numa = pair[0].numa_node
    assert d.allocation.numa_nodes == [numa]
    assert {machine.cpus[c].numa for c in main.cpus} == {numa}
    (entry,) = build_status(st)["admitted"]
    assert entry["gpus"] == d.allocation.gpus


def test_malformed_gpu_annotation_is_refused_and_holds_nothing() -> None:
    st = NodeState("n", load_machine(MACHINES / "dgx-a100-like.yaml"))
    cases = [('[{"count": 0}]', "numalign.io/gpus[0].count: must be an integer >= 1"),
             ("[{count: 2}]", "numalign.io/gpus: is not valid JSON"),
             ('[{"count": 2, "sameGroup": "nvlink"}]', "numalign.io/gpus[0].sameGroup")]
    for i, (bad, field) in enumerate(cases):
        d = st.decide(_pod(f"bad{i}", bad), given(SNN))
        assert not d.admit
        assert d.reason == INVALID_GPU_REASON
        assert d.message is not None and field in d.message, d.message
    assert not st.admitted and not st.ledger.pods
    assert st.rejected_total == 0  # status.rejected counts TopologyAffinityErrors only
