"""Placement with DRA claims: the same workload with and without the scheduler extender
(``python bench/run.py placement --dra``).

Each half starts its own local control plane (kube-scheduler v1.37 allocates the claims),
one agent process emulating NODES nodes whose machine-file devices are ResourceSlices of
the emulated DRA driver (``--dra``: at least a third of the nodes have GPUs), the
DeviceClasses of those devices, and the operator (policy resolution, the
``numa-constraint`` claim webhook, the redeploy of rejected bare pods). PODS pods are
created in bursts under the placement bench's mixed policies (bench/placement_workload.py:
single-numa-node/pod, restricted/container, best-effort with overrides); about half ask
for GPUs through ResourceClaimTemplates (one or two GPUs) besides exclusive CPUs.

Reported per half as bench/bench_placement.py does (TopologyAffinityErrors per 1,000
pods, chains Running/Pending/Failed, create-to-Running, the extender's filter p50/p99),
and, in-process in the same run, the cost of the extender's decision for a pod with
claims against the same pod without them (a cold filter over the same nodes: every
node decided afresh).

    python bench/run.py placement --dra [--nodes=30 --pods=300] [--modes=with]
    python bench/bench_placement_dra.py --nodes 30 --pods 300
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_agent import pct
from bench_placement import (
    MODES,
    Extender,
    add_run_args,
    chosen_modes,
    paired,
    print_half,
    report,
)
from bench_placement import run_half as placement_half
from numalign.api import draemulated as de
from numalign.api.kube import Kube
from numalign.api.names import ANN_POLICY, ANN_RESOLVED, ANN_SCOPE
from numalign.api.resolved import Resolved
from numalign.topology.machine import load_machine
from placement_workload import (
    NAMESPACES,
    NS_BE,
    NS_RESTRICTED,
    NS_SNN,
    SAMPLES,
    Shape,
)
from placement_workload import pod_manifest as placement_pod

# GPU machines (DRA GPUs) are 45 % of the nodes
DRA_WEIGHTS = {"fragmented-8numa": 30, "dual-16core": 25, "group4-gpu": 15,
               "dgx-a100-like": 15, "seed-figure1": 15}
GPU = de.device_class_name("nvidia.com/gpu")
VENDOR_GPU = de.device_class_name("gpu-vendor.com/gpu")
TEMPLATES = {"gpu-1": (GPU, 1), "gpu-2": (GPU, 2), "vgpu-1": (VENDOR_GPU, 1)}
POLICY_OF = {NS_SNN: ("single-numa-node", "pod"), NS_RESTRICTED: ("restricted", "container"),
             NS_BE: ("best-effort", "container")}


@dataclass(frozen=True)
class DraShape:
    shape: Shape
    template: str | None = None  # ResourceClaimTemplate of its one claim


SHAPES = (
    DraShape(Shape("snn-4cpu", 4, NS_SNN, "4", "4Gi")),
    DraShape(Shape("snn-gpu", 3, NS_SNN, "2", "2Gi"), "gpu-1"),
    DraShape(Shape("snn-2gpu", 2, NS_SNN, "4", "2Gi"), "gpu-2"),
    DraShape(Shape("snn-vendor-gpu", 1, NS_SNN, "2", "1Gi"), "vgpu-1"),
    DraShape(Shape("restricted-8cpu", 1, NS_RESTRICTED, "8", "8Gi")),
    DraShape(Shape("restricted-gpu", 2, NS_RESTRICTED, "3", "4Gi"), "gpu-1"),
    DraShape(Shape("restricted-small", 3, NS_RESTRICTED, "100m", "64Mi", guaranteed=False)),
    DraShape(Shape("be-2gpu", 2, NS_BE, "3", "2Gi"), "gpu-2"),
    DraShape(Shape("be-small", 8, NS_BE, "100m", "64Mi", guaranteed=False)),
    DraShape(Shape("be-to-snn-gpu", 2, NS_BE, "3", "2Gi", overrides=(
        (ANN_POLICY, "single-numa-node"), (ANN_SCOPE, "pod"))), "gpu-1"),
)


def node_mix(nodes: int) -> list[tuple[Path, int]]:
    total = sum(DRA_WEIGHTS.values())
    counts = {k: nodes * w // total for k, w in DRA_WEIGHTS.items()}
    for k in sorted(DRA_WEIGHTS, key=lambda k: -DRA_WEIGHTS[k]):
        if sum(counts.values()) >= nodes:
            break
        counts[k] += 1
    return [(SAMPLES / f"{k}.yaml", c) for k, c in counts.items() if c]


def templates() -> list[dict[str, Any]]:
    return [{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
             "metadata": {"name": name, "namespace": ns},
             "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": cls, "count": count}}]}}}}
            for ns in NAMESPACES for name, (cls, count) in TEMPLATES.items()]


def pod_manifest(index: int, s: DraShape) -> dict[str, Any]:
    """The placement bench's pod of the shape, its one claim (if any) from its template."""
    pod = placement_pod(index, s.shape)
    if s.template:
        pod["spec"]["resourceClaims"] = [{"name": "gpus",
                                          "resourceClaimTemplateName": s.template}]
        pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpus"}]
    return pod


