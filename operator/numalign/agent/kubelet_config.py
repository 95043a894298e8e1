"""The parts of a kubelet's configuration file (``KubeletConfiguration``,
kubelet.config.k8s.io/v1beta1) that decide NUMA alignment on a real node: the Topology
Manager's policy, scope and options, the CPU and memory manager policies and the
reserved CPUs. Defaults are the kubelet's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from numalign.topology.errors import TopologyError
from numalign.topology.policies import check_policy
from numalign.topology.policyconfig import check_scope, parse_policy_options
from numalign.topology.quantity import format_cpulist, parse_cpulist

KIND = "KubeletConfiguration"
CPU_MANAGER_POLICIES = ("none", "static")
MEMORY_MANAGER_POLICIES = ("None", "Static", "BestEffort")


@dataclass(frozen=True)
class KubeletConfig:
    topology_manager_policy: str = "none"
    topology_manager_scope: str = "container"
    topology_manager_policy_options: Mapping[str, str] = field(default_factory=dict)
    cpu_manager_policy: str = "none"
    memory_manager_policy: str = "None"
    reserved_system_cpus: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """As NodeTopology ``status.kubelet`` shows it (the kubelet's field names)."""
        out: dict[str, Any] = {
            "topologyManagerPolicy": self.topology_manager_policy,
            "topologyManagerScope": self.topology_manager_scope,
            "cpuManagerPolicy": self.cpu_manager_policy,
            "memoryManagerPolicy": self.memory_manager_policy,
        }
        if self.topology_manager_policy_options:
            out["topologyManagerPolicyOptions"] = dict(self.topology_manager_policy_options)
        if self.reserved_system_cpus:
            out["reservedSystemCPUs"] = format_cpulist(list(self.reserved_system_cpus))
        return out


def _str(doc: Mapping[str, Any], key: str, default: str, where: str) -> str:
    value = doc.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise TopologyError(f"{where}: {key}", f"must be a string, got {value!r}")
    return value


def parse_kubelet_config(doc: Any, where: str = "kubelet configuration") -> KubeletConfig:
    """A KubeletConfiguration document -> KubeletConfig; TopologyError names the field."""
    if not isinstance(doc, Mapping):
        raise TopologyError(where, f"must be a {KIND} object, got {type(doc).__name__}")
    kind = doc.get("kind")
    if kind is not None and kind != KIND:
        raise TopologyError(f"{where}: kind", f"must be {KIND}, got {kind!r}")
    policy = check_policy(_str(doc, "topologyManagerPolicy", "none", where),
                          f"{where}: topologyManagerPolicy", kubelet=True)
    scope = check_scope(_str(doc, "topologyManagerScope", "container", where),
                        f"{where}: topologyManagerScope")
    raw_options = doc.get("topologyManagerPolicyOptions") or {}
    if not isinstance(raw_options, Mapping):
        raise TopologyError(f"{where}: topologyManagerPolicyOptions",
                            f"must be a map of option to value, got {raw_options!r}")
    options = {str(k): str(v).lower() if isinstance(v, bool) else str(v)
               for k, v in raw_options.items()}
    parse_policy_options(options, f"{where}: topologyManagerPolicyOptions")
    cpu_policy = _str(doc, "cpuManagerPolicy", "none", where)
    if cpu_policy not in CPU_MANAGER_POLICIES:
        raise TopologyError(f"{where}: cpuManagerPolicy",
                            f"unknown policy {cpu_policy!r} "
                            f"(one of {', '.join(CPU_MANAGER_POLICIES)})")
    mem_policy = _str(doc, "memoryManagerPolicy", "None", where)
    if mem_policy not in MEMORY_MANAGER_POLICIES:
        raise TopologyError(f"{where}: memoryManagerPolicy",
                            f"unknown policy {mem_policy!r} "
                            f"(one of {', '.join(MEMORY_MANAGER_POLICIES)})")
    reserved_text = doc.get("reservedSystemCPUs")
    reserved: list[int] = []
    if reserved_text not in (None, ""):
        try:
            reserved = parse_cpulist(str(reserved_text))
        except (TopologyError, ValueError) as e:
            raise TopologyError(f"{where}: reservedSystemCPUs",
                                f"not a cpulist: {reserved_text!r} ({e})") from None
    return KubeletConfig(policy, scope, options, cpu_policy, mem_policy, tuple(sorted(reserved)))


def load_kubelet_config(path: str | Path) -> KubeletConfig:
    """Read and parse a KubeletConfiguration file (YAML or JSON)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise TopologyError(str(path), f"cannot read the kubelet configuration: "
                                       f"{e.strerror or e}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise TopologyError(str(path), f"not valid YAML: {e}") from None
    return parse_kubelet_config(doc, str(path))
