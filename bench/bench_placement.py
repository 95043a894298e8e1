"""Placement before binding: the same workload with and without the scheduler extender.

Each half starts its own local control plane, one agent process emulating NODES nodes
(a mix of the sample machines in config/samples/machines, most of them fragmented or
with GPUs) and the operator (webhooks: policy resolution at creation; redeploy of
rejected pods, bare pods recreated). PODS bare pods are then created in bursts, under
mixed policies: three namespaces with their own TopologyPolicy (single-numa-node/pod,
restricted/container, best-effort with pod overrides allowed) and pods that override
the namespace's policy by annotation. The workload is drawn from a seed: both halves
create the same pods, with the same names, in the same order.

A pod and its replacements (``NAME-r1``, ``NAME-r2``: the redeploy of a rejected bare
pod) are one *chain*. Reported per half:

* ``TopologyAffinityError``s per 1,000 pods created (pods seen Failed with that reason,
  replacements included, over the pods the bench created);
* chains Running / Pending / Failed at the end (when every chain runs, or nothing has
  changed for SETTLE seconds);
* create-to-Running p50/p99: from the create call of a chain's first pod to the first
  pod of the chain seen Running; also over the chains Running in both halves (paired);
* with the extender: its filter latency p50/p99 (from its /metrics histogram).

Apart from the cluster, the in-process filter is timed over 1,000 synthetic nodes (nodes
of the fixture machines with random allocations already held, published as NodeTopology),
and the extender's filter and prioritize as the scheduler calls them (JSON in and out,
reservations and pods in flight counted, nodes publishing late) over the --nodes nodes,
and a pod shape's first filter over 1,000 and 5,000 synthetic nodes (pass or refuse,
nodes alike sharing one decision: numalign.extender.feasible), the same pod's verdicts
completed as prioritize asks them (every node's allocation and score: the filter before
the fast verdict) and a baseline, every node decided afresh, all three in the same run
and giving the same pass, refusal, reason and message on every node. The workload is
bench/placement_workload.py's, the in-process half bench/placement_inprocess.py's.

    python bench/run.py placement --modes= --synthetic-nodes=0   # only the latter
    python bench/run.py placement --cold-only   # first filter of a shape, 1,000/5,000 nodes

    python bench/run.py placement [--quick]   # 100 nodes, 2,000 pods (quick: 12 / 200)
    python bench/run.py placement --dra       # pods with DRA claims: bench_placement_dra.py
    python bench/run.py placement --nodes=20 --pods=300 --modes=without
    python bench/bench_placement.py --nodes 20 --pods 300 --burst 50

(``bench/run.py`` passes on only the arguments that start with a dash: give values with
``=`` there.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from bench_agent import agent_argv, pct, stop, wait_nodes
from bench_operator import _free_port, _webhook_ready
from numalign.api.kube import ApiError, Kube, load_config
from numalign.api.names import ANN_RESOLVED, REJECT_REASON
from numalign.topology.machine import load_machine
from placement_inprocess import cold_filter, inprocess_filter, scheduler_lines
from placement_workload import LABEL, NAMESPACES, node_mix, policies, workload

MODES = ("without", "with")

CHAIN = re.compile(r"-r\d+$")


def chain_of(name: str) -> str:
    return CHAIN.sub("", name)


@dataclass
class Observed:
    """What the pod watch saw, by chain (the first pod's name)."""

    created: dict[str, float] = field(default_factory=dict)  # chain -> create call
    running: dict[str, float] = field(default_factory=dict)  # chain -> first seen Running
    bound: dict[str, float] = field(default_factory=dict)  # chain -> first seen bound
    latest: dict[str, tuple[str, str]] = field(default_factory=dict)  # chain -> (pod, phase)
    rejected: set[str] = field(default_factory=set)  # pod uids seen TopologyAffinityError
    rejected_chains: set[str] = field(default_factory=set)  # their chains
    other_failed: dict[str, str] = field(default_factory=dict)  # uid -> reason
    policies: dict[str, str] = field(default_factory=dict)  # uid -> resolved policy
    placed: dict[str, str] = field(default_factory=dict)  # uid -> node
    # uid -> the pod as first seen rejected (written beside the logs, for a look)
    rejected_pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    last_event: float = field(default_factory=time.monotonic)

    def on_pod(self, obj: dict[str, Any], now: float) -> None:
        meta = obj.get("metadata") or {}
        if (meta.get("labels") or {}).get(LABEL) != "placement":
            return
        self.last_event = now
        name, uid = str(meta.get("name")), str(meta.get("uid"))
        chain = chain_of(name)
        resolved = (meta.get("annotations") or {}).get(ANN_RESOLVED)
        if resolved and uid not in self.policies:
            with contextlib.suppress(ValueError, AttributeError):
                self.policies[uid] = str(json.loads(resolved).get("policy"))
        node = (obj.get("spec") or {}).get("nodeName")
        if node:
            self.placed[uid] = str(node)
            self.bound.setdefault(chain, now)
        status = obj.get("status") or {}
        phase = str(status.get("phase") or "Pending")
        prev = self.latest.get(chain)
        if prev is None or _attempt(name) >= _attempt(prev[0]):
            self.latest[chain] = (name, phase)
        if phase == "Running":
            self.running.setdefault(chain, now)
        elif phase == "Failed":
            if status.get("reason") == REJECT_REASON:
                self.rejected.add(uid)
                self.rejected_chains.add(chain)
                self.rejected_pods.setdefault(uid, obj)
            else:
                self.other_failed[uid] = str(status.get("reason"))

    def settled(self, quiet: float) -> bool:
        if self.created and len(self.running) >= len(self.created):
            return True
        return time.monotonic() - self.last_event >= quiet


def _attempt(name: str) -> int:
    m = re.search(r"-r(\d+)$", name)
    return int(m.group(1)) if m else 0


async def watch_all_pods(kube: Kube, rv: str, on_pod: Callable[[dict[str, Any], float], None],
                         done: Callable[[], bool]) -> None:
    """Every labelled pod event of the cluster from ``rv`` on until ``done()``."""
    while not done():
        async for ev in kube.watch("/api/v1/pods", {"resourceVersion": rv,
                                                    "labelSelector": LABEL}):
            obj = ev.get("object") or {}
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
            if ev.get("type") in ("ADDED", "MODIFIED"):
                on_pod(obj, time.monotonic())
            if done():
                return


async def create_in_bursts(kube: Kube, manifests: list[dict[str, Any]], burst: int,
                           gap: float, seen: Observed) -> None:
    """BURST pods at once (16 requests in flight), then GAP seconds, until all are made."""
    sem = asyncio.Semaphore(16)

    async def one(m: dict[str, Any]) -> None:
        async with sem:
            name = m["metadata"]["name"]
            seen.created[name] = time.monotonic()
            await kube.create(f"/api/v1/namespaces/{m['metadata']['namespace']}/pods", m)

    for i in range(0, len(manifests), burst):
        await asyncio.gather(*(one(m) for m in manifests[i:i + burst]))
        if i + burst < len(manifests):
            await asyncio.sleep(gap)


async def wait_nodetopologies(kube: Kube, names: set[str], timeout: float) -> None:
    """Every node has published its NodeTopology (zones): neither half starts with
    nodes the extender cannot judge."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items, _ = await kube.list_all("/apis/numalign.io/v1alpha1/nodetopologies")
        have = {str(i["metadata"]["name"]) for i in items
                if ((i.get("status") or {}).get("zones"))}
        if names <= have:
            return
        await asyncio.sleep(1)
    raise TimeoutError(f"NodeTopology not published for every node after {timeout}s")


async def nodetopology_rejected(kube: Kube) -> int:
    """The agents' own count of TopologyAffinityErrors (status.rejected, all nodes)."""
    items, _ = await kube.list_all("/apis/numalign.io/v1alpha1/nodetopologies")
    return sum(int((i.get("status") or {}).get("rejected") or 0) for i in items)


async def prepare_cluster(kube: Kube, names: set[str], extender: Extender | None, *,
                          namespaces: Iterable[str], policies: Iterable[dict[str, Any]],
                          nodes_timeout: float = 300.0,
                          webhook_timeout: float = 180.0) -> float:
    """Wait for every node, its NodeTopology, the operator's webhook and the extender (if
    any), then create the namespaces (kept if there) and the TopologyPolicies. Returns the
    seconds the wait took."""
    t0 = time.monotonic()
    await wait_nodes(kube, names, nodes_timeout)
    await wait_nodetopologies(kube, names, nodes_timeout)
    await _webhook_ready(kube, webhook_timeout)
    if extender is not None:
        await extender.ready(kube, 180)
    setup_s = round(time.monotonic() - t0, 1)
    for ns in namespaces:
        with contextlib.suppress(ApiError):
            await kube.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    for tp in policies:
        await kube.create("/apis/numalign.io/v1alpha1/topologypolicies", tp)
    return setup_s


async def run_half(mode: str, kubeconfig: str, nodes: int, manifests: list[dict[str, Any]],
                   args: argparse.Namespace, workdir: Path, extender: Extender | None, *,
                   mix: list[tuple[Path, int]] | None = None, log_prefix: str = "",
                   agent_flags: Sequence[str] = (),
                   after_policies: Callable[[Kube], Awaitable[None]] | None = None
                   ) -> dict[str, Any]:
    """One half: the agent (emulating MIX, by default the workload's mix of NODES nodes;
    AGENT_FLAGS added) and the operator, the namespaces and policies (then AFTER_POLICIES'
    objects), the pods in bursts, watched until they settle. Logs and certificates in
    WORKDIR, named LOG_PREFIX + MODE."""
    mix = node_mix(nodes) if mix is None else mix
    names = {f"{load_machine(f).name}-{i}" for f, c in mix for i in range(c)}
    logs: list[Any] = []

    def start(name: str, cmd: list[str]) -> subprocess.Popen[bytes]:
        out = (workdir / f"{log_prefix}{mode}-{name}.log").open("ab")
        logs.append(out)
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)

    agent = start("agent", [*agent_argv(kubeconfig, mix, "WARNING"), *agent_flags])
    operator = start("operator", [
        sys.executable, "-m", "numalign.cli", "operator", "--kubeconfig", kubeconfig,
        "--metrics-port", "0", "--recreate-bare-pods", "--webhook-port", str(_free_port()),
        "--cert-dir", str(workdir / f"{log_prefix}{mode}-certs")])
    kube = Kube(load_config(kubeconfig), max_connections=24)
    await kube.open()
    result: dict[str, Any] = {"mode": mode, "nodes": nodes, "pods": len(manifests),
                              "machines": {load_machine(f).name: c for f, c in mix}}
    try:
        result["setup_s"] = await prepare_cluster(kube, names, extender,
                                                  namespaces=NAMESPACES, policies=policies())
        if after_policies is not None:
            await after_policies(kube)
        await asyncio.sleep(2.0)  # the operator's caches and webhook see the policies
        seen = Observed()
        _, rv = await kube.list_all("/api/v1/pods", {"labelSelector": LABEL})
        finished = asyncio.Event()
        watcher = asyncio.create_task(watch_all_pods(kube, rv, seen.on_pod, finished.is_set))
        start_t = time.monotonic()
        await create_in_bursts(kube, manifests, args.burst, args.gap, seen)
        result["create_s"] = round(time.monotonic() - start_t, 1)
        seen.last_event = time.monotonic()
        deadline = start_t + args.timeout
        while not seen.settled(args.settle) and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
        result["timed_out"] = not seen.settled(args.settle)
        result["settled_s"] = round(time.monotonic() - start_t, 1)
        finished.set()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        result.update(summarize(seen, len(manifests)))
        (workdir / f"{log_prefix}{mode}-rejected.json").write_text(
            json.dumps(list(seen.rejected_pods.values()), indent=1))
        result["nodetopology_rejected"] = await nodetopology_rejected(kube)
        if extender is not None:
            result.update(await extender.latency())
        result["operator_alive"] = operator.poll() is None
        result["agent_alive"] = agent.poll() is None
    finally:
        await kube.close()
        for proc in (operator, agent):
            stop(proc)
        for out in logs:
            out.close()
    return result


