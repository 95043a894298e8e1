"""GPUs from ``nvidia-smi``: the GPU query, the ``topo -m`` matrix, NVLink islands and
PCIe groups, and attaching them to a discovered machine."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .model import (
    GPU_QUERY_ARGS,
    NVIDIA_SMI_TIMEOUT_S,
    PCI_DIR,
    TOPO_ARGS,
    DiscoveredMachine,
    GpuInfo,
    NvidiaSmiError,
)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
_CELL = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|CPU|N/A|NA)$")
_TRAILERS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def _clean(text: str) -> str:
    return _ANSI.sub("", text).replace("\r", "")


def _bus_id_to_sysfs(bus_id: str) -> str:
    """nvidia-smi's "00000000:07:00.0" as sysfs names it: "0000:07:00.0"."""
    m = re.match(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$",
                 bus_id.strip())
    if not m:
        raise ValueError(f"{bus_id!r} is not a PCI bus id like 00000000:07:00.0")
    dom = int(m.group(1), 16)
    return f"{dom:04x}:{m.group(2).lower()}:{m.group(3).lower()}.{m.group(4)}"


def parse_gpu_query(text: str, source: str = "nvidia-smi --query-gpu") -> list[GpuInfo]:
    """Parse ``nvidia-smi --query-gpu=index,uuid,pci.bus_id,memory.total,name
    --format=csv,noheader,nounits`` (memory in MiB)."""
    gpus: list[GpuInfo] = []
    for lineno, line in enumerate(_clean(text).splitlines(), 1):
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",", 4)]
        if len(parts) != 5:
            raise NvidiaSmiError(source, f"line {lineno}: expected 5 comma-separated fields "
                                         f"(index, uuid, pci.bus_id, memory.total, name), "
                                         f"got {line.strip()[:80]!r}")
        idx_s, uuid, bus, mem_s, name = parts
        if not idx_s.isdigit():
            raise NvidiaSmiError(source, f"line {lineno}: index {idx_s!r} is not a number")
        try:
            bus_sys = _bus_id_to_sysfs(bus)
        except ValueError as e:
            raise NvidiaSmiError(source, f"line {lineno}: {e}") from None
        mem: int | None
        mem_clean = mem_s.removesuffix("MiB").strip()
        if mem_clean.isdigit():
            mem = int(mem_clean) * 2**20
        elif mem_clean.startswith("[") or mem_clean in ("N/A", ""):
            mem = None  # "[N/A]", "[Not Supported]"
        else:
            raise NvidiaSmiError(source, f"line {lineno}: memory.total {mem_s!r} is not a "
                                         f"number of MiB")
        if uuid.startswith("[") or uuid == "N/A":
            uuid = ""
        gpus.append(GpuInfo(index=int(idx_s), uuid=uuid, pci_bus_id=bus_sys,
                            memory_bytes=mem, name=name))
    if len({g.index for g in gpus}) != len(gpus):
        raise NvidiaSmiError(source, "a GPU index is listed twice")
    return gpus


@dataclass
class TopoMatrix:
    labels: list[str]  # column labels in order: "GPU0", ..., "NIC0" / "mlx5_0", ...
    cells: dict[str, dict[str, str]]  # row label -> column label -> "NV12" / "PIX" / "X" ...
    cpu_affinity: dict[str, str] = field(default_factory=dict)
    numa_affinity: dict[str, int | None] = field(default_factory=dict)
    nic_names: dict[str, str] = field(default_factory=dict)  # "NIC0" -> "mlx5_0"

    def gpu_indices(self) -> list[int]:
        return [int(lbl[3:]) for lbl in self.labels if re.fullmatch(r"GPU\d+", lbl)]

    def link(self, a: str, b: str) -> str | None:
        v = self.cells.get(a, {}).get(b)
        w = self.cells.get(b, {}).get(a)
        return v if v is not None else w


