"""Node discovery: :mod:`.sysfs` (NUMA nodes, CPUs, memory, PCI devices), :mod:`.nvidia_smi`
(GPUs, NVLink, groups), :mod:`.machinefile` (the machine file and the engine's model);
:mod:`.model` holds what they share."""

from .machinefile import machine_dict, to_machine
from .model import (
    CpuInfo,
    DiscoveredMachine,
    DiscoveredNode,
    DiscoveryError,
    GpuInfo,
    NvidiaSmiError,
    PciDevice,
)
from .nvidia_smi import (
    TopoMatrix,
    attach_gpus,
    gpu_groups,
    nvlink_islands,
    parse_gpu_query,
    parse_topo_matrix,
    run_nvidia_smi,
)
from .sysfs import discover

__all__ = [
    "CpuInfo",
    "DiscoveredMachine",
    "DiscoveredNode",
    "DiscoveryError",
    "GpuInfo",
    "NvidiaSmiError",
    "PciDevice",
    "TopoMatrix",
    "attach_gpus",
    "discover",
    "gpu_groups",
    "machine_dict",
    "nvlink_islands",
    "parse_gpu_query",
    "parse_topo_matrix",
    "run_nvidia_smi",
    "to_machine",
]
