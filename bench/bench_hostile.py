"""The extender under a hostile client: RSS and filter latency of the scheduler's calls
while a client on the pod network sends its worst within the extender's limits, beside
the same calls without it, in one run.

Run: ``python bench/run.py hostile [--quick]``. The extender (the real server, its
limits at their defaults, 100 nodes of the sample machines, 40 pending pods as its
watch would hold them) runs in a child process on loopback; the parent plays the
scheduler (filter then prioritize for each pod, over one kept connection, as
kube-scheduler's client does) and, in the second half, the attacker:

- bodies just under ``--max-body-bytes`` made of tiny JSON values (refused by count);
- bodies just under it of valid JSON (a pod with a ~4 MiB annotation: parsed, then
  dropped, as the pod decided is the watched one);
- filters of made-up pods over every node (refused: not pending pods);
- filters under the real pods' uids with an empty spec (decided as the watched pods);
- filters of a real pod with eight one-GPU requests over the GPU nodes;
- slow requests: a head never finished, a body that never arrives, holding up to the
  listener's connection limit (closed by their deadlines, then opened again).

The attacker sends from 127.0.0.2, the scheduler from 127.0.0.1 (as a pod's address and a
control-plane host's differ).

The probes' listener is polled meanwhile (``/healthz``). Reported: the scheduler's
filter p50/p99, its failed calls, the extender's RSS (peak), ``/healthz`` p99, what
the attacker's requests got; the attacked run as a ratio of the quiet one.
Requests go only to 127.0.0.1, bounded in count and time.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

HERE = Path(__file__).resolve().parent
MACHINES = HERE.parent / "tests" / "fixtures" / "machines"
MIX = ["dual-16core", "fragmented-8numa", "group4-gpu", "group8-gpu", "dgx1-like"]
GPU_NODES = ("group8-gpu", "dgx1-like")
ATTACKER = "127.0.0.2"  # the attacker's address (a pod's), the scheduler's is 127.0.0.1


def _pod(i: int) -> dict[str, Any]:
    cpus = str(1 + i % 6)
    ann = {"numalign.io/resolved": json.dumps({
        "policy": ("single-numa-node", "best-effort", "restricted")[i % 3],
        "scope": "pod", "options": {}, "source": "pod"})}
    if i % 10 == 0:
        ann["numalign.io/gpus"] = json.dumps([{"name": f"g{k}", "count": 1}
                                              for k in range(8)])
    res = {"cpu": cpus, "memory": "1Gi", **({"nvidia.com/gpu": "8"} if i % 10 == 0 else {})}
    return {"metadata": {"name": f"p{i}", "namespace": "bench", "uid": f"uid-{i}",
                         "resourceVersion": "1", "annotations": ann},
            "spec": {"schedulerName": "default-scheduler", "containers": [
                {"name": "c", "resources": {"requests": res, "limits": res}}]},
            "status": {"phase": "Pending"}}


PODS = [_pod(i) for i in range(40)]


# ---------------------------------------------------------------- the child: the extender

def serve(port_file: str) -> None:
    from aiohttp import web
    from test_extender_decide import published

    from numalign.agent.state import NodeState
    from numalign.extender.fleet import Fleet
    from numalign.extender.guard import GuardedSite, Limits
    from numalign.extender.pending import PendingPods
    from numalign.extender.server import ExtenderServer
    from numalign.topology.machine import load_machine

    async def main() -> None:
        fleet = Fleet()
        fleet.budget = 2.0
        fleet.load_nodetopologies([
            published(NodeState(f"{m}-{i}", load_machine(MACHINES / f"{m}.yaml")), 1)
            for m in MIX for i in range(20)])
        fleet.load_pods([])
        pending = PendingPods()
        pending.load(PODS)
        limits = Limits()
        server = ExtenderServer(fleet, pending=pending, limits=limits)
        server.ready = True
        ports = []
        for app in (server.app(), server.probe_app()):
            runner = web.AppRunner(app, access_log=None, **limits.runner_args())
            await runner.setup()
            await GuardedSite(runner, "127.0.0.1", 0, limits).start()
            ports.append(int(runner.addresses[0][1]))
        Path(port_file).write_text(f"{ports[0]} {ports[1]} {limits.max_body} "
                                   f"{limits.max_connections}\n")
        await asyncio.Event().wait()

    asyncio.run(main())


# ---------------------------------------------------------------- the parent

def _rss(pid: int) -> tuple[float, float]:
    """VmRSS and VmHWM (peak) of ``pid``, MiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "VmHWM"):
            out[k] = int(v.split()[0]) / 1024
    return out["VmRSS"], out["VmHWM"]


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Run:
    def __init__(self) -> None:
        self.filter_ms: list[float] = []
        self.failed = 0
        self.why_failed: Counter[str] = Counter()
        self.health_ms: list[float] = []
        self.health_failed = 0
        self.attacks: Counter[str] = Counter()
        self.peak_rss = 0.0