def parse_topo_matrix(text: str, source: str = "nvidia-smi topo -m") -> TopoMatrix:
    """Parse ``nvidia-smi topo -m``: tab or space separated, with or without the ANSI
    underline on the header, with or without NIC rows, ``NUMA Affinity`` and
    ``GPU NUMA ID`` columns."""
    lines = _clean(text).splitlines()
    header_at = None
    for i, line in enumerate(lines):
        toks = line.split()
        if toks and toks[0] == "GPU0" and (line[:1].isspace() or (len(toks) > 1
                                                                   and toks[1] != "X")):
            header_at = i
            break
    if header_at is None:
        raise NvidiaSmiError(source, "no header line with GPU0 found: not the output of "
                                     "'nvidia-smi topo -m'")
    header = lines[header_at].strip()
    fields = [f for f in re.split(r"\t+| {2,}", header) if f.strip()]
    labels: list[str] = []
    trailers: list[str] = []
    for f in fields:
        f = f.strip()
        if f in _TRAILERS or trailers:
            trailers.append(f)
            continue
        # a space-separated header cannot be told from "CPU Affinity" by width: split it
        for tok in f.split():
            if tok in ("CPU", "NUMA", "GPU") or trailers:
                trailers.append(tok)
            else:
                labels.append(tok)
    if not labels:
        raise NvidiaSmiError(source, "the header names no devices")
    if len(set(labels)) != len(labels):
        raise NvidiaSmiError(source, f"the header repeats a device: {labels}")
    has_numa = "NUMA" in " ".join(trailers)
    cells: dict[str, dict[str, str]] = {}
    cpu_aff: dict[str, str] = {}
    numa_aff: dict[str, int | None] = {}
    nic_names: dict[str, str] = {}
    label_set = set(labels)
    for lineno, line in enumerate(lines[header_at + 1:], header_at + 2):
        toks = line.split()
        if not toks:
            continue
        m = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", line)
        if m:
            nic_names[m.group(1)] = m.group(2)
            continue
        if toks[0].rstrip(":") == "Legend":
            continue
        if toks[0] not in label_set:
            continue
        row = toks[0]
        if row in cells:
            raise NvidiaSmiError(source, f"line {lineno}: row {row} is listed twice")
        vals = toks[1:]
        if len(vals) < len(labels):
            raise NvidiaSmiError(source, f"line {lineno}: row {row} has {len(vals)} cells, "
                                         f"expected {len(labels)}")
        rowcells: dict[str, str] = {}
        for lbl, v in zip(labels, vals[:len(labels)], strict=True):
            if not _CELL.match(v):
                raise NvidiaSmiError(source, f"line {lineno}: row {row}, column {lbl}: "
                                             f"unknown link {v!r}")
            rowcells[lbl] = v
        cells[row] = rowcells
        extra = vals[len(labels):]
        if extra:
            cpu_aff[row] = extra[0]
        if has_numa and len(extra) >= 2:
            numa_aff[row] = int(extra[1]) if extra[1].isdigit() else None
    missing = [lbl for lbl in labels if lbl.startswith("GPU") and lbl not in cells]
    if missing:
        raise NvidiaSmiError(source, f"no rows for {', '.join(missing)}")
    return TopoMatrix(labels=labels, cells=cells, cpu_affinity=cpu_aff,
                      numa_affinity=numa_aff, nic_names=nic_names)


def _nv_links(cell: str | None) -> int:
    if cell and cell.startswith("NV") and cell[2:].isdigit():
        return int(cell[2:])
    return 0


def nvlink_islands(topo: TopoMatrix) -> list[list[int]]:
    """Partition the GPUs linked by NVLink into islands: cliques (every GPU linked to every
    other), largest first. A hybrid cube mesh (DGX-1) gives its two quads, an NVSwitch
    system (DGX A100) one island of all GPUs. GPUs without NVLink peers are in none."""
    gpus = topo.gpu_indices()
    adj: dict[int, set[int]] = {g: set() for g in gpus}
    for a in gpus:
        for b in gpus:
            if a != b and _nv_links(topo.link(f"GPU{a}", f"GPU{b}")):
                adj[a].add(b)
                adj[b].add(a)
    left = {g for g in gpus if adj[g]}
    islands: list[list[int]] = []
    while left:
        best: list[int] = []
        for clique in _maximal_cliques(left, adj):
            c = sorted(clique)
            if len(c) > len(best) or (len(c) == len(best) and c < best):
                best = c
        if len(best) < 2:
            break
        islands.append(best)
        left -= set(best)
    return sorted(islands, key=lambda isl: isl[0])


def _maximal_cliques(nodes: set[int], adj: Mapping[int, set[int]]) -> list[set[int]]:
    out: list[set[int]] = []

    def bk(r: set[int], p: set[int], x: set[int]) -> None:
        if not p and not x:
            out.append(r)
            return
        pivot = max(p | x, key=lambda v: len(adj[v] & p))
        for v in sorted(p - adj[pivot]):
            bk(r | {v}, p & adj[v], x & adj[v])
            p = p - {v}
            x = x | {v}

    bk(set(), set(nodes), set())
    return out


def _pcie_groups(topo: TopoMatrix) -> list[list[int]]:
    """GPUs behind a shared PCIe switch, as connected components: two GPUs are joined when
    their cell is PIX or PXB, or when both are PIX/PXB to the same other device (a NIC).
    The second rule matters where NVLink hides the PCIe path: a GPU pair linked by NVLink
    shows ``NV#``, not ``PIX``."""
    gpus = topo.gpu_indices()
    parent = {g: g for g in gpus}
    near = ("PIX", "PXB")

    def find(g: int) -> int:
        while parent[g] != g:
            parent[g] = parent[parent[g]]
            g = parent[g]
        return g

    others = [lbl for lbl in topo.labels if not re.fullmatch(r"GPU\d+", lbl)]
    for a in gpus:
        for b in gpus:
            if a >= b:
                continue
            if topo.link(f"GPU{a}", f"GPU{b}") in near or any(
                    topo.link(f"GPU{a}", o) in near and topo.link(f"GPU{b}", o) in near
                    for o in others):
                parent[find(b)] = find(a)
    comps: dict[int, list[int]] = {}
    for g in gpus:
        comps.setdefault(find(g), []).append(g)
    return sorted((sorted(c) for c in comps.values()), key=lambda c: c[0])


