"""Benchmark: pod start latency on the real node, with and without numalign's NRI plugin.

A control plane and a numalign-managed real node (``numalign dev up --real-node --nri``:
the kubelet's CPU, memory and Topology managers at ``none``) start in temporary folders.
Guaranteed pods (1 CPU, the workload image) are created one after another, each deleted
before the next (the node has one CPU to give exclusively), in alternating rounds:

- *without*: no NRI plugin is registered (the real-node agent is stopped; containerd's log
  says the plugin's connection closed);
- *with*: the agent runs with ``--nri-socket`` and places every container (containerd's log
  says the plugin connected and synchronized).

Two numbers per pod:

- **pod start**: from the create call to the moment a watch sees the pod Running
  (what a user waits for);
- **container creation**: from the pod's sandbox task starting to its container's task
  starting, from containerd's own event timestamps (``ctr events``, nanoseconds) -- the
  span in which the runtime calls the plugin (RunPodSandbox, CreateContainer with its
  cpuset adjustment, StartContainer), with the kubelet's own steps in between; split at
  the container's creation (``/containers/create``): *to created* holds the
  CreateContainer call, *created to started* the start.

Prints p50/p99 of both, both ways, and what the plugin adds (target: < 50 ms at p99 to a
container's creation). Where this numalign's agent has no ``--nri-socket`` only *without*
is measured. Needs root, cgroups and the real node's binaries (``numalign dev build
--real-node``); otherwise it says so and measures nothing.

    python bench/run.py realnode-nri [--quick | --pods=N]
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench_agent import pct

WITHOUT, WITH = "without plugin", "with plugin"
NAMESPACE = "bench-nri"
METRICS = ("pod start", "container creation", "  to created", "  created to started")
CONNECTED = re.compile(r'plugin \\?"[^"\\]+\\?" connected and synchronized')
CLOSED = re.compile(r'connection to plugin \\?"[^"\\]+\\?" closed')


@dataclass
class Events:
    """containerd's events (``ctr events``) as they come: (topic, container id) -> time."""

    node: Any
    times: dict[tuple[str, str], float] = field(default_factory=dict)
    proc: subprocess.Popen[str] | None = None
    _reader: threading.Thread | None = None

    def start(self) -> Events:
        from numalign.devcluster.nodebuild import node_bin_dir

        argv = [str(node_bin_dir() / "ctr"), "--address", str(self.node.containerd_socket),
                "--namespace", "k8s.io", "events"]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            # "2026-11-30 23:20:01.123456789 +0000 UTC k8s.io /tasks/start {...}"
            parts = line.split(" ", 6)
            if len(parts) < 7 or parts[5] not in ("/tasks/start", "/containers/create"):
                continue
            with contextlib.suppress(ValueError):
                body = json.loads(parts[6])
                cid = str(body.get("container_id") or body.get("id") or "")
                self.times[(parts[5], cid)] = _timestamp(parts[0], parts[1], parts[2])

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)


def _timestamp(day: str, clock: str, offset: str) -> float:
    """containerd's "2026-11-30" "23:20:01.123456789" "+0000" as seconds since the epoch
    (the nanoseconds kept as a float's fraction)."""
    whole, _, frac = clock.partition(".")
    t = datetime.fromisoformat(f"{day}T{whole}{offset[:3]}:{offset[3:]}").timestamp()
    return t + (float(f"0.{frac}") if frac else 0.0)


def _pod(name: str, unplaced: bool) -> dict[str, Any]:
    """The guaranteed 1-CPU pod; ``unplaced``: it may start with no NRI plugin registered
    (the real node's containerd otherwise requires numalign's)."""
    from numalign.api.names import ANN_TOLERATE_UNPLACED
    from numalign.devcluster.images import WORKLOAD_IMAGE
    from numalign.devcluster.realnode_config import TAINT

    res = {"cpu": "1", "memory": "64Mi"}
    meta: dict[str, Any] = {"name": name}
    if unplaced:
        meta["annotations"] = {ANN_TOLERATE_UNPLACED: "true"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeSelector": {"kubernetes.io/hostname": "localhost"},
                     "tolerations": [{"key": TAINT["key"], "operator": "Exists"}],
                     "terminationGracePeriodSeconds": 0,
                     "automountServiceAccountToken": False,
                     "containers": [{"name": "work", "image": WORKLOAD_IMAGE,
                                     "imagePullPolicy": "Never",
                                     "resources": {"requests": res, "limits": res}}]}}


