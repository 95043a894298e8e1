"""agent.nri.pods: the placer's view of the node's pods (resolved policy, node default),
and a pod the watch delivers late still placed by the engine."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from numalign.agent.nri.placer import EnginePlacer
from numalign.agent.nri.pods import PodIndex
from numalign.api.names import ANN_RESOLVED
from numalign.nriapi.v1alpha1 import api_pb2
from numalign.topology.machine import machine_from_dict

MACHINE = machine_from_dict({
    "name": "view-2x2",
    "numaNodes": [{"id": 0, "cpus": "0-1", "memory": "4Gi"},
                  {"id": 1, "cpus": "2-3", "memory": "4Gi"}],
})


def pod(uid: str, cpu: str = "1", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    res = {"requests": {"cpu": cpu, "memory": "64Mi"}, "limits": {"cpu": cpu, "memory": "64Mi"}}
    return {"metadata": {"name": uid, "namespace": "ns", "uid": uid,
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": "main", "resources": res}]}}


def test_policy_from_the_pod_else_the_node_default() -> None:
    idx = PodIndex()
    idx.on_node_spec({"policy": "best-effort", "scope": "pod"})
    idx.on_pod("ADDED", pod("a", annotations={ANN_RESOLVED: json.dumps(
        {"policy": "single-numa-node", "scope": "container", "source": "pod"})}))
    idx.on_pod("ADDED", pod("deferred", annotations={ANN_RESOLVED: json.dumps(
        {"policy": None, "scope": None, "source": "node-default"})}))
    idx.on_pod("ADDED", pod("bare"))
    idx.on_pod("ADDED", pod("broken", annotations={ANN_RESOLVED: "{not json"}))
    a = idx("a")
    assert a is not None and (a.policy.name, a.policy.scope) == ("single-numa-node",
                                                                  "container")
    for uid in ("deferred", "bare", "broken"):
        v = idx(uid)
        assert v is not None
        assert (v.policy.name, v.policy.scope, v.policy.source) == (
            "best-effort", "pod", "node-default")
    idx.on_pod("DELETED", pod("a"))
    assert idx("a") is None and idx("never") is None


async def test_a_pod_delivered_late_is_still_admitted_by_the_engine() -> None:
    idx = PodIndex()
    idx.on_node_spec({"policy": "single-numa-node"})
    placer = EnginePlacer(MACHINE, idx, reserved_cpus=[0], memory_nodes=[0],
                          wait_for=idx.wait_for, wait_s=5)
    nri_pod = api_pb2.PodSandbox(id="sb", uid="late", name="late", namespace="ns")

    async def deliver() -> None:
        await asyncio.sleep(0.2)
        idx.on_pod("ADDED", pod("late", cpu="2"))

    task = asyncio.create_task(deliver())
    await placer.prepare(nri_pod)
    got = placer.create(nri_pod, api_pb2.Container(id="c", pod_sandbox_id="sb", name="main"))
    await task
    assert got.cpuset is not None and got.cpuset.cpus == "2-3"
    # a pod that never comes: the wait ends, its container shares the pool
    quick = EnginePlacer(MACHINE, idx, memory_nodes=[0], wait_for=idx.wait_for, wait_s=0.1)
    ghost = api_pb2.PodSandbox(id="sb2", uid="ghost", name="ghost", namespace="ns")
    await quick.prepare(ghost)
    shared = quick.create(ghost, api_pb2.Container(id="c2", pod_sandbox_id="sb2", name="x"))
    assert shared.cpuset is not None and shared.cpuset.cpus == "0-3"