def summarize(seen: Observed, created: int) -> dict[str, Any]:
    lat = [seen.running[c] - seen.created[c] for c in seen.running if c in seen.created]
    final = {"Running": 0, "Pending": 0, "Failed": 0}
    for chain in seen.created:
        if chain in seen.running:
            final["Running"] += 1
            continue
        phase = seen.latest.get(chain, ("", "Pending"))[1]
        final["Failed" if phase == "Failed" else "Pending"] += 1
    return {
        "topology_affinity_errors": len(seen.rejected),
        "tae_per_1000_pods": round(1000 * len(seen.rejected) / max(created, 1), 2),
        "other_failures": len(seen.other_failed),
        "chains_running": final["Running"], "chains_pending": final["Pending"],
        "chains_failed": final["Failed"],
        "resolved_policies": dict(sorted(Counter(seen.policies.values()).items())),
        "bound_by_machine": dict(sorted(Counter(
            CHAIN.sub("", n).rsplit("-", 1)[0] for n in seen.placed.values()).items())),
        "create_to_running_p50_s": round(pct(lat, 50), 3),
        "create_to_running_p99_s": round(pct(lat, 99), 3),
        # the chains a node rejected (their replacements ran, or not)
        "rejected_chains_running": len(seen.rejected_chains & set(seen.running)),
        **{f"rejected_create_to_running_p{p}_s": round(pct(
            [seen.running[c] - seen.created[c] for c in seen.rejected_chains
             if c in seen.running and c in seen.created], p), 3) for p in (50, 99)},
        **{f"create_to_bound_p{p}_s": round(pct(
            [seen.bound[c] - seen.created[c] for c in seen.bound if c in seen.created], p), 3)
           for p in (50, 99)},
        "_running_latency": {c: seen.running[c] - seen.created[c]
                             for c in seen.running if c in seen.created},
    }


