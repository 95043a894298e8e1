"""Benchmark of the Kubernetes clients on the local control plane: the agent's load.

The load: NPODS pods (held by a scheduling gate, so nothing else touches them), then
for each concurrency C: C pod GETs at once, C pod status merge PATCHes at once (what
the agent writes when it admits pods), and a LIST of all NPODS pods. Through:

- ``one``: numalign's one client (numalign.api.kube.Kube, asyncio on aiohttp), the
  baseline of the ratios;
- ``sync``: the official synchronous ``kubernetes`` client in a thread pool of C threads
  with a connection pool of C (what the operator's handlers used, at its best);
- ``asyncio``: ``kubernetes_asyncio`` (optional: ``pip install -e '.[bench]'``; the
  column is skipped when it is not installed).

Rounds alternate the clients (one, sync, asyncio, one, ...) so that load on the machine
falls on each alike; the median round is reported, with each client's time as a ratio
to the one client's in the same run (x2.0: twice as slow).

    python bench/run.py client [--quick]        # 300 pods, C = 64, 256 (quick: 100, 64)
    python bench/bench_client.py --pods 300 --concurrency 64 256 [--kubeconfig KC]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from numalign.api.kube import STRATEGIC_PATCH, ApiError, Kube, load_config

NS = "bench-client"
ROUNDS = 3
Op = Callable[[list[str], int], Awaitable[None]]


def _pod(i: int) -> dict[str, Any]:
    return {"metadata": {"name": f"p-{i}", "labels": {"app": "bench-client"}},
            "spec": {"schedulingGates": [{"name": "numalign.io/bench"}],
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}


def _status(seq: int) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": "numalign.io/Bench", "status": "True",
                                       "reason": "Bench", "message": f"round {seq}"}]}}


class OneClient:
    name = "one"

    def __init__(self, kubeconfig: str, concurrency: int) -> None:
        self.kube = Kube(load_config(kubeconfig), max_connections=concurrency)

    async def open(self) -> None:
        await self.kube.open()

    async def close(self) -> None:
        await self.kube.close()

    async def get(self, names: list[str], seq: int) -> None:
        await asyncio.gather(*(self.kube.get(f"/api/v1/namespaces/{NS}/pods/{n}")
                               for n in names))

    async def patch(self, names: list[str], seq: int) -> None:
        await asyncio.gather(*(self.kube.patch(f"/api/v1/namespaces/{NS}/pods/{n}/status",
                                               _status(seq), STRATEGIC_PATCH) for n in names))

    async def list(self, names: list[str], seq: int) -> None:
        items, _ = await self.kube.list_all(f"/api/v1/namespaces/{NS}/pods")
        assert len(items) >= len(names)


class SyncClient:
    """The official client, C threads, C pooled connections."""

    name = "sync"

    def __init__(self, kubeconfig: str, concurrency: int) -> None:
        from kubernetes import client, config

        conf = client.Configuration()
        config.load_kube_config(config_file=kubeconfig,  # type: ignore[no-untyped-call]
                                client_configuration=conf)
        conf.connection_pool_maxsize = concurrency
        self.api = client.ApiClient(conf)
        self.core: Any = client.CoreV1Api(self.api)
        self.pool = ThreadPoolExecutor(concurrency)

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        self.pool.shutdown()
        self.api.close()

    async def _all(self, fn: Callable[[str], Any], names: list[str]) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self.pool, fn, n) for n in names))

    async def get(self, names: list[str], seq: int) -> None:
        await self._all(lambda n: self.core.read_namespaced_pod(n, NS), names)

    async def patch(self, names: list[str], seq: int) -> None:
        body = _status(seq)
        await self._all(lambda n: self.core.patch_namespaced_pod_status(n, NS, body), names)

    async def list(self, names: list[str], seq: int) -> None:
        loop = asyncio.get_running_loop()
        res = await loop.run_in_executor(self.pool, lambda: self.core.list_namespaced_pod(NS))
        assert len(res.items) >= len(names)


class AsyncioClient:
    """kubernetes_asyncio, C pooled connections."""

    name = "asyncio"

    def __init__(self, kubeconfig: str, concurrency: int) -> None:
        self.kubeconfig = kubeconfig
        self.concurrency = concurrency
        self.api: Any = None
        self.core: Any = None

    async def open(self) -> None:
        from kubernetes_asyncio import client, config

        conf = client.Configuration()
        await config.load_kube_config(config_file=self.kubeconfig, client_configuration=conf)
        conf.connection_pool_maxsize = self.concurrency
        self.api = client.ApiClient(conf)
        self.core = client.CoreV1Api(self.api)

    async def close(self) -> None:
        await self.api.close()

    async def get(self, names: list[str], seq: int) -> None:
        await asyncio.gather(*(self.core.read_namespaced_pod(n, NS) for n in names))

    async def patch(self, names: list[str], seq: int) -> None:
        body = _status(seq)
        await asyncio.gather(*(self.core.patch_namespaced_pod_status(n, NS, body)
                               for n in names))

    async def list(self, names: list[str], seq: int) -> None:
        res = await self.core.list_namespaced_pod(NS)
        assert len(res.items) >= len(names)


def clients() -> list[type[Any]]:
    out: list[type[Any]] = [OneClient, SyncClient]
    try:
        import kubernetes_asyncio  # noqa: F401
    except ImportError:
        print("kubernetes_asyncio is not installed: its column is skipped "
              "(pip install -e '.[bench]')", file=sys.stderr)
    else:
        out.append(AsyncioClient)
    return out


async def _setup(kube: Kube, pods: int) -> list[str]:
    with contextlib.suppress(ApiError):
        await kube.create("/api/v1/namespaces", {"metadata": {"name": NS}})
    for _ in range(600):
        if await kube.get_or_none(f"/api/v1/namespaces/{NS}/serviceaccounts/default"):
            break
        await asyncio.sleep(0.1)
    sem = asyncio.Semaphore(32)

    async def make(i: int) -> None:
        async with sem:
            with contextlib.suppress(ApiError):
                await kube.create(f"/api/v1/namespaces/{NS}/pods", _pod(i))

    await asyncio.gather(*(make(i) for i in range(pods)))
    return [f"p-{i}" for i in range(pods)]


async def _timed(fn: Op, names: list[str], seq: int) -> float:
    t = time.perf_counter()
    await fn(names, seq)
    return time.perf_counter() - t


async def run_bench(kubeconfig: str, pods: int, concurrencies: list[int]) -> dict[str, Any]:
    kinds = clients()
    admin = Kube(load_config(kubeconfig), max_connections=32)
    await admin.open()
    result: dict[str, Any] = {"pods": pods, "rounds": ROUNDS,
                              "clients": [k.name for k in kinds], "runs": {}}
    try:
        names = await _setup(admin, pods)
        seq = 0
        for c in concurrencies:
            batch = names[:c] if c <= len(names) else (names * (c // len(names) + 1))[:c]
            opened = [k(kubeconfig, c) for k in kinds]
            for cl in opened:
                await cl.open()
            times: dict[str, dict[str, list[float]]] = {
                cl.name: {"get": [], "patch": [], "list": []} for cl in opened}
            try:
                for cl in opened:  # warm: connections made, first TLS handshakes done
                    await cl.get(batch[:c], 0)
                for _ in range(ROUNDS):
                    for cl in opened:
                        seq += 1
                        times[cl.name]["get"].append(await _timed(cl.get, batch, seq))
                        times[cl.name]["patch"].append(await _timed(cl.patch, batch, seq))
                        times[cl.name]["list"].append(await _timed(cl.list, names, seq))
            finally:
                for cl in opened:
                    await cl.close()
            result["runs"][str(c)] = {
                name: {op: round(statistics.median(v), 4) for op, v in ops.items()}
                for name, ops in times.items()}
    finally:
        with contextlib.suppress(ApiError):
            await admin.delete(f"/api/v1/namespaces/{NS}")
        await admin.close()
    return result


def report(result: dict[str, Any]) -> None:
    print(f"clients: {result['pods']} pods, median of {result['rounds']} alternating rounds; "
          "seconds per batch, ratio to the one client (baseline, same run)")
    for c, run in result["runs"].items():
        base = run["one"]
        print(f"  C={c}: {c} GETs at once, {c} status PATCHes at once, LIST of "
              f"{result['pods']} pods")
        for name, ops in run.items():
            cols = []
            for op in ("get", "patch", "list"):
                ratio = ops[op] / base[op] if base[op] > 0 else float("nan")
                cols.append(f"{op} {ops[op] * 1000:7.1f} ms (x{ratio:.2f})")
            print(f"    {name:<8} " + ", ".join(cols))
    print(json.dumps(result))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench_client")
    p.add_argument("--quick", action="store_true", help="100 pods, C=64")
    p.add_argument("--pods", type=int)
    p.add_argument("--concurrency", type=int, nargs="+")
    p.add_argument("--kubeconfig", help="use this cluster instead of starting one")
    args, _ = p.parse_known_args(argv)
    pods = args.pods or (100 if args.quick else 300)
    conc = args.concurrency or ([64] if args.quick else [64, 256])
    cluster = None
    kubeconfig = args.kubeconfig
    if kubeconfig is None:
        from numalign.devcluster.cluster import DevCluster

        cluster = DevCluster(state_dir=Path(tempfile.mkdtemp(prefix="numalign-bench-client-")))
        cluster.up(log=lambda m: print(f"[devcluster] {m}", file=sys.stderr))
        kubeconfig = str(cluster.kubeconfig)
    try:
        result = asyncio.run(run_bench(kubeconfig, pods, conc))
    finally:
        if cluster is not None:
            cluster.down()
    report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