def _wait(what: str, ok: Callable[[], Any], timeout: float, every: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = ok()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


class Bench:
    def __init__(self, node: Any, core: Any) -> None:
        self.node = node
        self.core = core
        self.log = node.log_file("containerd")
        self.events = Events(node)
        self.running: queue.Queue[tuple[str, float]] = queue.Queue()
        self.seen_running: dict[str, float] = {}
        self.results: dict[str, dict[str, list[float]]] = {
            m: {k: [] for k in METRICS} for m in (WITHOUT, WITH)}

    # -- the plugin on and off, as containerd sees it

    def _plugin_lines(self) -> tuple[int, int]:
        text = self.log.read_text(errors="replace")
        return len(CONNECTED.findall(text)), len(CLOSED.findall(text))

    def plugin(self, on: bool) -> None:
        agent = self.node.process("agent")
        if on:
            connected, _ = self._plugin_lines()
            self.node.restart("agent")
            _wait("the agent's NRI plugin to connect to containerd",
                  lambda: self._plugin_lines()[0] > connected, 120, 0.2)
        else:
            agent.stop(timeout=10)
            _wait("no NRI plugin connected", lambda: (lambda c: c[0] == c[1])(
                self._plugin_lines()), 60, 0.2)

    # -- pods

    def _watch(self, stop: threading.Event) -> None:
        from kubernetes import watch

        w = watch.Watch()
        while not stop.is_set():
            with contextlib.suppress(Exception):
                for ev in w.stream(self.core.list_namespaced_pod, NAMESPACE, timeout_seconds=5):
                    pod = ev["object"]
                    if pod.status and pod.status.phase == "Running":
                        self.running.put((pod.metadata.name, time.time()))
                    if stop.is_set():
                        break

    def one(self, mode: str | None, name: str) -> None:
        """Create pod ``name``, time it until Running (recorded under ``mode``, unless
        None), delete it and wait until its CPU is free again."""
        t0 = time.time()
        self.core.create_namespaced_pod(NAMESPACE, _pod(name, unplaced=mode != WITH))

        def running() -> float | None:
            with contextlib.suppress(queue.Empty):
                while True:
                    n, t = self.running.get_nowait()
                    self.seen_running.setdefault(n, t)
            return self.seen_running.get(name)

        t1 = _wait(f"pod {name} Running", running, 180, 0.01)
        pod = self.core.read_namespaced_pod(name, NAMESPACE)
        uid = pod.metadata.uid
        app = str(pod.status.container_statuses[0].container_id).split("://", 1)[-1]
        sandbox = self._sandbox(uid)
        if mode is not None:
            self.results[mode]["pod start"].append(t1 - t0)
        try:
            keys = [("/tasks/start", sandbox), ("/containers/create", app),
                    ("/tasks/start", app)]
            t = _wait("containerd's events of the pod", lambda: (
                lambda ts: ts if all(ts) else None)([self.events.times.get(k) for k in keys]),
                10)
            if mode is not None:
                got = self.results[mode]
                got["container creation"].append(t[2] - t[0])
                got["  to created"].append(t[1] - t[0])
                got["  created to started"].append(t[2] - t[1])
        except TimeoutError:
            print(f"  ({name}: no containerd events for its sandbox or container)")
        self.core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
        _wait(f"pod {name} gone", lambda: not self._exists(name), 120, 0.1)
        # The kubelet stops the sandbox at once but removes it only at its next garbage
        # collection (up to a minute): remove it as that would (CRI RemovePodSandbox),
        # which is also where an NRI plugin gives the pod's CPUs back.
        _wait(f"pod {name}'s sandbox stopped", lambda: sandbox not in self._running_tasks(),
              120, 0.1)
        self._remove_sandbox(sandbox)
        _wait(f"pod {name}'s containers gone", lambda: not self._containers(uid), 120, 0.1)

    def _running_tasks(self) -> set[str]:
        proc = self.node.ctr("tasks", "list", timeout=30)
        return {f[0] for f in (line.split() for line in proc.stdout.splitlines()[1:])
                if len(f) >= 3 and f[2] == "RUNNING"}

    def _remove_sandbox(self, sandbox: str) -> None:
        import grpc

        from criapi.runtime_v1 import api_pb2 as cri
        from criapi.runtime_v1 import api_pb2_grpc as cri_grpc

        with grpc.insecure_channel(f"unix://{self.node.containerd_socket}") as channel:
            rt = cri_grpc.RuntimeServiceStub(channel)
            with contextlib.suppress(grpc.RpcError):  # the kubelet's GC may be first
                rt.RemovePodSandbox(cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox),
                                    timeout=60)

    def _exists(self, name: str) -> bool:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.read_namespaced_pod(name, NAMESPACE)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    def _containers(self, uid: str, kind: str = "") -> list[str]:
        sel = f'labels."io.kubernetes.pod.uid"=={uid}'
        if kind:
            sel += f',labels."io.cri-containerd.kind"=={kind}'
        proc = self.node.ctr("containers", "list", "--quiet", sel, timeout=30)
        return proc.stdout.split() if proc.returncode == 0 else []

    def _sandbox(self, uid: str) -> str:
        ids = self._containers(uid, "sandbox")
        return ids[0] if ids else ""

    def run(self, modes: list[str], rounds: int, per_round: int) -> None:
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch, args=(stop,), daemon=True)
        watcher.start()
        self.events.start()
        try:
            self.plugin(False)
            self.one(None, "warmup")  # the image's first unpack, the first sandbox
            n = 0
            for r in range(rounds):
                for mode in modes if r % 2 == 0 else list(reversed(modes)):
                    self.plugin(mode == WITH)
                    for _ in range(per_round):
                        n += 1
                        self.one(mode, f"p{n}")
                print(f"  round {r + 1}/{rounds} done", flush=True)
        finally:
            stop.set()
            self.events.stop()