class Extender:
    """The extender side of the "with" half: set up by the dev cluster, read back through
    its /metrics."""

    def __init__(self, metrics_url: str) -> None:
        self.metrics_url = metrics_url

    async def ready(self, kube: Kube, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if await asyncio.to_thread(_http_get, self.metrics_url):
                    return
            await asyncio.sleep(0.5)
        raise TimeoutError(f"the extender's metrics at {self.metrics_url} did not answer")

    async def latency(self) -> dict[str, Any]:
        text = await asyncio.to_thread(_http_get, self.metrics_url)
        samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]
        out: dict[str, Any] = {}
        for verb, metric in (("filter", FILTER_METRIC), ("prioritize", PRIORITIZE_METRIC)):
            buckets = histogram(samples, metric)
            calls = buckets[-1][1] if buckets else 0.0
            total = sum(s.value for s in samples if s.name == f"{metric}_sum")
            out[f"extender_{verb}_calls"] = int(calls)
            out[f"extender_{verb}_mean_ms"] = round(1000 * total / calls, 2) if calls else None
            for p in (50, 99):
                out[f"extender_{verb}_p{p}_ms"] = round(1000 * bucket_quantile(buckets, p), 2)
            decide = histogram(samples, DECIDE_METRIC, {"verb": verb})
            cpu = histogram(samples, DECIDE_CPU_METRIC, {"verb": verb})
            for p in (50, 99):  # the decision alone, within the call; its CPU time
                out[f"extender_{verb}_decide_p{p}_ms"] = round(
                    1000 * bucket_quantile(decide, p), 2)
                if cpu:
                    out[f"extender_{verb}_decide_cpu_p{p}_ms"] = round(
                        1000 * bucket_quantile(cpu, p), 2)
        out["extender_pod_reads"] = int(sum(
            s.value for s in samples if s.name == "numalign_extender_pod_reads"))
        out["extender_binds"] = {
            s.labels["outcome"]: int(s.value) for s in samples
            if s.name == "numalign_extender_binds_total"}
        out["extender_bind_turns_missed"] = int(sum(
            s.value for s in samples if s.name == "numalign_extender_bind_turns_missed_total"))
        out["extender_refusals"] = {
            s.labels["reason"]: int(s.value) for s in samples
            if s.name == "numalign_extender_refusals_total"}
        return out


