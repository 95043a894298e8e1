"""Benchmark of the emulated-node agent on the local control plane.

One agent process emulates NODES nodes (mixed machine files from the fixtures) while
Deployments put PODS pods on them. Reports pods decided per second, bind-to-decision
latency (p50, p99: from the moment a watch sees the pod bound to the moment it sees
the pod Running or Failed) and the agent's memory (RSS).

Baseline, measured in the same run and under the same load: the API floor. While the
pods arrive, the bench writes a ConfigMap every 100 ms and times each write until its
own watch sees it -- what any agent's decision costs at least on this control plane (one
write, seen through a watch), with no decision in it. The agent's latency is reported
as a ratio to that floor.

    python bench/run.py agent [--quick]                 # 100 nodes / 2,000 pods (quick: 10 / 100)
    python bench/bench_agent.py --nodes 10 --pods 100 [--kubeconfig KC]

Without --kubeconfig it starts its own control plane (numalign.devcluster) and stops it
at the end. How fast pods arrive is set by the controller manager's and scheduler's API
rate limits: the dev cluster raises them to 200/400 (pods arrive in a burst that loads
the API server on a 2-core machine); ``NUMALIGN_DEV_CLIENT_QPS=default`` keeps the
Kubernetes defaults (20 and 50 QPS), the pace of a production control plane.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from numalign.api.kube import ApiError, Kube, load_config
from numalign.api.names import ANN_RESOLVED
from numalign.devcluster.cluster import DEFAULT_CLIENT_QPS
from numalign.topology.machine import load_machine

HERE = Path(__file__).resolve().parent
MACHINES = HERE.parent / "tests" / "fixtures" / "machines"
MIX = ["seed-figure1", "dual-16core", "dgx-a100-like", "fragmented-8numa", "group8-gpu",
       "dgx1-like", "wide64"]
NS = "bench-agent"


def _machines_dir() -> Path:
    env = os.environ.get("NUMALIGN_MACHINES")
    return Path(env) if env else MACHINES


def node_mix(nodes: int) -> list[tuple[Path, int]]:
    files = [f for name in MIX if (f := _machines_dir() / f"{name}.yaml").exists()]
    counts = [nodes // len(files)] * len(files)
    for i in range(nodes - sum(counts)):
        counts[i] += 1
    return [(f, c) for f, c in zip(files, counts, strict=True) if c]


def agent_argv(kubeconfig: str, mix: list[tuple[Path, int]], log_level: str) -> list[str]:
    """The command line of one agent process emulating ``mix`` (machine file, count)."""
    argv = [sys.executable, "-m", "numalign.cli", "agent", "--kubeconfig", kubeconfig,
            "--log-level", log_level]
    for f, c in mix:
        argv += ["--emulate", f"{f}={c}"]
    return argv


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 20 s."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def deployments(pods: int, count: int = 20) -> list[dict[str, Any]]:
    """A mix: a quarter Guaranteed single-numa-node pods (1 CPU), the rest small
    Burstable pods under restricted or none."""
    out = []
    per = [pods // count] * count
    for i in range(pods - sum(per)):
        per[i] += 1
    for i, replicas in enumerate(per):
        kind = i % 4
        if kind == 0:
            res = {"cpu": "1", "memory": "64Mi"}
            resources = {"requests": res, "limits": res}
            resolved = {"policy": "single-numa-node", "scope": "pod", "options": {},
                        "source": "TopologyPolicy/bench"}
        else:
            resources = {"requests": {"cpu": "10m", "memory": "16Mi"}}
            resolved = {"policy": "restricted" if kind == 1 else "none", "scope": "container",
                        "options": {}, "source": "TopologyPolicy/bench"}
        name = f"bench-{i}"
        out.append({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name},
                                 "annotations": {ANN_RESOLVED: json.dumps(resolved)}},
                    "spec": {"terminationGracePeriodSeconds": 0,
                             "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                             "resources": resources}]},
                },
            },
        })
    return out


def rss_kib(pid: int) -> tuple[int, int]:
    rss = hwm = 0
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1])
    except OSError:
        pass
    return rss, hwm


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def wait_nodes(kube: Kube, names: set[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items, _ = await kube.list_all("/api/v1/nodes")
        ready = {n["metadata"]["name"] for n in items
                 if any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (n.get("status") or {}).get("conditions") or [])}
        if names <= ready:
            return
        await asyncio.sleep(1)
    raise TimeoutError(f"nodes not Ready after {timeout}s")


async def watch_pods(kube: Kube, namespace: str, rv: str,
                     on_pod: Callable[[dict[str, Any], float], None],
                     done: Callable[[], bool]) -> None:
    """Feed every pod event of ``namespace`` from ``rv`` on (not deletions) to
    ``on_pod(pod, when seen)`` until ``done()``; watches again when the server ends one."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    while not done():
        async for ev in kube.watch(path, {"resourceVersion": rv}):
            obj = ev.get("object") or {}
            rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
            if ev.get("type") in ("BOOKMARK", "ERROR", "DELETED"):
                continue
            on_pod(obj, time.monotonic())
            if done():
                return


PROBE = "bench-api-floor"


