"""The operator's memory per node and per pod, in-process, against a baseline tree.

Each tree's operator (this one, and BASELINE: a git ref of this repository or an
operator source directory) runs in a child process of its own that holds what the
operator holds for a fleet of NODES nodes with PODS_PER_NODE pods each, fed as its watch
events and LISTs feed it:

- per node: the NodeTopology (the agent's status of a node of the placement bench's
  machine mix with its admitted pods, read back as JSON) and the Node (labels,
  annotations, a kubelet's status with its images) through the operator's event
  handlers' store feeds, and Kopf's memory of both objects;
- the per-node metrics after a refresh and a scrape;
- per pod: Kopf's memory of a live pod (kept until its DELETED event);
- the periodic resync: a LIST of every NodeTopology and Node (pages of 500, as the API
  server answers them) into the stores: the peak it adds.

Reported for both trees: bytes held (tracemalloc) and RSS growth (a second child without
tracemalloc), and the 5,000-node / 100,000-pod extrapolation of the holders measured.

    python bench/run.py opmem                            # 500 nodes, 20 pods a node, vs main
    python bench/run.py opmem --nodes=1000 --baseline=HEAD~3
    python bench/run.py opmem --baseline=DIR             # an operator source directory

Against main before these cuts (``--nodes=2000``, 17 pods admitted a node, 40,000 pods;
traced, RSS alike within noise):

  per node: NodeTopology + Node stores, Kopf's memory   41.2 KiB -> 5.7 KiB
    (the NodeTopology kept whole, ~80 % of it the admitted pods' placements;
    cache.slim_nt keeps what the readers use, admitted entries shared by policy/source)
  per node: the per-node metrics' gauge children        19.2 KiB -> 0 (computed at scrape;
    a scrape's peak 24 -> 25 MiB at 2,000 nodes)
  per live pod: Kopf's memory                           916 B -> 23 B (forgotten at rest)
  resync LIST of every NodeTopology and Node: peak      71 MiB -> 27 MiB (kept page by
    page; 18 -> 20 MiB at 500 nodes, one page)
  5,000 nodes / 100,000 pods, these holders at rest     ~382 MiB -> ~30 MiB
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _rss() -> tuple[int, int]:
    """VmRSS, VmHWM in bytes."""
    rss = hwm = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    return rss, hwm


def templates(per_node: int, seed: int) -> list[str]:
    """NodeTopologies of 20 nodes of the placement mix, each holding ~``per_node`` of the
    placement workload's pods, as JSON text."""
    from numalign.agent.state import NodeState
    from numalign.topology.machine import load_machine
    from placement_inprocess import admit, published, with_resolved
    from placement_workload import node_mix, workload

    rng = random.Random(seed)
    fill = workload(4000, seed + 1)
    out, k = [], 0
    for f, count in node_mix(20):
        machine = load_machine(f)
        for i in range(count):
            st = NodeState(f"{machine.name}-{i}", machine)
            for _ in range(per_node):
                k += 1
                admit(st, with_resolved(fill[k % len(fill)],
                                        f"{k:08x}-{rng.getrandbits(48):012x}"))
            out.append(json.dumps(published(st)))
    return out


def node_object(name: str) -> dict[str, Any]:
    """A Node as a kubelet publishes it (labels, annotations, status with images)."""
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
              "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "gpu.8x",
              "topology.kubernetes.io/zone": "zone-a", "topology.kubernetes.io/region": "r1",
              "numalign.io/pool": "gpu", "nvidia.com/gpu.present": "true"}
    images = [{"names": [f"registry.example/team/image-{i}@sha256:{i:064x}",
                         f"registry.example/team/image-{i}:v1.{i}"], "sizeBytes": 10**8 + i}
              for i in range(20)]
    conds = [{"type": t, "status": "False", "reason": f"No{t}", "message": f"no {t}",
              "lastHeartbeatTime": "2026-01-01T00:00:00Z",
              "lastTransitionTime": "2026-01-01T00:00:00Z"}
             for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"{name}-uid-0000-0000-000000000000",
                         "resourceVersion": "5", "labels": labels,
                         "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                         "volumes.kubernetes.io/controller-managed-attach-"
                                         "detach": "true"}},
            "spec": {"podCIDR": "10.0.0.0/24", "providerID": f"kind://{name}"},
            "status": {"capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                       "allocatable": {"cpu": "63", "memory": "500Gi", "pods": "110"},
                       "conditions": conds, "images": images,
                       "addresses": [{"type": "InternalIP", "address": "10.0.0.1"},
                                     {"type": "Hostname", "address": name}],
                       "nodeInfo": {"kubeletVersion": "v1.33.0", "osImage": "Linux",
                                    "containerRuntimeVersion": "containerd://2.1",
                                    "machineID": "0" * 32, "systemUUID": "0" * 32}}}


