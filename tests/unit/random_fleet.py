"""Random fleets and pods for the extender's differential test
(tests/unit/test_extender_differential.py): the fixture machines and synthetic ones (1-8
NUMA nodes, SMT or not, GPUs in NVLink pairs, NICs), node defaults, and pods with
policies, scopes and options of their own or none, Guaranteed and Burstable, init
containers and sidecars, devices, hugepages and GPU group requests. Everything is drawn
from the ``random.Random`` given: a seed replays it."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import testdata
from numalign.api.names import ANN_GPUS, ANN_RESOLVED
from numalign.topology.machine import Machine, load_machine, machine_from_dict
from numalign.topology.pod import is_extended
from numalign.topology.policies import kubelet_names

JSON = dict[str, Any]

FIXTURES = sorted(p for p in testdata.MACHINES.glob("*.yaml"))
KUBELET_POLICIES = kubelet_names()
SCOPES = ("container", "pod")
GPU = "nvidia.com/gpu"

_MACHINES: dict[str, Machine] = {}


@dataclass(frozen=True)
class Mix:
    """What the random pods may have: init containers and sidecars; the
    ``maxAllowableNumaNodes`` values their policies may give (below a machine's NUMA
    node count the engine refuses the policy on it)."""

    init_containers: bool = True
    max_allowable: tuple[int, ...] = (8, 16, 64)


FULL = Mix()


def fixture_machine(rng: random.Random) -> Machine:
    path = rng.choice(FIXTURES)
    if path.name not in _MACHINES:
        _MACHINES[path.name] = load_machine(path)
    return _MACHINES[path.name]


def synthetic_machine(rng: random.Random, index: int) -> Machine:
    """1-8 NUMA nodes (ids sparse at times, a CPU-less one at times), 1-6 cores each with
    one or two threads, one or two sockets, hugepages at times, GPUs in NVLink pairs
    and NICs on NUMA nodes (a device without one at times)."""
    count = rng.randint(1, 8)
    ids = sorted(rng.sample(range(16), count)) if rng.random() < 0.3 else list(range(count))
    smt = rng.choice((1, 2))
    cores = [0 if (len(ids) > 1 and rng.random() < 0.1) else rng.randint(1, 6) for _ in ids]
    if not any(cores):
        cores[0] = 2
    total_cores = sum(cores)
    nodes: list[JSON] = []
    first = 0
    for nid, n in zip(ids, cores, strict=True):
        cpus = list(range(first, first + n))
        if smt == 2:
            cpus += [c + total_cores for c in cpus]
        first += n
        node: JSON = {"id": nid, "cpus": ",".join(map(str, cpus)),
                      "memory": f"{rng.choice((2, 4, 8, 16))}Gi"}
        if rng.random() < 0.25:
            node["hugepages"] = {"2Mi": f"{rng.choice((256, 512, 1024))}Mi"}
        nodes.append(node)
    sockets = 2 if len(ids) > 1 and rng.random() < 0.5 else 1
    socket_of = {nid: (i * sockets) // len(ids) for i, nid in enumerate(ids)}
    distances = [[10 if a == b else (rng.choice((11, 12, 16)) if socket_of[a] == socket_of[b]
                                     else rng.choice((20, 21, 32)))
                  for b in ids] for a in ids]
    for i in range(len(ids)):  # symmetric
        for j in range(i):
            distances[i][j] = distances[j][i]
    devices: list[JSON] = []
    for k in range(rng.choice((0, 0, 2, 4, 6))):
        devices.append({"resource": GPU, "id": f"gpu{k}",
                        "numaNode": None if rng.random() < 0.05 else rng.choice(ids),
                        "memory": f"{rng.choice((8, 16, 40))}Gi",
                        "groups": {"nvlink": f"nv{k // 2}"}})
    for k in range(rng.choice((0, 1, 2))):
        devices.append({"resource": "example.com/nic", "id": f"nic{k}",
                        "numaNode": rng.choice(ids)})
    doc = {"name": f"synthetic-{index}", "numaNodes": nodes, "distances": distances,
           "cpuTopology": {"threadsPerCore": smt,
                           "sockets": [{"id": s, "numaNodes": [n for n in ids
                                                               if socket_of[n] == s]}
                                       for s in range(sockets)]},
           "devices": devices}
    return machine_from_dict(doc, source=f"synthetic machine {index}")


def random_options(rng: random.Random, mix: Mix) -> JSON:
    out: JSON = {}
    if rng.random() < 0.3:
        out["preferClosestNumaNodes"] = rng.random() < 0.7
    if rng.random() < 0.1:
        out["maxAllowableNumaNodes"] = rng.choice(mix.max_allowable)
    return out


def random_resolved(rng: random.Random, mix: Mix) -> str | None:
    """The pod's ``numalign.io/resolved``: mostly a policy of its own, at times none (the
    node default applies), deferred, or malformed."""
    r = rng.random()
    if r < 0.15:
        return None
    if r < 0.2:
        return json.dumps({"policy": None, "scope": None, "source": "node-default"})
    if r < 0.23:
        return "{not json"
    return json.dumps({"policy": rng.choice(KUBELET_POLICIES), "scope": rng.choice(SCOPES),
                       "options": random_options(rng, mix), "source": "TopologyPolicy/diff"})


def random_spec(rng: random.Random, generation: int, mix: Mix) -> JSON:
    """A node default (``NodeTopology.spec``), at times none."""
    if rng.random() < 0.2:
        return {}
    return {"policy": rng.choice(KUBELET_POLICIES), "scope": rng.choice(SCOPES),
            "options": random_options(rng, mix), "policyGeneration": generation}


def _container(rng: random.Random, name: str, guaranteed: bool, devices: list[str],
               restart: bool = False) -> JSON:
    res: JSON
    if guaranteed:
        cpu = str(rng.choice((1, 1, 2, 2, 3, 4, 6, 8))) if rng.random() < 0.85 else \
            rng.choice(("500m", "1500m"))
        res = {"cpu": cpu, "memory": f"{rng.choice((64, 256, 1024, 3072))}Mi"}
        if rng.random() < 0.1:
            res["hugepages-2Mi"] = f"{rng.choice((2, 128, 512))}Mi"
    else:
        res = {"cpu": rng.choice(("50m", "200m", "1")), "memory": "64Mi"}
    if devices and rng.random() < 0.35:
        res[rng.choice(devices)] = str(rng.choice((1, 1, 2)))
    limits = dict(res) if guaranteed else {k: v for k, v in res.items() if is_extended(k)}
    c: JSON = {"name": name, "image": "pause",
               "resources": {"requests": res, **({"limits": limits} if limits else {})}}
    if restart:
        c["restartPolicy"] = "Always"
    return c


def random_pod(rng: random.Random, index: int, devices: list[str], gpu_levels: list[str],
               managed: bool, mix: Mix = FULL) -> JSON:
    """A pod; ``managed``: one for a numalign-managed node (no device resources)."""
    devices = [] if managed else devices
    guaranteed = rng.random() < 0.75
    containers = [_container(rng, f"c{i}", guaranteed, devices)
                  for i in range(rng.choice((1, 1, 1, 2, 3)))]
    init: list[JSON] = []
    if rng.random() < 0.2:
        init.append(_container(rng, "init", guaranteed, devices))
    if rng.random() < 0.1:
        init.append(_container(rng, "sidecar", guaranteed, devices, restart=True))
    if not mix.init_containers:
        init = []
    ann: JSON = {}
    resolved = random_resolved(rng, mix)
    if resolved is not None:
        ann[ANN_RESOLVED] = resolved
    if GPU in devices and rng.random() < 0.25:
        count = rng.choice((1, 2))
        request: JSON = {"count": count}
        if rng.random() < 0.6:
            request["sameGroup"] = rng.choice([*gpu_levels, "numa", "any"])
        if rng.random() < 0.3:
            request["minMemory"] = rng.choice(("8Gi", "16Gi", "40Gi"))
        ann[ANN_GPUS] = json.dumps([request])
        res = containers[0]["resources"]
        for part in ("requests", "limits"):
            res.setdefault(part, {})[GPU] = str(count)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{index}", "namespace": rng.choice(("a", "b")),
                         "uid": f"uid-{index}", "annotations": ann},
            "spec": {"containers": containers,
                     **({"initContainers": init} if init else {})}}