async def api_floor(kube: Kube, stop: asyncio.Event,
                    samples: list[tuple[float, float]]) -> None:
    """Until ``stop``: write the probe ConfigMap every 100 ms; append (when written,
    seconds until this client's watch saw it)."""
    path = f"/api/v1/namespaces/{NS}/configmaps"
    try:
        made = await kube.create(path, {"metadata": {"name": PROBE}, "data": {"seq": "0"}})
    except ApiError as e:
        if e.status != 409:
            raise
        made = await kube.get(f"{path}/{PROBE}")
    rv = str(made["metadata"]["resourceVersion"])
    sent: dict[str, float] = {}

    async def watch() -> None:
        nonlocal rv
        while True:
            async for ev in kube.watch(path, {"resourceVersion": rv,
                                              "fieldSelector": f"metadata.name={PROBE}"}):
                obj = ev.get("object") or {}
                rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                at = sent.pop(str((obj.get("data") or {}).get("seq")), None)
                if at is not None:
                    samples.append((at, time.monotonic() - at))

    watcher = asyncio.create_task(watch())
    seq = 0
    try:
        while not stop.is_set():
            seq += 1
            sent[str(seq)] = time.monotonic()
            await kube.patch(f"{path}/{PROBE}", {"data": {"seq": str(seq)}})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.1)
        await asyncio.sleep(1.0)  # the last writes' watch events
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher


async def run_bench(kubeconfig: str, nodes: int, pods: int, timeout: float) -> dict[str, Any]:
    mix = node_mix(nodes)
    names = {f"{load_machine(f).name}-{i}" for f, c in mix for i in range(c)}
    argv = agent_argv(kubeconfig, mix, "INFO")
    log_fd, log_path = tempfile.mkstemp(prefix="numalign-bench-agent-", suffix=".log")
    agent = subprocess.Popen(argv, stdout=log_fd, stderr=subprocess.STDOUT)
    os.close(log_fd)
    kube = Kube(load_config(kubeconfig), max_connections=16)
    await kube.open()
    result: dict[str, Any] = {"nodes": nodes, "pods": pods,
                              "machines": {load_machine(f).name: c for f, c in mix}}
    try:
        t0 = time.monotonic()
        await wait_nodes(kube, names, 120)
        result["nodes_ready_s"] = round(time.monotonic() - t0, 2)
        try:
            await kube.create("/api/v1/namespaces", {"metadata": {"name": NS}})
        except ApiError as e:
            if e.status != 409:
                raise
        bound: dict[str, float] = {}
        decided: dict[str, float] = {}
        phases: dict[str, str] = {}
        def on_pod(obj: dict[str, Any], now: float) -> None:
            uid = str((obj.get("metadata") or {}).get("uid"))
            if (obj.get("spec") or {}).get("nodeName") and uid not in bound:
                bound[uid] = now
            phase = (obj.get("status") or {}).get("phase")
            if phase in ("Running", "Failed") and uid not in decided:
                decided[uid] = now
                phases[uid] = str(phase)

        _, rv = await kube.list_all(f"/api/v1/namespaces/{NS}/pods")

        async def watch() -> None:
            await watch_pods(kube, NS, rv, on_pod, lambda: len(decided) >= pods)

        watcher = asyncio.create_task(watch())
        stop_probe = asyncio.Event()
        floor_samples: list[tuple[float, float]] = []
        prober = asyncio.create_task(api_floor(kube, stop_probe, floor_samples))
        await asyncio.sleep(0.5)
        start = time.monotonic()
        for d in deployments(pods):
            await kube.create(f"/apis/apps/v1/namespaces/{NS}/deployments", d)
        try:
            await asyncio.wait_for(watcher, timeout)
        except TimeoutError:
            result["timed_out"] = True
        stop_probe.set()
        await prober
        end = max(decided.values(), default=time.monotonic())
        lat = [decided[u] - bound[u] for u in decided if u in bound]
        first_bind = min(bound.values(), default=start)
        floor = [d for at, d in floor_samples if first_bind <= at <= end]
        for p in (50, 99):
            result[f"api_floor_p{p}_s"] = round(pct(floor, p), 3)
            result[f"latency_p{p}_over_floor"] = (
                round(pct(lat, p) / pct(floor, p), 2) if floor and lat and pct(floor, p) > 0
                else None)
        result["api_floor_samples"] = len(floor)
        rss, hwm = rss_kib(agent.pid)
        result.update({
            "decided": len(decided),
            "running": sum(1 for p in phases.values() if p == "Running"),
            "failed": sum(1 for p in phases.values() if p == "Failed"),
            "seconds_create_to_last_decision": round(end - start, 2),
            "pods_per_second": round(len(decided) / max(end - first_bind, 1e-9), 1),
            "latency_p50_s": round(pct(lat, 50), 3),
            "latency_p99_s": round(pct(lat, 99), 3),
            "latency_max_s": round(max(lat, default=float("nan")), 3),
            "latency_mean_s": round(statistics.fmean(lat), 3) if lat else None,
            "agent_rss_mib": round(rss / 1024, 1),
            "agent_peak_rss_mib": round(hwm / 1024, 1),
        })
        # Clean up: deleting the namespace exercises release and finalization.
        t1 = time.monotonic()
        await kube.delete(f"/api/v1/namespaces/{NS}")
        while time.monotonic() - t1 < 180:
            items, _ = await kube.list_all(f"/api/v1/namespaces/{NS}/pods")
            if not items:
                break
            await asyncio.sleep(1)
        result["seconds_to_delete_all"] = round(time.monotonic() - t1, 1)
    finally:
        await kube.close()
        result.update(agent_summary(stop_agent(agent, log_path)))
    return result