def pod_object(i: int, node: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"web-{i}", "namespace": "team", "resourceVersion": str(i),
                         "uid": f"{i:08x}-0000-4000-8000-000000000000"},
            "spec": {"nodeName": node}, "status": {"phase": "Running"}}


# ---------------------------------------------------------------------------- the child


def _peak_start(traced: bool) -> int:
    """Where a peak is measured from: bytes traced now (the peak reset), or VmHWM."""
    if traced:
        tracemalloc.reset_peak()
        return tracemalloc.get_traced_memory()[0]
    return _rss()[1]


def _peak(traced: bool) -> int:
    return tracemalloc.get_traced_memory()[1] if traced else _rss()[1]


class _Paged:
    """An API server answering LISTs a page at a time from JSON text (parsed per page, as
    a client reads them); its ``list_all`` is the tree's own."""

    def __init__(self, pages: dict[str, list[str]]) -> None:
        self.pages = pages

    async def get(self, path: str, params: Any = None) -> dict[str, Any]:
        i = int(dict(params or {}).get("continue") or 0)
        return dict(json.loads(self.pages[path.rstrip("/")][i]))


async def _child(args: argparse.Namespace) -> dict[str, Any]:
    from kopf._core.reactor.inventory import ResourceMemories
    from prometheus_client import REGISTRY, generate_latest

    from numalign.api.kube import NT_BASE, Kube
    from numalign.controller import cache, connection, metrics

    texts = json.loads(Path(args.templates).read_text())
    nodes, per_pod = args.nodes, args.nodes * args.pods_per_node

    def nt_text(i: int) -> str:
        return texts[i % len(texts)].replace('"name": "', f'"name": "n{i:05d}-', 1)

    node_text = json.dumps(node_object("NAME"))

    def page_texts(make: Any) -> list[str]:
        out = []
        for start in range(0, nodes, 500):
            items = ",".join(make(i) for i in range(start, min(nodes, start + 500)))
            more = start + 500 < nodes
            out.append(f'{{"items": [{items}], "metadata": {{"resourceVersion": "1", '
                       f'"continue": "{len(out) + 1 if more else ""}"}}}}')
        return out

    server = _Paged({NT_BASE.rstrip("/"): page_texts(nt_text),
                     "/api/v1/nodes": page_texts(
                         lambda i: node_text.replace("NAME", f"n{i:05d}"))})
    setattr(server, "list_all", Kube.list_all.__get__(server))  # noqa: B010
    connection.client = lambda: server  # type: ignore[assignment,return-value]
    try:  # the tree's own memories, forgotten at rest by its periodic pass
        from numalign.controller.memories import PrunedMemories
        memories: Any = PrunedMemories()
    except ImportError:
        memories = ResourceMemories()
    out: dict[str, Any] = {}

    def prune() -> None:  # as the periodic pass does
        if hasattr(memories, "prune"):
            memories.prune()

    gc.collect()
    if args.traced:
        tracemalloc.start()

    def held() -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0] if args.traced else _rss()[0]

    h0 = held()
    for i in range(nodes):
        nt = json.loads(nt_text(i))
        await memories.recall(nt, noticed_by_listing=True)
        cache.feed(cache.NODE_TOPOLOGIES, nt, None)
        node = json.loads(node_text.replace("NAME", f"n{i:05d}"))
        await memories.recall(node, noticed_by_listing=True)
        cache.feed(cache.NODES, node, None, cache.slim_labels)
        del nt, node
    out["node_stores_events_b"] = (held() - h0) / nodes
    prune()
    h1 = held()  # the nodes' Kopf memories at rest forgotten (a tree that does)
    out["node_stores_b"] = (h1 - h0) / nodes
    metrics.refresh_from_node_topologies(cache.node_topologies())
    gc.collect()
    before = _peak_start(args.traced)
    scrape = generate_latest(REGISTRY)
    out["scrape_peak_mib"] = (_peak(args.traced) - before) / 2**20
    out["scrape_kib"] = len(scrape) / 1024
    del scrape
    # the gauges (a tree that keeps them) after the first refresh; the scrape's part
    out["node_metrics_b"] = (held() - h1) / nodes
    h2 = held()
    for i in range(per_pod):
        await memories.recall(pod_object(i, f"n{i % nodes:05d}"), noticed_by_listing=True)
    h3 = held()
    out["pod_kopf_b"] = (h3 - h2) / per_pod
    prune()
    out["pod_kopf_rest_b"] = (held() - h2) / per_pod
    for i in range(per_pod):
        await memories.forget(pod_object(i, f"n{i % nodes:05d}"))
    h4 = held()
    out["pod_left_b"] = (h4 - h2) / per_pod
    before = _peak_start(args.traced)
    for store in (cache.NODE_TOPOLOGIES, cache.NODES):
        await store.fill()
    out["resync_peak_mib"] = (_peak(args.traced) - before) / 2**20
    metrics.refresh_from_node_topologies(cache.node_topologies())  # as the pass goes on
    out["held_mib"] = (held() - h0) / 2**20
    return out


