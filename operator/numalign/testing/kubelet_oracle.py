"""The kubelet itself as an oracle: run the kubelet-oracle binary (the kubelet's own
admission packages, built by ``numalign.devcluster.oracle_build``) on a machine and a
pod sequence, and compare its answers with the engine's.

The machine file is given to the kubelet as cadvisor's MachineInfo (what the kubelet
reads from cadvisor on a real node): NUMA nodes in the file's order with their memory
(regular memory plus the hugepages, which the memory manager subtracts), hugepages,
cores (sibling threads) with their sockets, and distance rows in the file's order.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from numalign.topology.machine import Machine
from numalign.topology.quantity import quantity_bytes
from numalign.topology.resourcefit import allocatable

JSON = dict[str, Any]


def machine_info(machine: Machine) -> JSON:
    """cadvisor's MachineInfo (JSON field names) for ``machine``."""
    nodes: list[JSON] = []
    sockets: set[int] = set()
    ids = machine.numa_ids
    for n in machine.numa_nodes:
        cores: dict[int, list[int]] = {}
        socket_of: dict[int, int] = {}
        for c in n.cpus:
            cpu = machine.cpus[c]
            cores.setdefault(cpu.core, []).append(c)
            socket_of[cpu.core] = cpu.socket
            sockets.add(cpu.socket)
        huge = [{"page_size": quantity_bytes(size) // 1024,
                 "num_pages": total // quantity_bytes(size)}
                for size, total in sorted(n.hugepages.items())]
        node: JSON = {
            "node_id": n.id,
            "memory": n.memory + sum(n.hugepages.values()),
            "hugepages": huge,
            "cores": [{"core_id": core, "thread_ids": sorted(threads),
                       "socket_id": socket_of[core]}
                      for core, threads in sorted(cores.items())],
        }
        if machine.distances is not None:
            node["distances"] = [machine.distances[n.id][j] for j in ids]
        nodes.append(node)
    return {"num_cores": len(machine.cpus), "num_sockets": max(1, len(sockets)),
            "num_physical_cores": len({c.core for c in machine.cpus.values()}),
            "memory_capacity": sum(n.memory for n in machine.numa_nodes),
            "topology": nodes}


def node_allocatable(machine: Machine) -> dict[str, str]:
    """The node's allocatable as quantities (what the engine's fit check counts)."""
    out: dict[str, str] = {}
    for res, v in allocatable(machine).items():
        out[res] = f"{v}m" if res == "cpu" else str(v)
    return out


class OracleError(RuntimeError):
    pass


def run_oracle(binary: Path, machine: Machine, policy: str, scope: str,
               options: Mapping[str, str], pods: Sequence[Mapping[str, Any]],
               timeout: float = 600) -> list[JSON]:
    """The kubelet's answer for each pod, in order (one dict per pod)."""
    doc = {"machine": machine_info(machine), "allocatable": node_allocatable(machine),
           "policy": policy, "scope": scope, "options": dict(options), "pods": list(pods)}
    proc = subprocess.run([str(binary)], input=json.dumps(doc), capture_output=True,
                          text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise OracleError(f"kubelet-oracle exited {proc.returncode}: {proc.stderr.strip()}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
