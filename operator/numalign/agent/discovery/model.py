"""What discovery finds (:class:`DiscoveredMachine` and its parts) and its errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
LOCAL_DISTANCE = 10
NVIDIA_SMI_TIMEOUT_S = 30.0
GPU_QUERY_ARGS = ["--query-gpu=index,uuid,pci.bus_id,memory.total,name",
                  "--format=csv,noheader,nounits"]
TOPO_ARGS = ["topo", "-m"]
PCI_DIR = "sys/bus/pci/devices"


class DiscoveryError(Exception):
    """Discovery cannot go on. ``str(err)`` is one line naming the file and the problem."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)


class NvidiaSmiError(DiscoveryError):
    """``nvidia-smi`` failed or printed something that cannot be parsed."""


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class HugePages:
    size_bytes: int
    pages: int

    @property
    def total_bytes(self) -> int:
        return self.size_bytes * self.pages


@dataclass
class DiscoveredNode:
    id: int
    cpus: list[int]
    memory_bytes: int
    hugepages: dict[str, HugePages] = field(default_factory=dict)  # "2Mi" -> pages


@dataclass
class CpuInfo:
    id: int
    numa: int
    socket: int | None  # physical_package_id; None when unknown
    core_id: int | None  # the kernel's core_id (unique within a package only)
    core: int  # machine-wide core: the smallest CPU id among its threads
    threads: list[int]  # the online CPUs of the same core, this one included


@dataclass
class PciDevice:
    address: str  # "0000:3b:00.0"
    numa_node: int | None  # None: no affinity (-1) or unknown
    has_numa_file: bool
    class_code: str | None = None  # "0x030200"
    vendor: str | None = None  # "0x10de"
    device: str | None = None  # "0x20b0"

    @property
    def vendor_device(self) -> str | None:
        if self.vendor is None or self.device is None:
            return None
        return f"{hex4(self.vendor)}:{hex4(self.device)}"


@dataclass
class GpuInfo:
    index: int
    uuid: str
    pci_bus_id: str  # sysfs form: "0000:07:00.0"
    memory_bytes: int | None
    name: str
    numa_node: int | None = None
    nvlinks: dict[int, int] = field(default_factory=dict)  # peer index -> number of links
    groups: dict[str, str] = field(default_factory=dict)  # level -> group id, outermost first

    @property
    def device_id(self) -> str:
        """The id the NVIDIA device plugin advertises (the UUID), else ``gpuN``."""
        return self.uuid if self.uuid else f"gpu{self.index}"


@dataclass
class DiscoveredMachine:
    root: str
    nodes: list[DiscoveredNode]
    cpus: dict[int, CpuInfo]
    distances: dict[int, dict[int, int]]  # row node -> column node -> distance
    pci: list[PciDevice]
    gpus: list[GpuInfo] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    numa_in_sysfs: bool = True  # False: no node directories, one node 0 was made up

    @property
    def numa_ids(self) -> list[int]:
        return [n.id for n in self.nodes]

    def to_json(self) -> dict[str, Any]:
        """The ``numalign discover`` document: ``numaNodes``, ``distances`` and ``pci`` as
        the command-line contract states them, then everything else under extra keys."""
        doc: dict[str, Any] = {
            "numaNodes": {
                str(n.id): {"cpus": sorted(n.cpus), "memoryBytes": n.memory_bytes}
                for n in self.nodes
            },
            "distances": {
                str(i): {str(j): d for j, d in row.items()} for i, row in self.distances.items()
            },
            "pci": {p.address: p.numa_node for p in self.pci if p.has_numa_file},
        }
        doc["hugepages"] = {
            str(n.id): {size: {"pages": hp.pages, "bytes": hp.total_bytes}
                        for size, hp in n.hugepages.items()}
            for n in self.nodes
        }
        doc["cpuTopology"] = {
            str(c.id): {"numaNode": c.numa, "socket": c.socket, "coreId": c.core_id,
                        "core": c.core, "threads": c.threads}
            for c in sorted(self.cpus.values(), key=lambda c: c.id)
        }
        doc["pciDevices"] = {
            p.address: {"numaNode": p.numa_node, "class": p.class_code, "vendor": p.vendor,
                        "device": p.device}
            for p in self.pci
        }
        doc["gpus"] = [
            {"index": g.index, "uuid": g.uuid, "pciBusId": g.pci_bus_id,
             "memoryBytes": g.memory_bytes, "name": g.name, "numaNode": g.numa_node,
             "nvlinks": {str(k): v for k, v in sorted(g.nvlinks.items())},
             "groups": dict(g.groups)}
            for g in self.gpus
        ]
        doc["numaInSysfs"] = self.numa_in_sysfs
        doc["warnings"] = list(self.warnings)
        return doc


def hex4(value: str) -> str:
    v = value.strip().lower()
    if v.startswith("0x"):
        v = v[2:]
    return v.rjust(4, "0")
