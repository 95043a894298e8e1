"""The placement bench's workload (bench/bench_placement.py): its node mix, its namespaces'
TopologyPolicies and its pods, drawn from a seed (the same pods, names and order for the
same seed)."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numalign.api.names import ANN_POLICY, ANN_SCOPE

HERE = Path(__file__).resolve().parent
SAMPLES = HERE.parent / "config" / "samples" / "machines"
PAUSE = "registry.k8s.io/pause:3.10"
LABEL = "numalign.io/bench"
REDEPLOY = {"enabled": True, "maxAttempts": 3, "backoffSeconds": 1, "avoidRejectingNodes": True}

# The node mix (weights over NODES): fragmented-8numa, the GPU machines and seed-figure1
# (a GPU and a NIC per 4-CPU NUMA node) are 70 %; dual-16core is the same size as
# fragmented-8numa to the scheduler, but holds what fragmented-8numa cannot.
NODE_WEIGHTS = {"fragmented-8numa": 35, "dual-16core": 30, "seed-figure1": 15,
                "dgx-a100-like": 10, "group4-gpu": 10}

# Namespaces and their TopologyPolicy.
NS_SNN, NS_RESTRICTED, NS_BE = "placement-snn", "placement-restricted", "placement-be"
NAMESPACES = (NS_SNN, NS_RESTRICTED, NS_BE)


def node_mix(nodes: int) -> list[tuple[Path, int]]:
    """NODES nodes split by NODE_WEIGHTS (largest remainders), at least one of each kind
    when there are enough nodes."""
    total = sum(NODE_WEIGHTS.values())
    exact = {k: nodes * w / total for k, w in NODE_WEIGHTS.items()}
    counts = {k: math.floor(v) for k, v in exact.items()}
    for k in sorted(exact, key=lambda k: exact[k] - counts[k], reverse=True):
        if sum(counts.values()) >= nodes:
            break
        counts[k] += 1
    return [(SAMPLES / f"{k}.yaml", c) for k, c in counts.items() if c]


# Every bench policy allows these pod overrides where it allows any.
OVERRIDES = {"allowed": True,
             "policies": ["none", "best-effort", "restricted", "single-numa-node"]}


def topology_policy(name: str, spec: dict[str, Any],
                    redeploy: dict[str, Any] | None = None) -> dict[str, Any]:
    """A TopologyPolicy NAME of SPEC, redeploying as REDEPLOY (by default the bench's)."""
    return {"apiVersion": "numalign.io/v1alpha1", "kind": "TopologyPolicy",
            "metadata": {"name": name},
            "spec": {**spec, "redeploy": REDEPLOY if redeploy is None else redeploy}}


def policies() -> list[dict[str, Any]]:
    return [
        topology_policy("placement-snn", {"policy": "single-numa-node", "scope": "pod",
                                          "namespaces": [NS_SNN], "priority": 10,
                                          "podOverrides": OVERRIDES}),
        topology_policy("placement-restricted", {"policy": "restricted", "scope": "container",
                                                 "namespaces": [NS_RESTRICTED],
                                                 "priority": 10}),
        topology_policy("placement-be", {"policy": "best-effort", "namespaces": [NS_BE],
                                         "priority": 10, "podOverrides": OVERRIDES}),
    ]


@dataclass(frozen=True)
class Shape:
    """One kind of pod of the workload."""

    name: str
    weight: float
    namespace: str
    cpu: str
    memory: str
    guaranteed: bool = True
    devices: tuple[tuple[str, int], ...] = ()
    overrides: tuple[tuple[str, str], ...] = ()  # pod annotations (policy, scope)


# What makes the scheduler's view (node-level room) differ from the node's: 4- and
# 6-CPU single-numa-node pods (a fragmented-8numa node has 32 CPUs but 4 per NUMA
# node), GPUs with their CPUs on one NUMA node, 8-CPU restricted pods (the narrowest
# NUMA set that could ever hold them must be free). Half are small Burstable pods,
# which no policy refuses.
SHAPES = (
    Shape("snn-4cpu", 4, NS_SNN, "4", "4Gi"),
    Shape("snn-6cpu", 2, NS_SNN, "6", "6Gi"),
    Shape("snn-gpu", 1, NS_SNN, "2", "2Gi", devices=(("nvidia.com/gpu", 1),)),
    Shape("snn-vendor-gpu", 0.4, NS_SNN, "2", "1Gi", devices=(("gpu-vendor.com/gpu", 1),)),
    Shape("snn-to-be", 1, NS_SNN, "6", "2Gi", overrides=((ANN_POLICY, "best-effort"),)),
    Shape("restricted-8cpu", 1, NS_RESTRICTED, "8", "8Gi"),
    Shape("restricted-gpu", 0.8, NS_RESTRICTED, "3", "4Gi", devices=(("nvidia.com/gpu", 1),)),
    Shape("restricted-small", 4, NS_RESTRICTED, "100m", "64Mi", guaranteed=False),
    Shape("be-small", 16, NS_BE, "100m", "64Mi", guaranteed=False),
    Shape("be-to-snn", 4, NS_BE, "3", "2Gi",
          overrides=((ANN_POLICY, "single-numa-node"), (ANN_SCOPE, "pod"))),
    Shape("be-to-restricted", 2, NS_BE, "4", "2Gi", overrides=((ANN_POLICY, "restricted"),)),
)


def container_resources(shape: Shape) -> dict[str, Any]:
    """The container's requests (and limits, for a Guaranteed shape) of SHAPE."""
    res: dict[str, str] = {"cpu": shape.cpu, "memory": shape.memory}
    res.update({r: str(n) for r, n in shape.devices})
    return {"requests": res, "limits": res} if shape.guaranteed else {"requests": res}


def pod_manifest(index: int, shape: Shape) -> dict[str, Any]:
    """Bare pod ``pl-INDEX`` of SHAPE, labelled for the bench's pod watch."""
    meta: dict[str, Any] = {"name": f"pl-{index:05d}", "namespace": shape.namespace,
                            "labels": {LABEL: "placement", "shape": shape.name}}
    if shape.overrides:
        meta["annotations"] = dict(shape.overrides)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"terminationGracePeriodSeconds": 0, "containers": [
                {"name": "main", "image": PAUSE, "resources": container_resources(shape)}]}}


def workload(pods: int, seed: int) -> list[dict[str, Any]]:
    """PODS pod manifests drawn by SHAPES' weights (the same for the same seed)."""
    rng = random.Random(seed)
    weights = [s.weight for s in SHAPES]
    return [pod_manifest(i, rng.choices(SHAPES, weights)[0]) for i in range(pods)]