def main(argv: list[str]) -> int:
    from numalign.devcluster.cluster import DevCluster
    from numalign.devcluster.nodebuild import node_bin_dir
    from numalign.devcluster.realnode import RealNode, cannot_run_containers
    from numalign.devcluster.realnode_config import MODE_NRI

    reason = cannot_run_containers()
    if reason is None and not (node_bin_dir() / "kubelet").is_file():
        reason = "the real node is not built (numalign dev build --real-node)"
    if reason is not None:
        print(f"realnode-nri: skipped ({reason})")
        return 0
    quick = "--quick" in argv
    rounds, per_round = (2, 3) if quick else (4, 10)
    for arg in argv:  # --pods=N: N pods each way, in 4 rounds
        if arg.startswith("--pods="):
            try:
                rounds, per_round = 4, max(1, int(arg.split("=", 1)[1]) // 4)
            except ValueError:
                print(f"realnode-nri: --pods: expected a number of pods, got {arg!r}")
                return 2
    machine = Path(__file__).resolve().parents[1] / "config/samples/realnode/realnode-2numa.yaml"
    cluster = DevCluster(Path(tempfile.mkdtemp(prefix="nb-rn-")), name="bench", ephemeral=True)
    say: Callable[[str], None] = lambda m: print(f"  [devcluster] {m}", file=sys.stderr)  # noqa: E731
    try:
        cluster.up(operator=False, log=say)
        node = RealNode(cluster, machine, mode=MODE_NRI).up(log=say, timeout=300)
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        _wait("the default service account", lambda: core.list_namespaced_service_account(
            NAMESPACE).items, 60, 0.2)
        argv_agent = (node.state().get("commands") or {}).get("agent", {}).get("argv") or []
        modes = [WITHOUT, WITH] if "--nri-socket" in argv_agent else [WITHOUT]
        bench = Bench(node, core)
        t0 = time.monotonic()
        bench.run(modes, rounds, per_round)
        elapsed = time.monotonic() - t0
    finally:
        cluster.down(log=say)
    _report(bench.results, modes, elapsed)
    return 0


def _report(results: dict[str, dict[str, list[float]]], modes: list[str],
            elapsed: float) -> None:
    n = len(results[WITHOUT]["pod start"])
    ways = "each way, alternating rounds" if len(modes) > 1 else "without the plugin"
    print(f"Pod start on the real node (realnode-2numa, nri mode), {n} guaranteed 1-CPU pods "
          f"{ways}, one at a time ({elapsed:.0f} s)")
    for metric in METRICS:
        print(f"  {metric}:")
        for mode in modes:
            xs = results[mode][metric]
            if xs:
                print(f"    {mode:<15} p50 {pct(xs, 50) * 1e3:8.1f} ms  p90 "
                      f"{pct(xs, 90) * 1e3:8.1f} ms  p99 {pct(xs, 99) * 1e3:8.1f} ms  "
                      f"mean {statistics.mean(xs) * 1e3:8.1f} ms  (n={len(xs)})")
        if WITH in modes and results[WITH][metric] and results[WITHOUT][metric]:
            w, wo = results[WITH][metric], results[WITHOUT][metric]
            d50, d99 = pct(w, 50) - pct(wo, 50), pct(w, 99) - pct(wo, 99)
            print(f"    plugin adds     p50 {d50 * 1e3:+8.1f} ms                p99 "
                  f"{d99 * 1e3:+8.1f} ms"
                  + ("  (target: < 50 ms)" if metric == "container creation" else ""))
    if WITH not in modes:
        print("  with plugin: not measured -- this numalign's agent has no --nri-socket "
              "(the NRI plugin is not wired into the real-node agent yet)")