# ---------------------------------------------------------------------------- the parent


def _baseline_tree(spec: str, workdir: Path) -> Path:
    """An operator source directory: ``spec`` itself, or ``operator/`` of git ref ``spec``."""
    if Path(spec).is_dir():
        return Path(spec).resolve()
    archive = workdir / "baseline.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), spec, "operator"],
                   check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(workdir / "baseline", filter="data")
    return workdir / "baseline" / "operator"


def _run_child(tree: Path, args: argparse.Namespace, tpl: Path, traced: bool
               ) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(HERE)]))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--templates", str(tpl),
           f"--nodes={args.nodes}", f"--pods-per-node={args.pods_per_node}"]
    if traced:
        cmd.append("--traced")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


ROWS = (("node_stores_events_b", "per node: NodeTopology + Node stores, Kopf memory", 1024,
         "KiB"),
        ("node_stores_b", "per node: the same after a periodic pass", 1024, "KiB"),
        ("node_metrics_b", "per node: metrics after a refresh and a scrape", 1024, "KiB"),
        ("scrape_peak_mib", "a scrape of /metrics: peak", 1, "MiB"),
        ("pod_kopf_b", "per live pod: Kopf memory after its event", 1, "B"),
        ("pod_kopf_rest_b", "per live pod: the same after a periodic pass", 1, "B"),
        ("pod_left_b", "per pod after its DELETED event", 1, "B"),
        ("resync_peak_mib", "resync LIST of every NodeTopology and Node: peak", 1, "MiB"),
        ("held_mib", "held after the resync", 1, "MiB"))


def _extrapolate(r: dict[str, Any], nodes: int = 5000, pods: int = 100_000) -> float:
    """MiB held for ``nodes`` / ``pods`` by what is measured here, at rest."""
    per_node = r["node_stores_b"] + r["node_metrics_b"]
    return float((per_node * nodes + r["pod_kopf_rest_b"] * pods) / 2**20)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench/run.py opmem")
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--pods-per-node", type=int, default=20)
    p.add_argument("--baseline", default="main",
                   help="a git ref of this repository or an operator source directory")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--templates", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(_child(args))))
        return 0
    with tempfile.TemporaryDirectory(prefix="numalign-opmem-") as tmp:
        work = Path(tmp)
        tpl = work / "nodetopologies.json"
        texts = templates(args.pods_per_node, args.seed)
        tpl.write_text(json.dumps(texts))
        admitted = sum(len(json.loads(t)["status"].get("admitted") or []) for t in texts)
        trees = {"baseline": _baseline_tree(args.baseline, work), "this tree": REPO / "operator"}
        res = {name: {"traced": _run_child(tree, args, tpl, True),
                      "rss": _run_child(tree, args, tpl, False)}
               for name, tree in trees.items()}
    print(f"operator memory, {args.nodes} nodes, {admitted / len(texts):.1f} pods admitted a "
          f"node (NodeTopology {sum(map(len, texts)) / len(texts) / 1024:.1f} KiB of JSON), "
          f"{args.nodes * args.pods_per_node} pods; baseline {args.baseline}")
    print(f"  {'':<52} {'baseline':>20} {'this tree':>20}")
    print(f"  {'':<52} {'traced / RSS':>20} {'traced / RSS':>20}")
    for key, label, div, unit in ROWS:
        cells = [f"{res[t]['traced'][key] / div:,.1f} / {res[t]['rss'][key] / div:,.1f} {unit}"
                 for t in trees]
        print(f"  {label:<52} {cells[0]:>20} {cells[1]:>20}")
    for t in trees:
        r = {**res[t]["traced"], "nodes": args.nodes}
        print(f"  {t}: 5,000 nodes / 100,000 pods ~{_extrapolate(r):,.0f} MiB held at rest "
              "(traced; the interpreter, Kopf and the libraries, the resync's peak and "
              "transient work come on top)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
