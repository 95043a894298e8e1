"""Benchmark of the operator with the emulated-node agent on the local control plane.

One agent process emulates NODES nodes (mixed machine files); the operator runs as a
subprocess (webhooks on unless --no-webhooks); DEPLOYMENTS Deployments put PODS pods on
the nodes through the real scheduler, under two TopologyPolicies (single-numa-node/pod
for a quarter of them, best-effort for the rest). A further REJECTS bare pods are bound
straight to fragmented-8numa nodes asking 6 CPUs on one NUMA node (which never fits
there): each is rejected first, then recreated by the operator onto a node that fits.

Reports:
* resolution latency (p50, p99): the first watch event of a pod -> the first one with
  ``numalign.io/resolved`` (0 when the webhook resolved it at creation; the backstop
  handler's latency with --no-webhooks), and how many were resolved at creation;
* redeploy latency (p50, p99, max): the rejected pod seen Failed -> its replacement
  ``<name>-r1`` seen Running; against the baseline measured in the same run: the
  backoff (1 s) plus how long any new pod of the Deployments takes from its first watch
  event to Running under the same load (the least a redeploy can take), as a ratio;
* the operator's memory (RSS now and peak).

    python bench/run.py operator [--quick]     # 100 nodes / 2,000 pods / 40 Deployments
    python bench/bench_operator.py --nodes 10 --pods 100 --deployments 8 --rejects 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_agent import agent_argv, node_mix, pct, rss_kib, stop, wait_nodes, watch_pods
from numalign.api.kube import ApiError, Kube, load_config
from numalign.api.names import ANN_RESOLVED
from numalign.topology.machine import load_machine

NS = "bench-operator"
PAUSE = "registry.k8s.io/pause:3.10"
REDEPLOY = {"enabled": True, "maxAttempts": 3, "backoffSeconds": 1, "avoidRejectingNodes": True}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def policies() -> list[dict[str, Any]]:
    def tp(name: str, spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "numalign.io/v1alpha1", "kind": "TopologyPolicy",
                "metadata": {"name": name}, "spec": spec}

    return [
        tp("bench-snn", {"policy": "single-numa-node", "scope": "pod", "namespaces": [NS],
                         "podSelector": {"matchLabels": {"tier": "snn"}}, "priority": 10,
                         "redeploy": REDEPLOY}),
        tp("bench-default", {"policy": "best-effort", "namespaces": [NS], "priority": 1,
                             "redeploy": REDEPLOY}),
    ]


def deployments(pods: int, count: int) -> list[dict[str, Any]]:
    """``count`` Deployments, ``pods`` replicas in all: every fourth Guaranteed 1-CPU
    single-numa-node, the others small Burstable best-effort pods."""
    per = [pods // count] * count
    for i in range(pods - sum(per)):
        per[i] += 1
    out = []
    for i, replicas in enumerate(per):
        snn = i % 4 == 0
        if snn:
            res = {"cpu": "1", "memory": "64Mi"}
            resources: dict[str, Any] = {"requests": res, "limits": res}
        else:
            resources = {"requests": {"cpu": "10m", "memory": "16Mi"}}
        name = f"op-{i}"
        labels = {"app": name, "tier": "snn" if snn else "default"}
        out.append({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"terminationGracePeriodSeconds": 0,
                                           "containers": [{"name": "main", "image": PAUSE,
                                                           "resources": resources}]}}},
        })
    return out


def reject_first(index: int, node: str) -> dict[str, Any]:
    """A bare 6-CPU single-numa-node pod bound to a fragmented-8numa node: rejected."""
    res = {"cpu": "6", "memory": "256Mi"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"reject-{index}", "namespace": NS,
                         "labels": {"tier": "snn", "app": "reject"}},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": PAUSE,
                                     "resources": {"requests": res, "limits": res}}]}}


async def _webhook_ready(kube: Kube, timeout: float) -> None:
    probe = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
             "spec": {"containers": [{"name": "c", "image": PAUSE}]}}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = await kube.create("/api/v1/namespaces/default/pods?dryRun=All", probe)
            if ANN_RESOLVED in ((got.get("metadata") or {}).get("annotations") or {}):
                return
        except ApiError:
            pass
        await asyncio.sleep(0.5)
    raise TimeoutError("the operator's mutating webhook did not answer")


async def run_bench(kubeconfig: str, nodes: int, pods: int, count: int, rejects: int,
                    webhooks: bool, timeout: float, workdir: Path) -> dict[str, Any]:
    mix = node_mix(nodes)
    names = {f"{load_machine(f).name}-{i}" for f, c in mix for i in range(c)}
    fragmented = sorted(n for n in names if n.startswith("fragmented-8numa-"))
    if rejects and not fragmented:
        raise SystemExit("no fragmented-8numa node in the mix: use more --nodes")
    argv = agent_argv(kubeconfig, mix, "WARNING")
    agent_log = (workdir / "agent.log").open("ab")
    agent = subprocess.Popen(argv, stdout=agent_log, stderr=subprocess.STDOUT)
    # The pods placed to be rejected first are bare: recreated only with this flag.
    op_argv = [sys.executable, "-m", "numalign.cli", "operator", "--kubeconfig", kubeconfig,
               "--metrics-port", "0", "--recreate-bare-pods"]
    op_argv += (["--webhook-port", str(_free_port()), "--cert-dir", str(workdir / "certs")]
                if webhooks else ["--no-webhooks"])
    op_log = (workdir / "operator.log").open("ab")
    operator = subprocess.Popen(op_argv, stdout=op_log, stderr=subprocess.STDOUT)
    kube = Kube(load_config(kubeconfig), max_connections=16)
    await kube.open()
    result: dict[str, Any] = {"nodes": nodes, "pods": pods, "deployments": count,
                              "rejects": rejects, "webhooks": webhooks,
                              "machines": {load_machine(f).name: c for f, c in mix}}
    try:
        t0 = time.monotonic()
        await wait_nodes(kube, names, 180)
        if webhooks:
            await _webhook_ready(kube, 120)
        result["setup_s"] = round(time.monotonic() - t0, 2)
        try:
            await kube.create("/api/v1/namespaces", {"metadata": {"name": NS}})
        except ApiError as e:
            if e.status != 409:
                raise
        for tp in policies():
            try:
                await kube.create("/apis/numalign.io/v1alpha1/topologypolicies", tp)
            except ApiError as e:
                if e.status != 409:
                    raise
        await asyncio.sleep(1.0)  # the operator's caches see the policies

        first_seen: dict[str, float] = {}
        resolved_at: dict[str, float] = {}
        at_creation: set[str] = set()
        running: set[str] = set()
        started: dict[str, float] = {}  # Deployment pods: first seen -> seen Running
        failed_at: dict[str, float] = {}  # reject-i -> seen Failed
        replaced_at: dict[str, float] = {}  # reject-i -> reject-i-r1 seen Running
        def done() -> bool:
            return len(running) >= pods + rejects and len(replaced_at) >= rejects

        def on_pod(obj: dict[str, Any], now: float) -> None:
            meta = obj.get("metadata") or {}
            uid, name = str(meta.get("uid")), str(meta.get("name"))
            if uid not in first_seen:
                first_seen[uid] = now
                if ANN_RESOLVED in (meta.get("annotations") or {}):
                    at_creation.add(uid)
            if uid not in resolved_at and ANN_RESOLVED in (meta.get("annotations") or {}):
                resolved_at[uid] = now
            status = obj.get("status") or {}
            if status.get("phase") == "Running":
                running.add(uid)
                if not name.startswith("reject-") and uid not in started:
                    started[uid] = now - first_seen[uid]
                base = name.removesuffix("-r1")
                if name.startswith("reject-") and base != name and base in failed_at:
                    replaced_at.setdefault(base, now)
            elif (status.get("phase") == "Failed" and name.startswith("reject-")
                  and not name.endswith("-r1")):
                failed_at.setdefault(name, now)

        _, rv = await kube.list_all(f"/api/v1/namespaces/{NS}/pods")

        async def watch() -> None:
            await watch_pods(kube, NS, rv, on_pod, done)

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.5)
        start = time.monotonic()
        for d in deployments(pods, count):
            await kube.create(f"/apis/apps/v1/namespaces/{NS}/deployments", d)
        for i in range(rejects):
            await kube.create(f"/api/v1/namespaces/{NS}/pods",
                              reject_first(i, fragmented[i % len(fragmented)]))
        try:
            await asyncio.wait_for(watcher, timeout)
        except TimeoutError:
            result["timed_out"] = True
        res_lat = [resolved_at[u] - first_seen[u] for u in resolved_at if u in first_seen]
        red_lat = [replaced_at[n] - failed_at[n] for n in replaced_at]
        start_lat = list(started.values())
        floor = {p: REDEPLOY["backoffSeconds"] + pct(start_lat, p) for p in (50, 99)}
        rss, hwm = rss_kib(operator.pid)
        result.update({
            "seconds_to_all_running": round(time.monotonic() - start, 2),
            "pods_seen": len(first_seen),
            "running": len(running),
            "resolved": len(resolved_at),
            "resolved_at_creation": len(at_creation),
            "resolution_p50_s": round(pct(res_lat, 50), 3),
            "resolution_p99_s": round(pct(res_lat, 99), 3),
            "rejected_first": len(failed_at),
            "redeployed_running": len(replaced_at),
            "redeploy_p50_s": round(pct(red_lat, 50), 3),
            "redeploy_p99_s": round(pct(red_lat, 99), 3),
            "redeploy_max_s": round(max(red_lat, default=float("nan")), 3),
            "pod_start_p50_s": round(pct(start_lat, 50), 3),
            "pod_start_p99_s": round(pct(start_lat, 99), 3),
            "redeploy_p50_over_floor": round(pct(red_lat, 50) / floor[50], 2)
            if red_lat and start_lat else None,
            "redeploy_p99_over_floor": round(pct(red_lat, 99) / floor[99], 2)
            if red_lat and start_lat else None,
            "operator_rss_mib": round(rss / 1024, 1),
            "operator_peak_rss_mib": round(hwm / 1024, 1),
            "operator_alive": operator.poll() is None,
        })
        await kube.delete(f"/api/v1/namespaces/{NS}")
        for tp in policies():
            with contextlib.suppress(ApiError):
                await kube.delete("/apis/numalign.io/v1alpha1/topologypolicies/"
                                  + tp["metadata"]["name"])
    finally:
        await kube.close()
        for proc in (operator, agent):
            stop(proc)
        agent_log.close()
        op_log.close()
    return result


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench_operator")
    p.add_argument("--quick", action="store_true", help="10 nodes, 100 pods, 8 Deployments")
    p.add_argument("--nodes", type=int)
    p.add_argument("--pods", type=int)
    p.add_argument("--deployments", type=int)
    p.add_argument("--rejects", type=int, help="bare pods rejected first (default pods/40)")
    p.add_argument("--no-webhooks", action="store_true",
                   help="resolution by the backstop handler instead of the webhook")
    p.add_argument("--kubeconfig", help="use this cluster instead of starting one")
    p.add_argument("--timeout", type=float, default=900.0)
    args, _ = p.parse_known_args(argv)
    nodes = args.nodes or (10 if args.quick else 100)
    pods = args.pods or (100 if args.quick else 2000)
    count = args.deployments or (8 if args.quick else 40)
    rejects = args.rejects if args.rejects is not None else max(1, pods // 40)
    workdir = Path(tempfile.mkdtemp(prefix="numalign-bench-operator-"))
    cluster = None
    kubeconfig = args.kubeconfig
    if kubeconfig is None:
        from numalign.devcluster.cluster import DevCluster

        cluster = DevCluster(state_dir=workdir / "cluster")
        cluster.up(log=lambda m: print(f"[devcluster] {m}", file=sys.stderr))
        kubeconfig = str(cluster.kubeconfig)
    try:
        result = asyncio.run(run_bench(kubeconfig, nodes, pods, count, rejects,
                                       not args.no_webhooks, args.timeout, workdir))
    finally:
        if cluster is not None:
            cluster.down()
    print(f"operator: {result['nodes']} emulated nodes, {result['pods']} pods in "
          f"{result['deployments']} Deployments + {result['rejects']} pods rejected first "
          f"(webhooks {'on' if result['webhooks'] else 'off'})")
    print(f"  all Running in {result['seconds_to_all_running']} s "
          f"({result['running']} Running of {result['pods_seen']} seen)")
    print(f"  resolution        p50 {result['resolution_p50_s']} s, p99 "
          f"{result['resolution_p99_s']} s ({result['resolved_at_creation']} of "
          f"{result['resolved']} resolved at creation)")
    print(f"  redeploy          p50 {result['redeploy_p50_s']} s, p99 {result['redeploy_p99_s']}"
          f" s, max {result['redeploy_max_s']} s ({result['redeployed_running']} of "
          f"{result['rejected_first']} rejected pods replaced and Running)")
    print(f"  baseline          backoff {REDEPLOY['backoffSeconds']} s + a new pod's start "
          f"(first seen -> Running, same run) p50 {result['pod_start_p50_s']} s, p99 "
          f"{result['pod_start_p99_s']} s; redeploy over it: p50 "
          f"x{result['redeploy_p50_over_floor']}, p99 x{result['redeploy_p99_over_floor']}")
    print(f"  operator memory   RSS {result['operator_rss_mib']} MiB "
          f"(peak {result['operator_peak_rss_mib']} MiB); logs in {workdir}")
    print(json.dumps(result))
    return 0 if not result.get("timed_out") and result["operator_alive"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