FILTER_METRIC = "numalign_extender_filter_duration_seconds"
PRIORITIZE_METRIC = "numalign_extender_prioritize_duration_seconds"
DECIDE_METRIC = "numalign_extender_decide_duration_seconds"
DECIDE_CPU_METRIC = "numalign_extender_decide_cpu_seconds"


def _http_get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def histogram(samples: list[Sample], metric: str,
              labels: dict[str, str] | None = None) -> list[tuple[float, float]]:
    """The cumulative buckets (upper bound, count) of a Prometheus histogram, summed over
    its label sets (those with ``labels``, when given)."""
    acc: dict[float, float] = {}
    for s in samples:
        if s.name == f"{metric}_bucket" and all(
                s.labels.get(k) == v for k, v in (labels or {}).items()):
            le = float(s.labels["le"])  # "+Inf" reads as inf
            acc[le] = acc.get(le, 0.0) + s.value
    return sorted(acc.items())


def bucket_quantile(buckets: list[tuple[float, float]], p: float) -> float:
    """Prometheus' histogram_quantile: linear within the bucket that holds the rank."""
    if not buckets or buckets[-1][1] <= 0:
        return float("nan")
    rank = p / 100 * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower
            if count == below:
                return le
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return lower


def paired(halves: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Create-to-Running over the chains that run in both halves."""
    if not all(m in halves for m in MODES):
        return {}
    a, b = (halves[m]["_running_latency"] for m in MODES)
    common = sorted(set(a) & set(b))
    out: dict[str, Any] = {"paired_chains": len(common)}
    for m, lat in zip(MODES, (a, b), strict=True):
        vals = [lat[c] for c in common]
        for p in (50, 99):
            out[f"paired_{m}_p{p}_s"] = round(pct(vals, p), 3)
    return out


def start_cluster(mode: str, workdir: Path) -> tuple[Any, str, Extender | None]:
    """A fresh control plane; "with": kube-scheduler configured with numalign's extender,
    and the extender running (as ``numalign dev up`` does by default)."""
    from numalign.devcluster.cluster import DevCluster

    cluster = DevCluster(state_dir=workdir / f"{mode}-cluster")
    on = mode == "with"
    cluster.up(scheduler_extender=on, extender=on,
               log=lambda m: print(f"[devcluster {mode}] {m}", file=sys.stderr))
    # /metrics on the extender's probe port (plain HTTP; its verbs are HTTPS and answer
    # kube-scheduler's client certificate only)
    url = cluster.extender_probe_url
    if on and url is None:
        raise SystemExit("the dev cluster did not configure the scheduler extender")
    return cluster, str(cluster.kubeconfig), Extender(f"{url}/metrics") if on else None


def print_half(r: dict[str, Any]) -> None:
    print(f"{r['mode']} the extender: {r['nodes']} nodes {r['machines']}, {r['pods']} pods "
          f"(created in {r['create_s']} s, settled after {r['settled_s']} s"
          f"{', TIMED OUT' if r['timed_out'] else ''})")
    print(f"  TopologyAffinityError  {r['topology_affinity_errors']} "
          f"({r['tae_per_1000_pods']} per 1,000 pods; the agents count "
          f"{r['nodetopology_rejected']}); other failures {r['other_failures']}")
    print(f"  at the end             {r['chains_running']} Running, {r['chains_pending']} "
          f"Pending, {r['chains_failed']} Failed (pods with their replacements)")
    print(f"  pods by policy         {r['resolved_policies']}; bound by machine "
          f"{r['bound_by_machine']}")
    print(f"  create -> Running      p50 {r['create_to_running_p50_s']} s, "
          f"p99 {r['create_to_running_p99_s']} s (create -> bound p50 "
          f"{r['create_to_bound_p50_s']} s, p99 {r['create_to_bound_p99_s']} s)")
    if r["rejected_chains_running"]:
        print(f"  rejected, then Running {r['rejected_chains_running']} pods: create -> Running "
              f"p50 {r['rejected_create_to_running_p50_s']} s, p99 "
              f"{r['rejected_create_to_running_p99_s']} s")
    if "extender_filter_p99_ms" in r:
        print(f"  extender filter        p50 {r['extender_filter_p50_ms']} ms, p99 "
              f"{r['extender_filter_p99_ms']} ms, mean {r['extender_filter_mean_ms']} ms "
              f"({r['extender_filter_calls']} calls; from its histogram); "
              f"prioritize p50 {r['extender_prioritize_p50_ms']} ms, p99 "
              f"{r['extender_prioritize_p99_ms']} ms")
        print_decision(r, "  extender decision      ")
        print(f"  extender refusals      {r['extender_refusals']} (nodes refused, by reason); "
              f"binds {r['extender_binds']}, {r['extender_bind_turns_missed']} posted "
              f"without waiting for their node's previous one")


def print_decision(r: dict[str, Any], head: str) -> None:
    """The extender's decision within its calls (its wall and CPU time), from
    :meth:`Extender.latency`, each line starting with ``head``."""
    print(f"{head}filter p50 {r['extender_filter_decide_p50_ms']} ms, p99 "
          f"{r['extender_filter_decide_p99_ms']} ms, prioritize p50 "
          f"{r['extender_prioritize_decide_p50_ms']} ms, p99 "
          f"{r['extender_prioritize_decide_p99_ms']} ms (the rest of a call: its body, the pod, "
          f"{r['extender_pod_reads']} read from the API server, the event loop)")
    if "extender_filter_decide_cpu_p99_ms" in r:
        print(f"{head}CPU filter p50 {r['extender_filter_decide_cpu_p50_ms']} ms, p99 "
              f"{r['extender_filter_decide_cpu_p99_ms']} ms (the rest of the decision's time: "
              f"waiting for a core)")


def add_run_args(p: argparse.ArgumentParser, *, burst: int, gap: float, seed: int,
                 modes: str, modes_help: str = "which halves, comma-separated: without, with"
                 ) -> None:
    """The options of a cluster run: bursts, its end, the workload's seed, the modes."""
    p.add_argument("--burst", type=int, default=burst, help="pods per burst")
    p.add_argument("--gap", type=float, default=gap, help="seconds between bursts")
    p.add_argument("--settle", type=float, default=30.0,
                   help="the end: this long without a pod change")
    p.add_argument("--seed", type=int, default=seed)
    p.add_argument("--modes", default=modes, help=modes_help)


def chosen_modes(p: argparse.ArgumentParser, text: str, known: Sequence[str]) -> list[str]:
    """--modes' comma-separated list; an unknown mode is a usage error."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if bad := [m for m in modes if m not in known]:
        p.error(f"--modes: unknown {bad}; known: {', '.join(known)}")
    return modes


def report(halves: dict[str, dict[str, Any]], workdir: Path, extra: dict[str, Any]) -> int:
    """Where the logs are, the halves (their private keys left out) and EXTRA as one JSON
    line; 0 when every half settled with its operator and agent alive."""
    print(f"logs in {workdir}")
    out = {m: {k: v for k, v in r.items() if not k.startswith("_")} for m, r in halves.items()}
    print(json.dumps({**out, **extra}))
    return 0 if all(not r["timed_out"] and r["operator_alive"] and r["agent_alive"]
                    for r in halves.values()) else 1


def main(argv: list[str]) -> int:
    if "--dra" in argv:  # the DRA workload: bench/bench_placement_dra.py
        from bench_placement_dra import main as dra_main

        return dra_main(argv)
    p = argparse.ArgumentParser(prog="bench_placement")
    p.add_argument("--quick", action="store_true", help="12 nodes, 200 pods")
    p.add_argument("--nodes", type=int)
    p.add_argument("--pods", type=int)
    add_run_args(p, burst=200, gap=3.0, seed=18, modes="without,with")
    p.add_argument("--synthetic-nodes", type=int, default=1000,
                   help="nodes of the in-process filter timing (0: skip it)")
    p.add_argument("--filter-pods", type=int, default=2000,
                   help="pods of the in-process filter timing (the cluster's workload)")
    p.add_argument("--cold-nodes", default="1000,5000",
                   help="synthetic node counts of the cold-filter timing against its "
                        "baseline, comma-separated (empty: skip it)")
    p.add_argument("--cold-rounds", type=int, default=2,
                   help="cold filters per pod shape in the cold-filter timing")
    p.add_argument("--cold-only", action="store_true",
                   help="only the cold-filter timing (no cluster, no other timing)")
    p.add_argument("--scheduler-pods", type=int, default=600,
                   help="pods of the in-process filter+prioritize timing over --nodes "
                        "nodes (0: skip it; --modes= runs only the in-process timings)")
    p.add_argument("--timeout", type=float, default=1200.0, help="per half, after creation")
    args, _ = p.parse_known_args(argv)
    nodes = args.nodes or (12 if args.quick else 100)
    pods = args.pods or (200 if args.quick else 2000)
    modes = chosen_modes(p, args.modes, MODES)
    manifests = workload(pods, args.seed)
    inproc: dict[str, Any] = {}
    for count in [int(c) for c in args.cold_nodes.split(",") if c.strip()]:
        cold = inproc[f"cold_{count}"] = cold_filter(count, args.seed, args.cold_rounds)
        print(f"cold filter over {cold['synthetic_nodes']} synthetic nodes ({cold['cold_calls']}"
              f" first filters of a pod shape): p50 {cold['cold_p50_ms']} ms, p99 "
              f"{cold['cold_p99_ms']} ms, max {cold['cold_max_ms']} ms; completed as "
              f"prioritize does p50 {cold['full_p50_ms']} ms, p99 {cold['full_p99_ms']} ms; "
              f"baseline (each "
              f"node decided afresh) p50 {cold['baseline_p50_ms']} ms, p99 "
              f"{cold['baseline_p99_ms']} ms, max {cold['baseline_max_ms']} ms; "
              f"{cold['speedup_p50']}x at p50, {cold['speedup_p99']}x at p99; "
              f"{cold['verdicts_differing']} verdicts differ", flush=True)
    if args.cold_only:
        print(json.dumps({"inprocess": inproc}))
        return 0 if all(c["verdicts_differing"] == 0 for c in inproc.values()) else 1
    if args.synthetic_nodes:
        inproc = inprocess_filter(args.synthetic_nodes, args.filter_pods, args.seed)
        print(f"in-process filter over {inproc['synthetic_nodes']} synthetic nodes "
              f"({inproc['distinct_node_states']} distinct states), {inproc['filter_calls']} "
              f"pods ({inproc['bound']} bound): p50 {inproc['filter_p50_ms']} ms, p99 "
              f"{inproc['filter_p99_ms']} ms "
              f"(a pod shape's first filter under its policy: p50 {inproc['cold_p50_ms']} "
              f"ms, p99 {inproc['cold_p99_ms']} ms, max {inproc['cold_max_ms']} ms over "
              f"{inproc['cold_calls']}; again: p50 "
              f"{inproc['warm_p50_ms']} ms, p99 {inproc['warm_p99_ms']} ms)", flush=True)
    if args.scheduler_pods:
        inproc.update(scheduler_lines(nodes, args.scheduler_pods, args.seed))
    workdir = Path(tempfile.mkdtemp(prefix="numalign-bench-placement-"))
    halves: dict[str, dict[str, Any]] = {}
    for mode in modes:
        cluster, kubeconfig, extender = start_cluster(mode, workdir)
        try:
            halves[mode] = asyncio.run(run_half(mode, kubeconfig, nodes, manifests, args,
                                                workdir, extender))
        finally:
            cluster.down()
        print_half(halves[mode])
    both = paired(halves)
    if both:
        print(f"  paired ({both['paired_chains']} chains Running in both) create -> Running: "
              f"without p50 {both['paired_without_p50_s']} s, p99 "
              f"{both['paired_without_p99_s']} s; with p50 {both['paired_with_p50_s']} s, "
              f"p99 {both['paired_with_p99_s']} s")
    return report(halves, workdir, {**both, "inprocess": inproc})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
