"""GPU group allocation: NVLink islands, GPU memory and heterogeneous requests, aligned
with NUMA. Pure: no Kubernetes imports, no I/O.

Used only for pods with the ``numalign.io/gpus`` annotation (plain device counts go
through the ordinary device provider). The admission flow calls, in order::

    requests = parse_gpu_requests(pod_annotation, machine)      # TopologyError if bad
    gpu_hints = hints(machine, free, requests)                  # for the merge
    ...merge with the other providers' hints, pick the NUMA mask...
    alloc = allocate(machine, free, requests, mask)             # GpuAllocationError if not

API:

- ``parse_gpu_requests(text: str, machine: Machine | None = None) -> list[GpuRequest]``:
  parse and validate the annotation; errors name the field (``[1].sameGroup: ...``).
  Request keys: ``count``, ``minMemory``, ``sameGroup`` (a level, ``numa`` or ``any``),
  ``withResource`` (``"nvidia.com/hca"`` or ``{"resource", "count", "sameGroup"}``: devices
  in the same group as all the request's GPUs, default level ``pcie`` when both
  resources have it, else the request's ``sameGroup``, else ``numa``), ``name`` (default
  ``gpu-<index>``) and ``resource`` (default: the machine's ``*/gpu`` resource).
- ``hints(machine: Machine, free: FreeDevices, requests: Sequence[GpuRequest])
  -> list[TopologyHint]``: every returned mask holds a feasible allocation of all the
  requests; preferred iff its width is the least that could hold them on the whole
  machine (capacity). ``[]`` = cannot satisfy. Every mask is checked up to 8 NUMA nodes;
  past that, masks come from the NUMA nodes of candidate device sets (no 2^N walk).
- ``allocate(machine: Machine, free: FreeDevices, requests: Sequence[GpuRequest],
  mask: NumaMask | None = None, scorer: str | Scorer = "pack") -> GpuAllocation``:
  request name -> device ids (``.gpus``), ``withResource`` devices (``.attached``), all
  within ``mask``; raises ``GpuAllocationError`` (a ``TopologyError``) if they do not fit.
- ``FreeDevices``: ``None`` (all free), ``{resource: free ids}`` (a resource not listed is
  all free) or a flat collection of ids.
- Scorers: ``pack`` (default: tightest group first, then break the fewest and smallest
  whole groups) and ``spread``; add one with ``register_scorer`` (subclass ``Scorer``).

Devices carry ``groups`` (level -> id, outermost first); the group tree of a resource is
built by :func:`build_tree` with the NUMA node as an implicit innermost level.
"""

from .allocator import (
    FreeDevices,
    GpuAllocation,
    GpuAllocationError,
    allocate,
    hints,
    trees_of,
)
from .groups import ANY_LEVEL, NUMA_LEVEL, GroupTree, Node, build_tree
from .requests import (
    ANNOTATION,
    GpuRequest,
    WithResource,
    gpu_resource,
    parse_gpu_requests,
    resolve_requests,
)
from .scorers import (
    SCORERS,
    PackScorer,
    Scorer,
    SpreadScorer,
    get_scorer,
    register_scorer,
    score_allocation,
)

__all__ = [
    "ANNOTATION",
    "ANY_LEVEL",
    "NUMA_LEVEL",
    "SCORERS",
    "FreeDevices",
    "GpuAllocation",
    "GpuAllocationError",
    "GpuRequest",
    "GroupTree",
    "Node",
    "PackScorer",
    "Scorer",
    "SpreadScorer",
    "WithResource",
    "allocate",
    "build_tree",
    "get_scorer",
    "gpu_resource",
    "hints",
    "parse_gpu_requests",
    "register_scorer",
    "resolve_requests",
    "score_allocation",
    "trees_of",
]