def gpu_groups(topo: TopoMatrix) -> dict[int, dict[str, str]]:
    """GPU index -> ``{nvlink: nvlinkK, pcie: pcieK}`` (outermost first). Every GPU has a
    ``pcie`` group; only GPUs with NVLink peers have an ``nvlink`` group."""
    out: dict[int, dict[str, str]] = {g: {} for g in topo.gpu_indices()}
    for k, island in enumerate(nvlink_islands(topo)):
        for g in island:
            out[g]["nvlink"] = f"nvlink{k}"
    for k, comp in enumerate(_pcie_groups(topo)):
        for g in comp:
            out[g]["pcie"] = f"pcie{k}"
    return out


def _run(cmd: Sequence[str]) -> str:
    shown = " ".join(cmd)
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True,
                              timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise NvidiaSmiError(cmd[0], "not found") from None
    except PermissionError:
        raise NvidiaSmiError(cmd[0], "is not executable") from None
    except subprocess.TimeoutExpired:
        raise NvidiaSmiError(shown, f"did not finish in {NVIDIA_SMI_TIMEOUT_S:g}s") from None
    except OSError as e:
        raise NvidiaSmiError(cmd[0], f"cannot run: {e.strerror or e}") from None
    if proc.returncode != 0:
        msg = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        first = _clean(msg[0]) if msg else ""
        raise NvidiaSmiError(shown, f"exited with status {proc.returncode}"
                                    + (f": {first}" if first else ""))
    return proc.stdout


def run_nvidia_smi(program: str = "nvidia-smi") -> tuple[list[GpuInfo], TopoMatrix | None]:
    """Run ``nvidia-smi`` twice (the GPU query and ``topo -m``) and parse both. The
    topology matrix is None on a machine with one GPU or where ``topo`` fails."""
    gpus = parse_gpu_query(_run([program, *GPU_QUERY_ARGS]))
    topo: TopoMatrix | None = None
    if len(gpus) > 1:
        topo = parse_topo_matrix(_run([program, *TOPO_ARGS]))
    return gpus, topo


def add_gpus(dm: DiscoveredMachine, root: Path, program: str | None) -> None:
    """Run ``nvidia-smi`` (``program``; else the one on PATH, only when ``root`` is ``/``)
    and attach its GPUs; an implicit run that fails is a warning."""
    explicit = program is not None
    if program is None:
        try:
            live = root.resolve() == Path("/")
        except OSError:
            live = False
        found = shutil.which("nvidia-smi") if live else None
        if found is None:
            return
        program = found
    try:
        gpus, topo = run_nvidia_smi(program)
    except NvidiaSmiError as e:
        if explicit:
            raise
        dm.warnings.append(f"{e}; no GPUs reported")
        return
    attach_gpus(dm, gpus, topo)


def attach_gpus(dm: DiscoveredMachine, gpus: list[GpuInfo], topo: TopoMatrix | None) -> None:
    """Give the GPUs their NUMA node (sysfs first, ``topo -m``'s NUMA Affinity second),
    NVLink peers and groups, and add them to ``dm``."""
    pci = {p.address: p for p in dm.pci}
    groups = gpu_groups(topo) if topo is not None else {}
    for g in gpus:
        dev = pci.get(g.pci_bus_id)
        if dev is not None and dev.has_numa_file:
            g.numa_node = dev.numa_node
        elif topo is not None and topo.numa_affinity.get(f"GPU{g.index}") is not None:
            g.numa_node = topo.numa_affinity[f"GPU{g.index}"]
        elif dev is None:
            dm.warnings.append(f"GPU {g.index} ({g.pci_bus_id}) is not under "
                               f"{PCI_DIR}; its NUMA node is unknown")
        if topo is not None:
            for other in topo.gpu_indices():
                n = _nv_links(topo.link(f"GPU{g.index}", f"GPU{other}"))
                if other != g.index and n:
                    g.nvlinks[other] = n
        g.groups = dict(groups.get(g.index, {}))
    if topo is not None:
        known = {g.index for g in gpus}
        extra = [i for i in topo.gpu_indices() if i not in known]
        if extra:
            dm.warnings.append(f"nvidia-smi topo -m lists GPUs {extra} that the GPU query "
                               f"does not")
    dm.gpus = sorted(gpus, key=lambda g: g.index)
