"""GPU group allocation speed on a synthetic 64-GPU machine with three group levels.

Run: ``python bench/run.py gpu [--quick]`` or ``python bench/bench_gpu.py``. Times are
CPU time per request. Target: allocate under 10 ms per request on the 64-GPU machine;
also reports hint generation, with 8 and with 64 NUMA nodes, and -- the baseline
measured in the same run -- the speed-up over exhaustive search (every combination,
scored alike; numalign.testing.gpu_bruteforce) on a 16-GPU machine it can finish.

``identical_requests``: one pod asking N one-GPU requests (``[{"count": 1}] * N``) on the
8-GPU fixture machines, per pod (allocate and hints, all devices free), against two
baselines measured in the same run: exhaustive search for N = 8 (``speedup``), and the
same GPUs asked as one request of count N (``versus_one_request``: how many times that
one request's cost the N requests cost; identical requests are searched as one class).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from numalign.testing.gpu_bruteforce import brute_force
from numalign.topology.gpu import allocate, hints, parse_gpu_requests, trees_of
from numalign.topology.machine import Machine, load_machine, machine_from_dict

MACHINES = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "machines"


def synthetic(numa_nodes: int = 8, gpus: int = 64) -> Machine:
    """2 sockets > 4 NVLink islands each > 4 PCIe switches each > 2 GPUs (+1 NIC each)."""
    per_numa = gpus // numa_nodes
    devices: list[dict[str, Any]] = []
    for g in range(gpus):
        groups = {"socket": f"s{g // 32}", "nvlink": f"nv{g // 8}", "pcie": f"sw{g // 2}"}
        devices.append({"resource": "nvidia.com/gpu", "id": f"gpu{g}",
                        "numaNode": g // per_numa, "memory": "40Gi" if g % 16 < 8 else "80Gi",
                        "groups": groups})
        if g % 2 == 0:
            devices.append({"resource": "nvidia.com/hca", "id": f"mlx5_{g // 2}",
                            "numaNode": g // per_numa, "groups": groups})
    nodes = [{"id": i, "cpus": f"{i * 4}-{i * 4 + 3}", "memory": "64Gi"}
             for i in range(numa_nodes)]
    return machine_from_dict({"name": f"synthetic-{gpus}gpu-{numa_nodes}numa",
                              "numaNodes": nodes, "devices": devices})


REQUESTS = [
    '[{"count": 1}]',
    '[{"count": 2, "sameGroup": "pcie"}]',
    '[{"count": 4, "sameGroup": "nvlink"}]',
    '[{"count": 8, "sameGroup": "nvlink", "minMemory": "60Gi"}]',
    '[{"count": 2, "withResource": "nvidia.com/hca"}]',
    '[{"count": 2, "sameGroup": "nvlink"}, {"count": 3}]',
    '[{"count": 3, "minMemory": "60Gi"}]',
]


def fill(machine: Machine, rng: random.Random) -> tuple[list[float], list[float], int]:
    """Admit random pods until one does not fit; per-request allocate and hint times."""
    free = {res: set(t.ids(t.all_mask)) for res, t in trees_of(machine).items()}
    alloc_t: list[float] = []
    hint_t: list[float] = []
    pods = 0
    while True:
        reqs = parse_gpu_requests(rng.choice(REQUESTS), machine)
        t0 = time.process_time()
        hs = hints(machine, free, reqs)
        hint_t.append((time.process_time() - t0) / len(reqs))
        if not hs:
            return alloc_t, hint_t, pods
        t0 = time.process_time()
        a = allocate(machine, free, reqs, hs[0].mask)
        alloc_t.append((time.process_time() - t0) / len(reqs))
        for res, ids in a.devices.items():
            free[res] -= set(ids)
        pods += 1


def report(name: str, xs: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in xs)
    return {"n": len(ms), "mean_ms": round(statistics.fmean(ms), 3),
            "p95_ms": round(ms[int(0.95 * (len(ms) - 1))], 3), "max_ms": round(ms[-1], 3)}


def run(rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for numa in (8, 64):
        m = synthetic(numa_nodes=numa)
        trees_of(m)
        rng = random.Random(1)
        allocs: list[float] = []
        hint_ts: list[float] = []
        for _ in range(rounds):
            a, h, _pods = fill(m, rng)
            allocs += a
            hint_ts += h
        out[m.name] = {"allocate_per_request": report("allocate", allocs),
                       "hints_per_request": report("hints", hint_ts)}
    return out


def _cpu_seconds(fn: Any, repeat: int) -> float:
    t0 = time.process_time()
    for _ in range(repeat):
        fn()
    return (time.process_time() - t0) / repeat


def versus_exhaustive(repeat: int) -> dict[str, Any]:
    """Allocation on an empty 16-GPU machine against exhaustive search, per request."""
    m = synthetic(numa_nodes=2, gpus=16)
    trees = trees_of(m)
    free_ids = {res: set(t.ids(t.all_mask)) for res, t in trees.items()}
    free_bits = {res: t.all_mask for res, t in trees.items()}
    out: dict[str, Any] = {}
    for text in REQUESTS:
        reqs = parse_gpu_requests(text, m)
        ours = _cpu_seconds(lambda r=reqs: allocate(m, free_ids, r, None), repeat * 20)
        base = _cpu_seconds(lambda r=reqs: brute_force(m, free_bits, r), max(1, repeat // 4))
        out[text] = {"allocate_ms": round(ours * 1000, 3), "exhaustive_ms": round(base * 1000, 3),
                     "speedup": round(base / ours, 1) if ours > 0 else None}
    return out


def identical_requests(repeat: int) -> dict[str, Any]:
    """N one-GPU requests in one pod on the 8-GPU fixture machines (see the docstring)."""
    return {name: _identical_on(load_machine(MACHINES / f"{name}.yaml"), repeat)
            for name in ("dgx1-like", "group8-gpu", "dgx-a100-like")}


def _identical_on(m: Machine, repeat: int) -> dict[str, Any]:
    free_bits = {res: t.all_mask for res, t in trees_of(m).items()}
    rows: dict[str, Any] = {}
    for n in (1, 2, 4, 8):
        reqs = parse_gpu_requests(json.dumps([{"count": 1}] * n), m)
        one = parse_gpu_requests(json.dumps([{"count": n}]), m)
        ours = _cpu_seconds(lambda r=reqs: allocate(m, None, r), repeat * 10)
        hint = _cpu_seconds(lambda r=reqs: hints(m, None, r), repeat * 10)
        single = _cpu_seconds(lambda r=one: allocate(m, None, r), repeat * 10)
        row: dict[str, Any] = {"allocate_ms": round(ours * 1000, 3),
                               "hints_ms": round(hint * 1000, 3),
                               "versus_one_request": round(ours / single, 1)}
        if n == 8:
            base = _cpu_seconds(lambda r=reqs: brute_force(m, free_bits, r), 1)
            row["exhaustive_ms"] = round(base * 1000, 3)
            row["speedup"] = round(base / ours, 1) if ours > 0 else None
        rows[f"{n}x1"] = row
    return rows


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    result = run(5 if quick else 20)
    result["versus_exhaustive_16gpu"] = versus_exhaustive(2 if quick else 8)
    result["identical_requests"] = identical_requests(1 if quick else 5)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
