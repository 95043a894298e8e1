"""Benchmark: how fresh the NodeResourceTopology is -- the lag from a pod's admission to
the NodeResourceTopology update that includes it.

One agent process emulates NODES nodes with ``--publish-nrt``. The bench creates PODS
Guaranteed pods (1 CPU, 64Mi: each fits and holds exclusive resources), bound round-robin
to the nodes at RATE pods/s, and watches pods and NodeResourceTopologies. A pod is
admitted when its watch sees it Running; it is in a NodeResourceTopology when a watch
event of its node's object carries a ``nodeTopologyPodsFingerprint`` that is the
fingerprint (numalign.agent.podfingerprint, as scheduler-plugins computes it) of a pod
set holding it: the node's admitted pods in the order they were seen, the first k of
them, k being the exclusive CPUs the object shows taken. Lag = that event's time minus
the admission's (0 when the object was seen first). Events whose fingerprint matches no
such set are counted (``unverified``) and their pods' lag taken from the CPU count.

Baseline, measured in the same run and under the same load: the API floor of
bench_agent (one ConfigMap write seen through a watch).

    python bench/run.py nrt [--quick]          # 20 nodes, 400 pods at 20/s (quick: 5, 60)
    python bench/bench_nrt.py --nodes 20 --pods 400 --rate 20 [--kubeconfig KC]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_agent import api_floor, bench_cluster, pct, stop_agent, wait_nodes, watch_pods
from numalign.agent.nrt import BASE_PATH as NRT_BASE
from numalign.agent.podfingerprint import ATTRIBUTE, sign
from numalign.api.kube import ApiError, Kube, load_config, nt_path
from numalign.topology.machine import load_machine

HERE = Path(__file__).resolve().parent
MACHINE = HERE.parent / "tests" / "fixtures" / "machines" / "dual-16core.yaml"
NS = "bench-agent"  # bench_agent's namespace: its API floor probe lives there


def pod(name: str, node: str) -> dict[str, Any]:
    res = {"cpu": "1", "memory": "64Mi"}
    return {"metadata": {"name": name},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": res, "limits": res}}]}}


class Tracker:
    """Per node: the admitted pods in the order seen, and which of them a
    NodeResourceTopology was seen to include."""

    def __init__(self, total_cpus: dict[str, int]) -> None:
        self.total = total_cpus
        self.admitted: dict[str, list[tuple[str, float]]] = {n: [] for n in total_cpus}
        self.covered: dict[str, int] = dict.fromkeys(total_cpus, 0)
        self.pending: dict[str, list[tuple[int, str, float]]] = {n: [] for n in total_cpus}
        self.lags: list[float] = []
        self.verified = 0
        self.unverified = 0

    def on_pod(self, obj: dict[str, Any], now: float) -> None:
        node = (obj.get("spec") or {}).get("nodeName")
        if node not in self.admitted or (obj.get("status") or {}).get("phase") != "Running":
            return
        name = obj["metadata"]["name"]
        if any(n == name for n, _ in self.admitted[node]):
            return
        self.admitted[node].append((name, now))
        self._settle(node)

    def on_nrt(self, obj: dict[str, Any], now: float) -> None:
        node = obj["metadata"]["name"]
        if node not in self.admitted:
            return
        free = sum(int(r["available"]) for z in obj.get("zones") or []
                   for r in z.get("resources") or [] if r["name"] == "cpu")
        fp = next((a["value"] for a in obj.get("attributes") or []
                   if a["name"] == ATTRIBUTE), "")
        self.pending[node].append((self.total[node] - free, fp, now))
        self._settle(node)

    def _settle(self, node: str) -> None:
        seen = self.admitted[node]
        keep: list[tuple[int, str, float]] = []
        for k, fp, at in self.pending[node]:
            if k > len(seen):  # the object is ahead of the pod watch: wait for the pods
                keep.append((k, fp, at))
                continue
            if sign([(NS, n) for n, _ in seen[:k]]) == fp:
                self.verified += 1
            else:
                self.unverified += 1
            for _, admitted_at in seen[self.covered[node]:k]:
                self.lags.append(max(0.0, at - admitted_at))
            self.covered[node] = max(self.covered[node], k)
        self.pending[node] = keep

    def done(self, pods: int) -> bool:
        return sum(self.covered.values()) >= pods


async def watch_nrts(kube: Kube, tracker: Tracker, stop: asyncio.Event) -> None:
    _, rv = await kube.list_all(NRT_BASE)
    while not stop.is_set():
        async for ev in kube.watch(NRT_BASE, {"resourceVersion": rv}):
            obj = ev.get("object") or {}
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
            if ev.get("type") in ("ADDED", "MODIFIED"):
                tracker.on_nrt(obj, time.monotonic())
            if stop.is_set():
                return


async def run_bench(kubeconfig: str, nodes: int, pods: int, rate: float,
                    timeout: float) -> dict[str, Any]:
    machine = load_machine(MACHINE)
    start_index = 7000
    names = [f"{machine.name}-{start_index + i}" for i in range(nodes)]
    argv = [sys.executable, "-m", "numalign.cli", "agent", "--kubeconfig", kubeconfig,
            "--emulate", f"{MACHINE}={nodes}", "--start", str(start_index), "--publish-nrt",
            "--log-level", "INFO"]
    log_fd, log_path = tempfile.mkstemp(prefix="numalign-bench-nrt-", suffix=".log")
    agent = subprocess.Popen(argv, stdout=log_fd, stderr=subprocess.STDOUT)
    os.close(log_fd)
    kube = Kube(load_config(kubeconfig), max_connections=16)
    await kube.open()
    tracker = Tracker(dict.fromkeys(names, len(machine.cpus)))
    result: dict[str, Any] = {"nodes": nodes, "pods": pods, "rate": rate}
    stop = asyncio.Event()
    try:
        await wait_nodes(kube, set(names), 120)
        try:
            await kube.create("/api/v1/namespaces", {"metadata": {"name": NS}})
        except ApiError as e:
            if e.status != 409:
                raise
        _, rv = await kube.list_all(f"/api/v1/namespaces/{NS}/pods")
        pod_watch = asyncio.create_task(watch_pods(kube, NS, rv, tracker.on_pod,
                                                   lambda: tracker.done(pods)))
        nrt_watch = asyncio.create_task(watch_nrts(kube, tracker, stop))
        floor_samples: list[tuple[float, float]] = []
        prober = asyncio.create_task(api_floor(kube, stop, floor_samples))
        await asyncio.sleep(1.0)
        start = time.monotonic()
        for i in range(pods):
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
            await kube.create(f"/api/v1/namespaces/{NS}/pods",
                              pod(f"nrt-{i}", names[i % nodes]))
        deadline = time.monotonic() + timeout
        while not tracker.done(pods) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        result["timed_out"] = not tracker.done(pods)
        stop.set()
        await prober
        for t in (pod_watch, nrt_watch):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        lags = tracker.lags
        floor = [d for at, d in floor_samples if at >= start]
        result.update({
            "measured": len(lags), "verified_events": tracker.verified,
            "unverified_events": tracker.unverified,
            "lag_p50_s": round(pct(lags, 50), 3), "lag_p99_s": round(pct(lags, 99), 3),
            "lag_max_s": round(max(lags, default=float("nan")), 3),
            "api_floor_p50_s": round(pct(floor, 50), 3),
            "api_floor_p99_s": round(pct(floor, 99), 3),
        })
    finally:
        stop.set()
        await _clean_up(kube, names)
        await kube.close()
        stop_agent(agent, log_path)
        for n in names:  # the emulated nodes and what they published
            for path in (f"/api/v1/nodes/{n}", f"{NRT_BASE}/{n}", nt_path(n)):
                subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "delete", "--raw", path],
                               capture_output=True, check=False, timeout=30)
    return result


async def _clean_up(kube: Kube, names: list[str]) -> None:
    """Delete the pods while the agent still runs (it finalizes them), then the
    namespace."""
    with contextlib.suppress(ApiError):
        await kube.delete(f"/api/v1/namespaces/{NS}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        items, _ = await kube.list_all(f"/api/v1/namespaces/{NS}/pods")
        if not items:
            return
        await asyncio.sleep(1)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench_nrt")
    p.add_argument("--quick", action="store_true", help="5 nodes, 60 pods")
    p.add_argument("--nodes", type=int)
    p.add_argument("--pods", type=int)
    p.add_argument("--rate", type=float, default=20.0, help="pods created per second")
    p.add_argument("--kubeconfig", help="use this cluster instead of starting one")
    p.add_argument("--timeout", type=float, default=120.0)
    args, _ = p.parse_known_args(argv)
    nodes = args.nodes or (5 if args.quick else 20)
    pods = args.pods or (60 if args.quick else 400)
    with bench_cluster(args.kubeconfig, "numalign-bench-nrt-") as kubeconfig:
        r = asyncio.run(run_bench(kubeconfig, nodes, pods, args.rate, args.timeout))
    print(f"NodeResourceTopology freshness: {r['nodes']} emulated nodes, {r['pods']} pods at "
          f"{r['rate']:g}/s")
    print(f"  admission -> NRT  p50 {r['lag_p50_s']} s, p99 {r['lag_p99_s']} s, max "
          f"{r['lag_max_s']} s ({r['measured']} pods; target p99 <= 2 s)")
    print(f"  fingerprints      {r['verified_events']} events matched the pods seen, "
          f"{r['unverified_events']} did not")
    print(f"  API floor         p50 {r['api_floor_p50_s']} s, p99 {r['api_floor_p99_s']} s")
    if r.get("timed_out"):
        print("  TIMED OUT: not every pod reached a NodeResourceTopology")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