async def scheduler(base: str, names: list[str], rounds: int, run: Run) -> None:
    conn = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=conn) as s:
        for _ in range(rounds):
            for p in PODS:
                t0 = time.perf_counter()
                try:
                    async with s.post(f"{base}/filter", json={"Pod": p, "NodeNames": names},
                                      timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        await resp.read()
                        ok = resp.status == 200
                    async with s.post(f"{base}/prioritize", json={
                            "Pod": p, "NodeNames": names},
                            timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        await resp.read()
                        ok = ok and resp.status == 200
                except (aiohttp.ClientError, TimeoutError) as e:
                    ok = False
                    run.why_failed[type(e).__name__] += 1
                run.filter_ms.append((time.perf_counter() - t0) * 1e3)
                run.failed += not ok


async def prober(base: str, stop: asyncio.Event, run: Run, pid: int) -> None:
    async with aiohttp.ClientSession() as s:
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                async with s.get(f"{base}/healthz", timeout=aiohttp.ClientTimeout(
                        total=5)) as resp:
                    await resp.read()
                    run.health_failed += resp.status != 200
            except (aiohttp.ClientError, TimeoutError):
                run.health_failed += 1
            run.health_ms.append((time.perf_counter() - t0) * 1e3)
            run.peak_rss = max(run.peak_rss, _rss(pid)[0])
            await asyncio.sleep(0.1)


async def attacker(base: str, port: int, names: list[str], gpu_names: list[str],
                   max_body: int, max_conns: int, stop: asyncio.Event, run: Run) -> None:
    tiny = b'{"Pod": [' + b"[]," * (max_body // 3 - 8) + b"[]]}"
    fat_pod = {**PODS[1], "metadata": {**PODS[1]["metadata"], "annotations": {
        "x": "y" * (max_body - 4096)}}}
    fat = json.dumps({"Pod": fat_pod, "NodeNames": names[:10]}).encode()
    forged = [{**p, "metadata": {**p["metadata"], "uid": f"made-up-{i}"}}
              for i, p in enumerate(PODS)]
    empty = [{**p, "spec": {"containers": [{"name": "c"}]}} for p in PODS]

    async def post(s: aiohttp.ClientSession, kind: str, body: bytes) -> None:
        try:
            async with s.post(f"{base}/filter", data=body, headers={
                    "Content-Type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=10)) as resp:
                await resp.read()
                run.attacks[f"{kind} -> {resp.status}"] += 1
        except (aiohttp.ClientError, TimeoutError) as e:
            run.attacks[f"{kind} -> {type(e).__name__}"] += 1

    async def flood(kind: str, bodies: list[bytes]) -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(
                local_addr=(ATTACKER, 0))) as s:
            i = 0
            while not stop.is_set():
                await post(s, kind, bodies[i % len(bodies)])
                i += 1

    async def slow() -> None:
        held: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        while not stop.is_set():
            held = [(r, w) for r, w in held if not r.at_eof()]  # closed by the server
            while len(held) < max_conns and not stop.is_set():
                try:
                    r, w = await asyncio.open_connection("127.0.0.1", port,
                                                         local_addr=(ATTACKER, 0))
                except OSError:
                    break
                w.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n{"
                        if len(held) % 2 else b"POST /filter HTTP/1.1\r\nHost: x\r\nX-A: ")
                held.append((r, w))
                run.attacks["slow connection opened"] += 1
            await asyncio.sleep(0.5)
        for _, w in held:
            w.close()

    gpu_args = json.dumps({"Pod": PODS[0], "NodeNames": gpu_names}).encode()
    await asyncio.gather(
        flood("tiny values", [tiny]), flood("large valid body", [fat]),
        flood("made-up pods", [json.dumps({"Pod": p, "NodeNames": names}).encode()
                               for p in forged]),
        flood("real uids, empty spec", [json.dumps({"Pod": p, "NodeNames": names}).encode()
                                        for p in empty]),
        flood("8 one-GPU requests", [gpu_args]), slow())


async def half(base: str, probe: str, port: int, pid: int, hostile: bool, rounds: int,
               max_body: int, max_conns: int) -> Run:
    names = [f"{m}-{i}" for m in MIX for i in range(20)]
    gpu_names = [n for n in names if n.startswith(GPU_NODES)]
    run = Run()
    stop = asyncio.Event()
    tasks = [asyncio.create_task(prober(probe, stop, run, pid))]
    if hostile:
        tasks.append(asyncio.create_task(attacker(base, port, names, gpu_names, max_body,
                                                  max_conns - 4, stop, run)))
        await asyncio.sleep(2)  # the attack under way
    try:
        await asyncio.wait_for(scheduler(base, names, rounds, run), 600)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    run.peak_rss = max(run.peak_rss, _rss(pid)[0])
    return run


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    rounds = 2 if quick else 5
    port_file = Path(f"/tmp/numalign-bench-hostile-{os.getpid()}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(HERE), str(HERE.parent / "tests"), str(HERE.parent / "tests" / "unit")])}
    child = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file)], env=env)
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            if time.monotonic() > deadline or child.poll() is not None:
                print("the extender did not start", file=sys.stderr)
                return 1
            time.sleep(0.2)
        port, probe_port, max_body, max_conns = (int(x) for x in port_file.read_text().split())
        base, probe = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{probe_port}"
        quiet = asyncio.run(half(base, probe, port, child.pid, False, rounds, max_body,
                                 max_conns))
        attacked = asyncio.run(half(base, probe, port, child.pid, True, rounds, max_body,
                                    max_conns))
        hwm = _rss(child.pid)[1]
    finally:
        child.kill()
        child.wait()
        port_file.unlink(missing_ok=True)

    print(f"numalign extender under a hostile client (100 nodes, {len(PODS)} pods x "
          f"{rounds} rounds of filter+prioritize; limits: {max_body >> 20} MiB bodies, "
          f"{max_conns} connections per listener)")
    print(f"{'':34} {'quiet':>10} {'attacked':>10} {'ratio':>7}")

    def row(label: str, a: float, b: float, fmt: str = "{:>10.1f}") -> None:
        ratio = b / a if a else float("nan")
        print(f"{label:34} {fmt.format(a)} {fmt.format(b)} {ratio:>6.2f}x")

    row("scheduler filter+prioritize p50 ms", _pct(quiet.filter_ms, .5),
        _pct(attacked.filter_ms, .5), "{:>10.2f}")
    row("scheduler filter+prioritize p99 ms", _pct(quiet.filter_ms, .99),
        _pct(attacked.filter_ms, .99), "{:>10.2f}")
    print(f"{'scheduler calls failed':34} {quiet.failed:>10} {attacked.failed:>10}  "
          + ", ".join(f"{k}: {n}" for k, n in sorted(attacked.why_failed.items())))
    row("extender RSS peak MiB (sampled)", quiet.peak_rss, attacked.peak_rss)
    print(f"{'extender VmHWM at the end MiB':34} {'':>10} {hwm:>10.1f}")
    row("/healthz p99 ms (probes listener)", _pct(quiet.health_ms, .99),
        _pct(attacked.health_ms, .99), "{:>10.2f}")
    print(f"{'/healthz failed':34} {quiet.health_failed:>10} {attacked.health_failed:>10}")
    print()
    print("the attacker's requests, by what they got:")
    for k, n in sorted(attacked.attacks.items()):
        print(f"  {k:44} {n:>8}")
    print(f"  mean filter {statistics.mean(attacked.filter_ms):.2f} ms attacked, "
          f"{statistics.mean(quiet.filter_ms):.2f} ms quiet")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        sys.exit(main(sys.argv[1:]))
