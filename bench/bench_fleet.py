"""The fleet at scale: emulated nodes, bursts of Deployments, Jobs and bare pods under
mixed namespace policies, the scheduler extender, to the end.

One local control plane per mode (its API server writes an audit log at Metadata
level), one agent process emulating NODES nodes (the sample machines' mix of
bench/placement_workload.py: 70 % fragmented or GPU nodes), the operator (webhooks,
redeploy) and, by mode, numalign's extender (``with``), none (``without``) or an
extender that decides nothing (``noop``, bench/fleet_noop.py: the HTTP share). PODS pods
in units (bench/fleet_workload.py: half the pods from Deployments, a quarter from Jobs,
a quarter bare) are created BURST pods at a time, GAP seconds apart, in five namespaces:
single-numa-node (pod overrides allowed), restricted, best-effort (overrides allowed),
single-numa-node without redeploy, and one no policy governs. The end: every pod Running,
or nothing changed for SETTLE seconds; the Pending ones are counted by their reason.

Reported per mode: pods/s scheduled (bound pods over first create -> last bind),
create -> Running and create -> bound p50/p99 (from a pod's first watch event),
TopologyAffinityErrors per 1,000 pods, the pods left Pending by reason, the extender's
filter p50/p99 (its histogram) and RSS, the operator's, the agent's and the extender's
RSS and CPU seconds over the run, the API server's requests by component over the run
(from the audit log: per pod, reads/writes, the top verbs), kube-scheduler's scheduling
attempt p50/p99/mean and its extension points, and the memory after a round that
finishes the Jobs' pods and deletes them and every Failed pod.

    python bench/run.py fleet                           # 500 nodes, 10,000 pods
    python bench/run.py fleet --nodes=100 --pods=2000   # what a 2-core machine runs
    python bench/run.py fleet --nodes=20 --pods=300 --modes=without,noop,with
    python bench/run.py fleet --operator-source=DIR    # the operator from another tree

At scale (2 cores shared with unit-test runs, load 4-8; each row one run of
``--modes=with``, the 100-node row the 100 / 2,000 runs below; after: the extender's
bindings on a pool of their own, 32 connections; before: on the watches' pool of ten):

  nodes / pods              100 / 2,000  250 / 5,000     250 / 5,000  500 / 10,000
                                         before          after        before
  pods/s scheduled          19.0         14.8            22.2         10.5
  create->Running p50/p99 s 6.5 / 9.5    45 / 128        20 / 65      172 / 442
  TAE per 1,000 pods        0            0               0            0
  extender filter p50/p99   9.1 / 95 ms  25 / 198 ms     16 / 95 ms   34 / 213 ms
  RSS MiB operator          130          153             155          204
          agent             147          233             231          393
          extender          153          211             169          246
          kube-apiserver    700          1,053           1,015        1,451
  CPU s   operator          21           63              59           175
          agent             6.8          21              21           62
          extender          37           142             121          380
          kube-apiserver    -            165             144          461
  API requests per pod:
          agent             1.93         2.01            1.91         4.06
          extender          0.80         0.67            1.00         0.89
          operator          0.35         0.34            0.34         0.37
  scheduling algorithm mean 41 ms        67 ms           44 ms        94 ms
  extender binds failed     -            2,902           0            2,256

  (100 / 2,000: CPU and filter p50 from the first run below; 500 / 10,000 took 16 min.)
  500 / 10,000 after: 9.4 pods/s, 174 / 513 s, TAE 0, filter 39 / 231 ms, RSS 205 /
  386 / 238 / 1,557, CPU 190 / 71 / 433 / 508 s, requests 3.80 / 1.00 / 0.36, algorithm
  106 ms, 0 binds failed: at 500 nodes the serial cycle bounds the rate.
  The agent's requests: pod status 1.0 a pod; leases and node status ~3.2-3.5 per node
  and minute, so more per pod in a longer run; NodeTopology status 0.3-0.6 per node and
  minute while pods change (0.11-0.25 a pod).

* the extender's bindings (``python bench/run.py fleet --nodes=250 --pods=5000``): its
  seven watches (NodeTopologies, bound and unbound pods, four DRA kinds) held seven of
  the ten connections of its one pool; a burst's bindings queued for the other three,
  gave up after 4 s (the API server answered them in 0.45 s at p99, once they reached it)
  and kube-scheduler bound the pod itself after waiting for us: 2,902 of 5,000 failed,
  scheduling attempt p50 4.85 s. A pool of 8 for them: 1,191 failed, 17.4 pods/s; of 32:
  0 failed, attempt p50 0.33 s, 14.8 -> 22.2 pods/s, create -> Running p50 45 -> 20 s,
  kube-scheduler's requests per pod 1.6 -> 1.0 (the extender's 1.0: the bindings);
* scheduling cycle at 500 nodes (``--nodes=500 --pods=2000 --modes=without,noop,with``,
  after): algorithm mean without 3.0 ms, noop 36.3 ms, with 72.3 ms (p99 21 / 123 / 238
  ms): the extender's share 69 ms a pod, 33 ms of it HTTP (100 nodes: 30.8 and 16.4);
  27.1, 19.7 and 13.7 pods/s; create -> Running p50 0.8, 1.3, 27 s; TAE per 1,000 pods
  12.5 without, 0 with; the extender's filter p50 27 ms, p99 117 ms (mean 30 ms,
  prioritize 16 ms); RSS operator 163 MiB, agent 134, extender 115, kube-apiserver 809;
* how each cost grows (fits over these runs; ours: the operator, the extender, the
  agent's NodeTopology writes):
  - one scheduler places pods at 1,000 / (algorithm mean) a second (22.6 predicted, 22.2
    measured at 250 nodes; 13.8 / 13.7 at 500): about 0.11 ms per node a pod, 0.07 of it
    the extender's decision (filter and prioritize: 28 ms at 250 nodes, 46 at 500), 0.04
    the HTTP of the node lists, kube-scheduler's own plugins ~0.01. At 5,000 nodes with
    ``percentageOfNodesToScore: 100``: ~0.6 s a pod, under 2 pods/s on these cores;
  - extender RSS: 17 KiB per node, ~20 KiB per pod placed (17-21 over the runs):
    5,000 nodes / 100,000 pods ~2 GiB; CPU 24-38 ms a pod;
  - operator RSS, before the cuts of ``python bench/run.py opmem``: ~75 KiB per node
    (idle 94 MiB at 100 nodes, 106 at 250, 121-125 at 500), 5-10 KiB per pod: 5,000 /
    100,000 ~1-1.4 GiB. What it held per node (the NodeTopology kept whole 41 KiB, the
    per-node gauges 19 KiB) and per pod (Kopf's memory 0.9 KiB) is now 5.7 KiB a node
    and ~0 a pod at rest (in-process, ~382 -> ~30 MiB at 5,000 / 100,000); at 100 /
    2,000 (one run each, idle cores, ``--modes=with``, main via ``--operator-source``):
    idle 92.9 -> 91.2 MiB, at the end 134.4 -> 124.5, after the finish round 144.6 ->
    135.4, CPU 18.7 -> 17.7 s; the rest of the growth over a run is transient (event
    bursts, LIST pages, scrapes); requests 0.33-0.37 per pod at every size (LIST of Failed pods for
    the redeploy gating 0.2, the pods' patches 0.09, policy status); CPU 12-18 ms a pod;
  - agent, one process emulating every node: 23 KiB per node, 32 KiB per pod (both
    runs); a real fleet runs one per node, holding that node's pods: flat in fleet size;
    its NodeTopology writes: ~1,500-3,000 a minute at 5,000 nodes under this churn;
  - kube-apiserver (not ours): ~0.4 MiB per node, 90-115 KiB per pod: ~11-13 GiB at
    5,000 / 100,000; CPU 29-46 ms a pod.

At 100 nodes / 2,000 pods (load 5-8, two other benchmark runs on the cores), ``python
bench/run.py fleet --nodes=100 --pods=2000 --modes=without,noop,with`` (35
fragmented-8numa, 30 dual-16core, 15 seed-figure1, 10 dgx-a100-like, 10 group4-gpu; 585
units: 902 pods from Deployments, 624 from Jobs, 474 bare), before the fixes named:

* with the extender: 17.1 pods/s; create -> Running p50 34.9 s, p99 54.9 s;
  TopologyAffinityErrors 2.0 per 1,000 pods (without 30.0, noop 20.5); extender filter
  p50 9.1 ms, p99 81 ms; RSS operator 156 MiB (idle 94), agent 156, extender 179; CPU
  over the run operator 21 s, agent 6.8 s, extender 37 s;
* without: 19.2 pods/s, create -> Running p50 1.7 s, p99 5.2 s; noop: 29.5 pods/s, 1.0 / 2.7 s;
* scheduling algorithm mean 1.9 ms without, 18.4 ms noop, 32.8 ms with: the extender
  30.8 ms a pod, 16.4 ms of it HTTP;
* the redeploy gating's LISTs of Failed pods (``--modes=without``, ``--operator-source``
  the tree before): 100 / 2,000: operator 1.74 -> 0.64 requests per pod (1,961 -> 548
  LISTs); 20 / 400: 1.09 -> 0.53 (343 -> 126);
* the extender's bind timing out (4 s) on the slow API server while the binding landed:
  945 scheduling attempts "error" (kube-scheduler's binder then got 409) before the fix;
  after (``--modes=with``): 74, create -> Running p50 6.5 s, p99 9.5 s, 19.0 pods/s, 0
  TopologyAffinityErrors, kube-scheduler 1.58 requests per pod, the extender 0.80.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_agent import agent_argv, stop
from bench_operator import _free_port
from bench_placement import (
    Extender,
    add_run_args,
    chosen_modes,
    prepare_cluster,
    print_decision,
)
from fleet_measure import (
    audit_flags,
    get_metrics,
    log_offset,
    proc_stats,
    read_audit,
    scheduler_summary,
)
from fleet_pods import Pods, watch_pods
from fleet_workload import LABEL, NAMESPACES, VALUE, Unit, bursts, policies, units
from numalign.api.kube import ApiError, Kube, load_config
from numalign.topology.machine import load_machine
from placement_workload import node_mix

MODES = ("with", "without", "noop")
HERE = Path(__file__).resolve().parent


def start_cluster(mode: str, workdir: Path, say: Any) -> tuple[Any, Path]:
    from numalign.devcluster.cluster import DevCluster

    cluster = DevCluster(state_dir=workdir / f"{mode}-cluster")
    flags, audit = audit_flags(workdir / f"{mode}-audit")
    cluster.apiserver_flags = flags
    cluster.up(scheduler_extender=mode != "without", extender=mode == "with", log=say)
    return cluster, audit


def start_noop(cluster: Any, workdir: Path) -> subprocess.Popen[bytes]:
    ext = cluster.state()["extender"]
    p = cluster.pki
    out = (workdir / "noop-extender.log").open("ab")
    proc = subprocess.Popen([sys.executable, str(HERE / "fleet_noop.py"),
                             "--port", str(ext["port"]), "--cert", str(p.extender_serving.cert),
                             "--key", str(p.extender_serving.key),
                             "--client-ca", str(p.extender_ca),
                             "--kubeconfig", str(cluster.kubeconfig)],
                            stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(
                ("127.0.0.1", int(ext["port"])), 1):
            return proc
        time.sleep(0.3)
    raise TimeoutError("the no-op extender did not listen")


async def create_units(kube: Kube, groups: list[list[Unit]], gap: float) -> None:
    sem = asyncio.Semaphore(16)

    async def one(u: Unit) -> None:
        async with sem:
            await kube.create(u.collection, u.manifest())

    for i, group in enumerate(groups):
        await asyncio.gather(*(one(u) for u in group))
        if i + 1 < len(groups):
            await asyncio.sleep(gap)


async def finish_round(kube: Kube, seen: Pods, wait: float) -> dict[str, Any]:
    """Finish every Job's pods (Succeeded, as when its container exits), then delete the
    Jobs and every finished pod of the bench (Failed ones included)."""
    items, _ = await kube.list_all("/api/v1/pods", {"labelSelector": f"{LABEL}={VALUE}"})
    done = 0
    for p in items:
        meta = p["metadata"]
        owners = [r.get("kind") for r in meta.get("ownerReferences") or []]
        if "Job" in owners and (p.get("status") or {}).get("phase") == "Running":
            with contextlib.suppress(ApiError):
                await kube.patch(f"/api/v1/namespaces/{meta['namespace']}/pods/"
                                 f"{meta['name']}/status",
                                 {"status": {"phase": "Succeeded"}})
                done += 1
    await asyncio.sleep(wait / 2)
    for ns in NAMESPACES:
        jobs, _ = await kube.list_all(f"/apis/batch/v1/namespaces/{ns}/jobs")
        for j in jobs:
            with contextlib.suppress(ApiError):
                await kube.delete(f"/apis/batch/v1/namespaces/{ns}/jobs/"
                                  f"{j['metadata']['name']}",
                                  {"propagationPolicy": "Background"})
    items, _ = await kube.list_all("/api/v1/pods", {"labelSelector": f"{LABEL}={VALUE}"})
    finished = [p for p in items
                if (p.get("status") or {}).get("phase") in ("Succeeded", "Failed")]
    for p in finished:
        meta = p["metadata"]
        with contextlib.suppress(ApiError):
            await kube.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                              {"gracePeriodSeconds": 0})
    await asyncio.sleep(wait / 2)
    return {"job_pods_finished": done, "finished_pods_deleted": len(finished),
            "pods_left": len(seen.live())}


async def run_mode(mode: str, cluster: Any, audit: Path, args: argparse.Namespace,
                   workdir: Path) -> dict[str, Any]:
    kubeconfig = str(cluster.kubeconfig)
    mix = node_mix(args.nodes)
    names = {f"{load_machine(f).name}-{i}" for f, c in mix for i in range(c)}
    logs: list[Any] = []

    def start(name: str, cmd: list[str], env: dict[str, str] | None = None
              ) -> subprocess.Popen[bytes]:
        out = (workdir / f"{mode}-{name}.log").open("ab")
        logs.append(out)
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

    noop = start_noop(cluster, workdir) if mode == "noop" else None
    agent = start("agent", agent_argv(kubeconfig, mix, "WARNING"))
    op_env = None
    if args.operator_source:
        op_env = dict(os.environ, PYTHONPATH=str(Path(args.operator_source).resolve()))
    operator = start("operator", [
        sys.executable, "-m", "numalign.cli", "operator", "--kubeconfig", kubeconfig,
        "--metrics-port", "0", "--recreate-bare-pods", "--webhook-port", str(_free_port()),
        "--cert-dir", str(workdir / f"{mode}-certs")], op_env)
    extender = Extender(f"{cluster.extender_probe_url}/metrics") if mode == "with" else None
    ext_pid = cluster.process("extender").pid if mode == "with" else None
    admin = cluster.pki.admin
    sched_url = cluster.metrics_url("kube-scheduler")
    kube = Kube(load_config(kubeconfig), max_connections=24, user_agent="numalign-bench")
    await kube.open()
    all_units = units(args.pods, args.seed)
    r: dict[str, Any] = {"mode": mode, "nodes": args.nodes, "pods": args.pods,
                         "units": len(all_units),
                         "machines": {load_machine(f).name: c for f, c in mix}}
    procs = {"operator": operator.pid, "agent": agent.pid, "extender": ext_pid,
             "kube-apiserver": cluster.process("kube-apiserver").pid,
             "kube-scheduler": cluster.process("kube-scheduler").pid}
    try:
        r["setup_s"] = await prepare_cluster(kube, names, extender, namespaces=NAMESPACES,
                                             policies=policies(), nodes_timeout=600,
                                             webhook_timeout=300)
        await asyncio.sleep(3.0)  # the operator's caches and webhook see the policies
        before = {k: proc_stats(pid) for k, pid in procs.items()}
        r["idle_rss_mib"] = {k: v.get("rss_mib") for k, v in before.items()}
        start_audit = log_offset(audit)
        seen = Pods()
        _, rv = await kube.list_all("/api/v1/pods", {"labelSelector": f"{LABEL}={VALUE}"})
        finished = asyncio.Event()
        watcher = asyncio.create_task(watch_pods(kube, rv, seen.on_event, finished.is_set))
        seen.first_create = t_start = time.monotonic()
        await create_units(kube, bursts(all_units, args.burst), args.gap)
        r["create_s"] = round(time.monotonic() - t_start, 1)
        seen.last_event = time.monotonic()
        deadline = t_start + args.timeout
        while time.monotonic() < deadline:
            if seen.running() >= args.pods or time.monotonic() - seen.last_event >= args.settle:
                break
            await asyncio.sleep(1.0)
        r["settled_s"] = round(time.monotonic() - t_start, 1)
        r["timed_out"] = time.monotonic() >= deadline
        end_audit = log_offset(audit)
        after = {k: proc_stats(pid) for k, pid in procs.items()}
        r["process"] = {k: {**after[k], "cpu_s": round(after[k].get("cpu_s", 0.0)
                                                      - before[k].get("cpu_s", 0.0), 1)}
                        for k in procs if after[k]}
        r.update(seen.summary(args.pods))
        r["api_requests"] = read_audit(audit, start_audit, end_audit).summary(args.pods)
        if extender is not None:
            r.update(await extender.latency())
        text = await asyncio.to_thread(get_metrics, str(sched_url), admin.cert, admin.key)
        r["scheduler"] = scheduler_summary(text)
        if args.finish_round:
            r["finish_round"] = await finish_round(kube, seen, args.settle)
            r["after_finish_rss_mib"] = {k: proc_stats(pid).get("rss_mib")
                                         for k, pid in procs.items()}
        finished.set()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        r["operator_alive"] = operator.poll() is None
        r["agent_alive"] = agent.poll() is None
    finally:
        await kube.close()
        for proc in (operator, agent, *((noop,) if noop is not None else ())):
            stop(proc)
        for out in logs:
            out.close()
    return r


def print_mode(r: dict[str, Any]) -> None:
    ours = {k: v for k, v in r["api_requests"].items() if k.startswith("numalign-")
            and k != "numalign-bench"}
    print(f"{r['mode']}: {r['nodes']} nodes {r['machines']}, {r['pods']} pods in "
          f"{r['units']} units (created in {r['create_s']} s, settled after "
          f"{r['settled_s']} s{', TIMED OUT' if r['timed_out'] else ''})")
    print(f"  scheduled         {r['pods_per_s_scheduled']} pods/s ({r['bound']} bound); "
          f"create -> Running p50 {r['create_to_running_p50_s']} s, p99 "
          f"{r['create_to_running_p99_s']} s; create -> bound p50 "
          f"{r['create_to_bound_p50_s']} s, p99 {r['create_to_bound_p99_s']} s")
    print(f"  at the end        {r['running']} Running, {r['pending']} Pending "
          f"{r['pending_reasons']}, {r['failed_live']} Failed {r['failed_reasons']}")
    print(f"  TopologyAffinityError {r['topology_affinity_errors']} "
          f"({r['tae_per_1000_pods']} per 1,000 pods)")
    if "extender_filter_p99_ms" in r:
        print(f"  extender filter   p50 {r['extender_filter_p50_ms']} ms, p99 "
              f"{r['extender_filter_p99_ms']} ms ({r['extender_filter_calls']} calls); "
              f"prioritize p50 {r['extender_prioritize_p50_ms']} ms, p99 "
              f"{r['extender_prioritize_p99_ms']} ms")
        print_decision(r, "  extender decision ")
    for name, st in r["process"].items():
        print(f"  {name:<17} RSS {st.get('rss_mib')} MiB (peak {st.get('peak_rss_mib')}), "
              f"CPU {st.get('cpu_s')} s over the run")
    for name, st in ours.items():
        print(f"  API requests {name}: {st['per_pod']}/pod ({st['requests']}: {st['reads']} "
              f"reads, {st['writes']} writes) {st['top']}")
    others = {k: v["per_pod"] for k, v in r["api_requests"].items() if k not in ours}
    print(f"  API requests of the others, per pod: {others}")
    s = r["scheduler"]
    a, g = s["attempt_scheduled"], s["algorithm"]
    print(f"  kube-scheduler    algorithm (filter, extenders, score) p50 {g['p50_ms']} ms, "
          f"p99 {g['p99_ms']} ms, mean {g['mean_ms']} ms over {g['count']}")
    print(f"  kube-scheduler    attempt (scheduled) p50 {a['p50_ms']} ms, p99 {a['p99_ms']} "
          f"ms, mean {a['mean_ms']} ms over {a['count']}; attempts {s['attempts']}; "
          + ", ".join(f"{k[6:]} mean {v['mean_ms']} ms" for k, v in s.items()
                      if k.startswith("point_")))
    if "finish_round" in r:
        print(f"  finished pods     {r['finish_round']}; RSS MiB at the end "
              f"{ {k: v.get('rss_mib') for k, v in r['process'].items()} } -> after "
              f"deleting them {r['after_finish_rss_mib']}")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench_fleet")
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--pods", type=int, default=10000)
    add_run_args(p, burst=500, gap=5.0, seed=18, modes="with",
                 modes_help="comma-separated: with (numalign's extender), without, noop")
    p.add_argument("--timeout", type=float, default=1800.0, help="per mode, after creation")
    p.add_argument("--no-finish-round", dest="finish_round", action="store_false",
                   help="skip finishing and deleting the finished pods at the end")
    p.add_argument("--operator-source", default="",
                   help="run the operator from this source tree (the folder holding "
                        "the numalign package): a before/after comparison")
    args, _ = p.parse_known_args(argv)
    modes = chosen_modes(p, args.modes, MODES)
    workdir = Path(tempfile.mkdtemp(prefix="numalign-bench-fleet-"))
    results: dict[str, dict[str, Any]] = {}

    def say(m: str) -> None:
        print(f"[devcluster] {m}", file=sys.stderr)

    for mode in modes:
        cluster, audit = start_cluster(mode, workdir, say)
        try:
            results[mode] = asyncio.run(run_mode(mode, cluster, audit, args, workdir))
        finally:
            with contextlib.suppress(OSError):  # the components' logs outlive the cluster
                shutil.copytree(cluster.state_dir / "logs", workdir / f"{mode}-logs")
            cluster.down()
        print_mode(results[mode])
    if {"with", "without", "noop"} <= set(results):
        for key in ("algorithm", "attempt_scheduled"):
            att = {m: results[m]["scheduler"][key]["mean_ms"] or 0.0 for m in results}
            print(f"  scheduling {key} mean: without {att['without']} ms, noop "
                  f"{att['noop']} ms, with {att['with']} ms: the extender's share "
                  f"{att['with'] - att['without']:.2f} ms, of it HTTP "
                  f"{att['noop'] - att['without']:.2f} ms")
    print(f"logs in {workdir}")
    print(json.dumps(results))
    return 0 if all(not r["timed_out"] and r["operator_alive"] and r["agent_alive"]
                    for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
