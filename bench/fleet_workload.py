"""The fleet bench's workload (bench/bench_fleet.py): namespaces under mixed
TopologyPolicies, and units of pods (Deployments, Jobs, bare pods) drawn from a seed,
created in bursts. The pod shapes are the placement bench's (bench/placement_workload.py):
single-numa-node pods that only some NUMA nodes hold, GPU pods, restricted pods, small
Burstable pods, and pods that override their namespace's policy by annotation."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from placement_workload import (
    NS_BE,
    NS_RESTRICTED,
    NS_SNN,
    OVERRIDES,
    PAUSE,
    SHAPES,
    Shape,
    container_resources,
    topology_policy,
)

LABEL = "numalign.io/bench"
VALUE = "fleet"

# The placement namespaces' shapes, in the fleet's namespaces; two more namespaces: a
# single-numa-node one that does not redeploy (batch Jobs), one no policy governs (the
# node's default applies).
NAMESPACE_OF = {NS_SNN: "fleet-snn", NS_RESTRICTED: "fleet-restricted", NS_BE: "fleet-be"}
NS_BATCH, NS_PLAIN = "fleet-batch", "fleet-plain"
NAMESPACES = (*NAMESPACE_OF.values(), NS_BATCH, NS_PLAIN)

# Share of the pods by unit kind, and the sizes drawn for each.
KIND_SHARE = {"Deployment": 0.5, "Job": 0.25, "Pod": 0.25}
DEPLOYMENT_REPLICAS = (5, 10, 20, 40)
JOB_PARALLELISM = (4, 8, 16)


def policies() -> list[dict[str, Any]]:
    tp = topology_policy
    return [
        tp("fleet-snn", {"policy": "single-numa-node", "scope": "pod",
                         "namespaces": ["fleet-snn"], "priority": 10,
                         "podOverrides": OVERRIDES}),
        tp("fleet-restricted", {"policy": "restricted", "scope": "container",
                                "namespaces": ["fleet-restricted"], "priority": 10}),
        tp("fleet-be", {"policy": "best-effort", "namespaces": ["fleet-be"], "priority": 10,
                        "podOverrides": OVERRIDES}),
        tp("fleet-batch", {"policy": "single-numa-node", "scope": "pod",
                           "namespaces": [NS_BATCH], "priority": 10},
           {"enabled": False}),
    ]


@dataclass(frozen=True)
class Unit:
    """One object the bench creates: a Deployment, a Job or a bare Pod."""

    kind: str
    name: str
    namespace: str
    pods: int
    shape: Shape

    def manifest(self) -> dict[str, Any]:
        labels = {LABEL: VALUE, "shape": self.shape.name, "unit": self.name}
        meta: dict[str, Any] = {"labels": labels}
        if self.shape.overrides:
            meta["annotations"] = dict(self.shape.overrides)
        spec = pod_spec(self.shape, "Never" if self.kind == "Job" else "Always")
        if self.kind == "Pod":
            return {"apiVersion": "v1", "kind": "Pod",
                    "metadata": {**meta, "name": self.name, "namespace": self.namespace},
                    "spec": spec}
        template = {"metadata": meta, "spec": spec}
        if self.kind == "Deployment":
            return {"apiVersion": "apps/v1", "kind": "Deployment",
                    "metadata": {"name": self.name, "namespace": self.namespace,
                                 "labels": {LABEL: VALUE}},
                    "spec": {"replicas": self.pods,
                             "selector": {"matchLabels": {"unit": self.name}},
                             "template": template}}
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": self.name, "namespace": self.namespace,
                             "labels": {LABEL: VALUE}},
                "spec": {"parallelism": self.pods, "completions": self.pods,
                         "backoffLimit": 1000, "template": template}}

    @property
    def collection(self) -> str:
        base = {"Pod": "/api/v1", "Deployment": "/apis/apps/v1", "Job": "/apis/batch/v1"}
        res = {"Pod": "pods", "Deployment": "deployments", "Job": "jobs"}
        return f"{base[self.kind]}/namespaces/{self.namespace}/{res[self.kind]}"


def pod_spec(shape: Shape, restart: str) -> dict[str, Any]:
    return {"terminationGracePeriodSeconds": 0, "restartPolicy": restart,
            "containers": [{"name": "main", "image": PAUSE,
                            "resources": container_resources(shape)}]}


def units(pods: int, seed: int) -> list[Unit]:
    """Units holding PODS pods in all, in creation order (the same for the same seed):
    kinds by KIND_SHARE of the pods, shapes by their weights; a Job's pods go to the
    batch namespace one time in two, a bare pod to the plain one one time in four."""
    rng = random.Random(seed)
    weights = [s.weight for s in SHAPES]
    out: list[Unit] = []
    left = pods
    count = {"Deployment": 0, "Job": 0, "Pod": 0}
    mean = {"Deployment": sum(DEPLOYMENT_REPLICAS) / len(DEPLOYMENT_REPLICAS),
            "Job": sum(JOB_PARALLELISM) / len(JOB_PARALLELISM), "Pod": 1.0}
    by_units = [KIND_SHARE[k] / mean[k] for k in KIND_SHARE]  # the pods' shares, per unit
    while left > 0:
        kind = rng.choices(list(KIND_SHARE), by_units)[0]
        size = {"Deployment": rng.choice(DEPLOYMENT_REPLICAS),
                "Job": rng.choice(JOB_PARALLELISM), "Pod": 1}[kind]
        size = min(size, left)
        shape = rng.choices(SHAPES, weights)[0]
        ns = NAMESPACE_OF[shape.namespace]
        # (no override there: neither namespace's policy allows one)
        if kind == "Job" and rng.random() < 0.5 and not shape.overrides:
            ns = NS_BATCH
        elif kind == "Pod" and rng.random() < 0.25 and not shape.overrides:
            ns = NS_PLAIN
        prefix = {"Deployment": "dep", "Job": "job", "Pod": "pod"}[kind]
        out.append(Unit(kind, f"{prefix}-{count[kind]:05d}", ns, size, shape))
        count[kind] += 1
        left -= size
    return out


def bursts(all_units: list[Unit], burst: int) -> list[list[Unit]]:
    """Consecutive units of about BURST pods each."""
    out: list[list[Unit]] = [[]]
    size = 0
    for u in all_units:
        if size >= burst:
            out.append([])
            size = 0
        out[-1].append(u)
        size += u.pods
    return [b for b in out if b]
