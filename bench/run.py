"""Benchmark runner: ``python bench/run.py [NAME...] [--quick]``.

Each benchmark is a module ``bench/bench_NAME.py`` (dashes in NAME as underscores) with
``main(argv) -> int``; register it in BENCHMARKS. Benchmarks print numbers; they are not
tests and assert no timings.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCHMARKS: dict[str, str] = {
    "agent": "emulated-node agent: 100 nodes, 2,000 pods; pods/s, bind-to-decision p50/p99, RSS",
    "merge": "Topology Manager merge: per-decision cost and speed-up over the cross product",
    "operator": "operator + agent: 100 nodes, 2,000 pods in 40 Deployments; resolution and "
                "redeploy latency p50/p99, operator RSS",
    "gpu": "GPU group allocation: allocate and hints per request, 64 GPUs, 3 group levels",
    "client": "Kubernetes clients under the agent's load (concurrent pod GETs, status "
              "PATCHes, a LIST): the one client against the official sync client (and "
              "kubernetes_asyncio when installed)",
    "nri": "NRI plugin: CRI CreateContainer latency on a private containerd, with and "
           "without the plugin (p50/p99)",
    "placement": "the same bursts of pods with and without the scheduler extender: "
                 "TopologyAffinityErrors per 1,000 pods, Running/Pending, create-to-Running "
                 "p50/p99, extender filter latency, in-process filter at 1,000 nodes, "
                 "a pod shape's first filter at 1,000/5,000 nodes against a baseline",
    "fleet": "the fleet at scale: 500 emulated nodes, 10,000 pods from Deployments, Jobs and "
             "bare pods in bursts, with the extender (or none, or a no-op one): pods/s, "
             "create-to-Running, TopologyAffinityErrors, RSS/CPU, API requests per pod by "
             "component, scheduling-cycle time",
    "opmem": "the operator's memory per node and per pod in-process (its stores, Kopf's "
             "memory, metrics, the resync's peak) against a baseline tree",
    "realnode-nri": "pod start and container creation on the NRI-managed real node, with "
                    "and without numalign's plugin (p50/p99)",
    "hostile": "the scheduler extender under a hostile client on loopback (forged pods, "
               "bodies at the limits, slow connections): filter p50/p99, RSS and /healthz "
               "beside the same calls without it",
    "nrt": "NodeResourceTopology freshness: pod admission to the NRT update that includes "
           "it (fingerprint-checked), p50/p99, 20 nodes, 400 pods at 20/s",
}


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    # the benchmarks' own modules, and the tests' helpers and CRI stubs (tests/criapi)
    sys.path[:0] = [str(here), str(here.parent / "tests")]
    flags = [a for a in argv if a.startswith("-")]
    names = [a for a in argv if not a.startswith("-")] or list(BENCHMARKS)
    if "-h" in flags or "--help" in flags:
        print(__doc__)
        for name, text in BENCHMARKS.items():
            print(f"  {name:<10} {text}")
        return 0
    status = 0
    for name in names:
        if name not in BENCHMARKS:
            print(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}", file=sys.stderr)
            return 2
        module = importlib.import_module(f"bench_{name.replace('-', '_')}")
        status |= int(module.main(flags))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
