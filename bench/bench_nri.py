"""Benchmark of the agent's NRI plugin: what it adds to a container's creation.

A private containerd v2 (NRI enabled, its state in a temporary folder; the tests' helper
``tests/containerd_helpers.py``) creates containers through the CRI, timed from the
``CreateContainer`` call to its answer, without a plugin and with numalign's plugin
deciding with the engine (:class:`numalign.agent.nri.placer.EnginePlacer`: each pod admitted
under ``single-numa-node``), in alternating rounds. Prints p50/p99 of both and the
difference (the target: under 50 ms at p99). Needs root and the real node's binaries.

    python bench/run.py nri [--quick]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from bench_agent import pct
from criapi.runtime_v1 import api_pb2 as cri
from criapi.runtime_v1 import api_pb2_grpc as cri_grpc
from numalign.agent.nri.placer import EnginePlacer, PodView, kernel_memory_nodes
from numalign.agent.nri.plugin import NriPlugin
from numalign.api.resolved import Resolved
from numalign.devcluster.images import WORKLOAD_IMAGE, build_images
from numalign.topology.machine import machine_from_dict

REPO = Path(__file__).resolve().parents[1]


async def _round(rt: Any, c: Any, views: dict[str, PodView], n: int) -> list[float]:
    out = []
    for _ in range(n):
        uid = str(uuid.uuid4())
        name = f"b{uid[:8]}"
        res = {"requests": {"cpu": "100m", "memory": "16Mi"}}
        views[uid] = PodView({"metadata": {"name": name, "namespace": "b", "uid": uid},
                              "spec": {"containers": [{"name": "main", "resources": res}]}},
                             Resolved(policy="single-numa-node"))
        config = cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(name=name, uid=uid, namespace="b"),
            log_directory=str(c.dir / "logs" / name))
        config.linux.cgroup_parent = f"{c.cgroup_parent}/{name}"
        config.linux.security_context.namespace_options.network = cri.NODE
        sb = await rt.RunPodSandbox(cri.RunPodSandboxRequest(config=config), timeout=60)
        cc = cri.ContainerConfig(metadata=cri.ContainerMetadata(name="main"),
                                 image=cri.ImageSpec(image=WORKLOAD_IMAGE), log_path="m.log")
        t0 = time.perf_counter()
        await rt.CreateContainer(cri.CreateContainerRequest(
            pod_sandbox_id=sb.pod_sandbox_id, config=cc, sandbox_config=config), timeout=60)
        out.append(time.perf_counter() - t0)
        await rt.StopPodSandbox(cri.StopPodSandboxRequest(pod_sandbox_id=sb.pod_sandbox_id),
                                timeout=60)
        await rt.RemovePodSandbox(cri.RemovePodSandboxRequest(
            pod_sandbox_id=sb.pod_sandbox_id), timeout=60)
    return out


async def _measure(c: Any, per_round: int, rounds: int) -> dict[str, list[float]]:
    cpus = sorted(os.sched_getaffinity(0))
    machine = machine_from_dict({"name": "bench", "numaNodes": [
        {"id": i, "cpus": str(cpu), "memory": "1Gi"} for i, cpu in enumerate(cpus)]})
    views: dict[str, PodView] = {}
    admitted: list[str] = []
    placer = EnginePlacer(machine, views.get, memory_nodes=kernel_memory_nodes(),
                          on_admit=lambda uid, alloc: admitted.append(uid))
    times: dict[str, list[float]] = {"without plugin": [], "with plugin": []}
    async with grpc.aio.insecure_channel(f"unix://{c.socket}") as channel:
        rt = cri_grpc.RuntimeServiceStub(channel)
        await _round(rt, c, views, 2)  # warm up (image, snapshotter)
        for _ in range(rounds):
            times["without plugin"] += await _round(rt, c, views, per_round)
            plugin = NriPlugin(placer, socket_path=c.nri_socket, retry_s=0.1)
            run = asyncio.create_task(plugin.run())
            await asyncio.wait_for(plugin.synchronized.wait(), 30)
            times["with plugin"] += await _round(rt, c, views, per_round)
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            await asyncio.sleep(0.5)  # the runtime notices the plugin gone
    times["admitted by the engine"] = [float(len(admitted))]
    return times


def main(argv: list[str]) -> int:
    from containerd_helpers import Containerd, node_bin_dir_or_none

    bins = node_bin_dir_or_none()
    if os.geteuid() != 0 or bins is None:
        print("nri: skipped (needs root and the real node's containerd build)")
        return 0
    quick = "--quick" in argv
    with tempfile.TemporaryDirectory(prefix="nb") as tmp:
        c = Containerd(bins, Path(tmp))
        c.write_config()
        c.start()
        try:
            for archive in build_images(Path(tmp) / "images"):
                c.ctr("images", "import", "--no-unpack=false", str(archive), timeout=300)
            times = asyncio.run(_measure(c, 5 if quick else 15, 2 if quick else 4))
        finally:
            c.cleanup()
    admitted = int(times.pop("admitted by the engine")[0])
    print("CRI CreateContainer latency on a private containerd "
          f"({len(times['with plugin'])} containers each; the plugin's engine admitted "
          f"{admitted} pods)")
    for mode, xs in times.items():
        print(f"  {mode:<15} p50 {pct(xs, 50) * 1e3:7.1f} ms  p99 {pct(xs, 99) * 1e3:7.1f} ms"
              f"  mean {statistics.mean(xs) * 1e3:7.1f} ms")
    d50 = pct(times["with plugin"], 50) - pct(times["without plugin"], 50)
    d99 = pct(times["with plugin"], 99) - pct(times["without plugin"], 99)
    print(f"  plugin adds    p50 {d50 * 1e3:+7.1f} ms  p99 {d99 * 1e3:+7.1f} ms (target: < 50 ms)")
    return 0