def stop_agent(agent: subprocess.Popen[bytes], log_path: str) -> str:
    """Stop the agent process; its log (deleted), its warnings and errors echoed."""
    agent.send_signal(signal.SIGTERM)
    try:
        agent.wait(20)
    except subprocess.TimeoutExpired:
        agent.kill()
    log_text = Path(log_path).read_text(errors="replace")
    os.unlink(log_path)
    for line in log_text.splitlines():
        if " WARNING " in line or " ERROR " in line:
            print(f"agent: {line}", file=sys.stderr)
    return log_text


SUMMARY = re.compile(r"summary: .*watch-to-written p50 ([0-9.na]+)s p99 ([0-9.na]+)s; "
                     r"(\d+) NodeTopology writes, \d+ NodeResourceTopology writes, "
                     r"(\d+) API requests")


def agent_summary(log_text: str) -> dict[str, Any]:
    """The agent's own account (its exit summary): latency from seeing the pod bound to
    its status written, and its writes, to tell the agent's share from the control
    plane's in bind->decision."""
    found = SUMMARY.findall(log_text)
    if not found:
        return {}
    p50, p99, nt_writes, requests = found[-1]
    return {"agent_watch_to_written_p50_s": float(p50),
            "agent_watch_to_written_p99_s": float(p99),
            "agent_nodetopology_writes": int(nt_writes), "agent_api_requests": int(requests)}


@contextlib.contextmanager
def bench_cluster(kubeconfig: str | None, prefix: str) -> Iterator[str]:
    """``kubeconfig``, else that of a control plane started here (numalign.devcluster)
    and stopped at the end."""
    if kubeconfig is not None:
        yield kubeconfig
        return
    from numalign.devcluster.cluster import DevCluster

    cluster = DevCluster(state_dir=Path(tempfile.mkdtemp(prefix=prefix)))
    cluster.up(log=lambda m: print(f"[devcluster] {m}", file=sys.stderr))
    try:
        yield str(cluster.kubeconfig)
    finally:
        cluster.down()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench_agent")
    p.add_argument("--quick", action="store_true", help="10 nodes, 100 pods")
    p.add_argument("--nodes", type=int)
    p.add_argument("--pods", type=int)
    p.add_argument("--kubeconfig", help="use this cluster instead of starting one")
    p.add_argument("--timeout", type=float, default=600.0)
    args, _ = p.parse_known_args(argv)
    nodes = args.nodes or (10 if args.quick else 100)
    pods = args.pods or (100 if args.quick else 2000)
    with bench_cluster(args.kubeconfig, "numalign-bench-agent-") as kubeconfig:
        result = asyncio.run(run_bench(kubeconfig, nodes, pods, args.timeout))
    qps = os.environ.get("NUMALIGN_DEV_CLIENT_QPS", DEFAULT_CLIENT_QPS)
    print(f"control plane client rate limits (NUMALIGN_DEV_CLIENT_QPS): {qps}")
    print(f"agent: {result['nodes']} emulated nodes in one process, {result['pods']} pods "
          f"from Deployments")
    print(f"  decided {result['decided']} ({result['running']} Running, {result['failed']} "
          f"Failed) in {result['seconds_create_to_last_decision']} s after the Deployments")
    print(f"  throughput        {result['pods_per_second']} pods/s (first bind to last decision)")
    print(f"  bind->decision    p50 {result['latency_p50_s']} s, p99 {result['latency_p99_s']} s,"
          f" max {result['latency_max_s']} s")
    print(f"  API floor         one write seen through a watch, same load: p50 "
          f"{result['api_floor_p50_s']} s, p99 {result['api_floor_p99_s']} s "
          f"({result['api_floor_samples']} samples)")
    print(f"  ratio to floor    p50 x{result['latency_p50_over_floor']}, "
          f"p99 x{result['latency_p99_over_floor']}")
    if "agent_watch_to_written_p50_s" in result:
        print(f"  in the agent      seen bound -> status written p50 "
              f"{result['agent_watch_to_written_p50_s']} s, p99 "
              f"{result['agent_watch_to_written_p99_s']} s "
              f"({result['agent_api_requests']} API requests, "
              f"{result['agent_nodetopology_writes']} NodeTopology status writes)")
    print(f"  agent memory      RSS {result['agent_rss_mib']} MiB "
          f"(peak {result['agent_peak_rss_mib']} MiB)")
    print(f"  nodes Ready in {result['nodes_ready_s']} s; namespace deleted (all pods released)"
          f" in {result['seconds_to_delete_all']} s")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