def workload(pods: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    weights = [s.shape.weight for s in SHAPES]
    return [pod_manifest(i, rng.choices(SHAPES, weights)[0]) for i in range(pods)]


# ---------------------------------------------------------------- in-process cost


def resolved_pod(m: dict[str, Any], uid: str) -> dict[str, Any]:
    """The manifest as the operator's webhook leaves it (its resolved policy)."""
    pod = copy.deepcopy(m)
    meta = pod["metadata"]
    ann = meta.get("annotations") or {}
    policy, scope = POLICY_OF[meta["namespace"]]
    policy, scope = ann.get(ANN_POLICY, policy), ann.get(ANN_SCOPE, scope)
    meta["annotations"] = {**ann, ANN_RESOLVED: Resolved(policy, scope, source="pod")
                           .annotation()}
    meta["uid"] = uid
    return pod


def claim_of(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The claim generated for the pod from its template, as the cluster has it (with the
    numa-constraint webhook's constraint for a single-numa-node pod), the pod's status
    pointing at it; None for a pod without claims."""
    from numalign.api.resolved import parse_resolved
    from numalign.controller.claims import constraint_for

    refs = pod["spec"].get("resourceClaims")
    if not refs:
        return None
    meta = pod["metadata"]
    (ref,) = refs
    name = f"{meta['name']}-{ref['name']}"
    cls, count = TEMPLATES[ref["resourceClaimTemplateName"]]
    obj: dict[str, Any] = {"metadata": {"name": name, "namespace": meta["namespace"]},
                           "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                               "deviceClassName": cls, "count": count}}]}}}
    if parse_resolved(meta["annotations"][ANN_RESOLVED]).policy == "single-numa-node":
        obj["spec"]["devices"]["constraints"] = constraint_for(obj)
    pod["status"] = {"resourceClaimStatuses": [{"name": ref["name"],
                                                "resourceClaimName": name}]}
    return obj


def generated(cat: Any, pod: dict[str, Any]) -> dict[str, Any]:
    """The pod once its claim is generated from its template (:func:`claim_of`), the
    claim fed to ``cat``."""
    claim = claim_of(pod)
    if claim is not None:
        cat.event("resourceclaims", "ADDED", claim)
    return pod


def without_claims(pod: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    out["spec"].pop("resourceClaims", None)
    out.pop("status", None)
    for c in out["spec"]["containers"]:
        c["resources"].pop("claims", None)
    return out


def decision_cost(nodes: int, pods: int, seed: int) -> dict[str, Any]:
    """A cold filter (every node decided afresh) of each pod with claims over the nodes,
    and of the same pod without its claims; each pod's claim generated as the cluster
    generates it (single-numa-node pods' with the numa-constraint webhook's constraint)."""
    from numalign.agent.publish import build_status
    from numalign.agent.state import NodeState
    from numalign.extender.decide import Decider
    from numalign.extender.dra import DraCatalog

    cat = DraCatalog()
    decider = Decider(dra=cat)
    slices: list[dict[str, Any]] = []
    resources: set[str] = set()
    names: list[str] = []
    for f, count in node_mix(nodes):
        machine = load_machine(f)
        resources |= {d.resource for d in machine.devices}
        for i in range(count):
            name = f"{machine.name}-{i}"
            names.append(name)
            st = NodeState(name, machine)
            decider.update({"metadata": {"name": name, "resourceVersion": "1"},
                            "spec": {}, "status": build_status(st)})
            slices += de.resource_slices(machine, name)
    cat.load("deviceclasses", de.device_classes(resources))
    cat.load("resourceslices", slices)
    cat.load("resourceclaims", [])
    cat.load("resourceclaimtemplates", templates())
    with_c: list[float] = []
    without_c: list[float] = []
    refused = {"with": 0, "without": 0}
    ms = [m for m in workload(pods * 4, seed) if m["spec"].get("resourceClaims")][:pods]
    for i, m in enumerate(ms):
        pod = generated(cat, resolved_pod(m, f"uid-{i}"))
        for key, p, acc in (("with", pod, with_c), ("without", without_claims(pod),
                                                      without_c)):
            decider._cache.clear()  # cold: every node decided afresh
            t0 = time.perf_counter()
            verdicts = decider.filter(p, names)
            acc.append(1000 * (time.perf_counter() - t0))
            refused[key] += sum(1 for v in verdicts if not v.fits)
    out: dict[str, Any] = {"nodes": len(names), "pods_with_claims": len(ms)}
    for key, acc in (("with", with_c), ("without", without_c)):
        out[f"{key}_claims_p50_ms"] = round(pct(acc, 50), 2)
        out[f"{key}_claims_p99_ms"] = round(pct(acc, 99), 2)
        out[f"{key}_claims_per_node_us"] = round(1000 * sum(acc) / max(
            len(acc) * len(names), 1), 1)
        out[f"{key}_claims_nodes_refused"] = refused[key]
    out["ratio_p50"] = round(out["with_claims_p50_ms"] / max(out["without_claims_p50_ms"],
                                                             1e-9), 2)
    return out


def describe_cost(cost: dict[str, Any]) -> str:
    """decision_cost's figures in one line."""
    def side(key: str) -> str:
        return (f"p50 {cost[key + '_p50_ms']} ms, p99 {cost[key + '_p99_ms']} ms "
                f"({cost[key + '_per_node_us']} us per node)")

    return (f"in-process cold filter over {cost['nodes']} DRA nodes, "
            f"{cost['pods_with_claims']} pods with claims: {side('with_claims')}; the same "
            f"pods without claims: {side('without_claims')}; {cost['ratio_p50']}x at p50")


def inprocess_bursts(nodes: int, pods: int, seed: int) -> dict[str, Any]:
    """The in-process bursts (:mod:`placement_dra_inprocess`) with the extender's room
    check and deferral and, as the baseline in the same run, deciding every way the pods
    in flight may land on every node; printed, and returned with the ratios of the
    filter's CPU time."""
    from placement_dra_inprocess import dra_scheduler

    out: dict[str, Any] = {}
    for key, room in (("every_way", False), ("room_check", True)):
        r = dra_scheduler(nodes, pods, seed, room_check=room, defer=room)
        out[key] = r
        print(f"in-process bursts ({key.replace('_', ' ')}): {r['nodes']} nodes, {r['pods']} "
              f"pods, {r['admitted']} admitted, {r['refused_by_node']} refused by their node "
              f"after approval, {r['no_node']} with no node, {r['retries']} retries; filter "
              f"CPU p50 {r['filter_cpu_p50_ms']} ms, p99 {r['filter_cpu_p99_ms']} ms (wall p99 "
              f"{r['filter_p99_ms']} ms), engine runs per filter p99 "
              f"{r['engine_runs_per_filter_p99']}", flush=True)
    for q in (50, 99):
        out[f"ratio_cpu_p{q}"] = round(out["room_check"][f"filter_cpu_p{q}_ms"] / max(
            out["every_way"][f"filter_cpu_p{q}_ms"], 1e-9), 2)
    print(f"room check against every way: filter CPU p50 x{out['ratio_cpu_p50']}, "
          f"p99 x{out['ratio_cpu_p99']}", flush=True)
    return out


# ---------------------------------------------------------------- the cluster


async def run_half(mode: str, cluster: Any, nodes: int, manifests: list[dict[str, Any]],
                   args: argparse.Namespace, workdir: Path,
                   extender: Extender | None) -> dict[str, Any]:
    """The placement bench's half (bench_placement.run_half) on DRA nodes: their
    DeviceClasses first, the agent publishing ResourceSlices, the ResourceClaimTemplates
    after the policies."""
    from numalign.devcluster.dra import install_device_classes

    mix = node_mix(nodes)
    install_device_classes(cluster.kube(), [f for f, _ in mix], lambda m: None)

    async def create_templates(kube: Kube) -> None:
        for t in templates():
            await kube.create(f"/apis/resource.k8s.io/v1/namespaces/"
                              f"{t['metadata']['namespace']}/resourceclaimtemplates", t)

    result = await placement_half(mode, str(cluster.kubeconfig), nodes, manifests, args,
                                  workdir, extender, mix=mix, log_prefix="dra-",
                                  agent_flags=("--dra",), after_policies=create_templates)
    result["pods_with_claims"] = sum(1 for m in manifests if m["spec"].get("resourceClaims"))
    return result


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench_placement_dra")
    p.add_argument("--dra", action="store_true", help="(bench/run.py placement --dra)")
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--pods", type=int, default=1000)
    add_run_args(p, burst=100, gap=3.0, seed=28, modes="without,with")
    p.add_argument("--cost-pods", type=int, default=200,
                   help="pods with claims of the in-process decision cost (0: skip it)")
    p.add_argument("--inprocess-pods", type=int, default=300,
                   help="pods of the in-process bursts (placement_dra_inprocess; 0: skip)")
    p.add_argument("--timeout", type=float, default=900.0)
    args, _ = p.parse_known_args(argv)
    modes = chosen_modes(p, args.modes, MODES)
    cost: dict[str, Any] = {}
    if args.cost_pods:
        cost = decision_cost(args.nodes, args.cost_pods, args.seed)
        print(describe_cost(cost), flush=True)
    if args.inprocess_pods:
        cost["bursts"] = inprocess_bursts(args.nodes, args.inprocess_pods, args.seed)
    manifests = workload(args.pods, args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="numalign-bench-placement-dra-"))
    halves: dict[str, dict[str, Any]] = {}
    from numalign.devcluster.cluster import DevCluster

    for mode in modes:
        on = mode == "with"
        cluster = DevCluster(state_dir=workdir / f"dra-{mode}-cluster")
        cluster.up(scheduler_extender=on, extender=on,
                   log=lambda m, mode=mode: print(f"[devcluster {mode}] {m}", file=sys.stderr))
        url = cluster.extender_probe_url
        extender = Extender(f"{url}/metrics") if on and url else None
        try:
            halves[mode] = asyncio.run(run_half(mode, cluster, args.nodes, manifests, args,
                                                workdir, extender))
        finally:
            cluster.down()
        print(f"[{halves[mode]['pods_with_claims']} of the pods ask for GPUs by claim]")
        print_half(halves[mode])
    both = paired(halves)
    return report(halves, workdir, {**both, "decision_cost": cost})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
