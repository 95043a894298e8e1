"""Pod IPs on emulated nodes: each node hands out addresses of its own range, never one that
a pod of the node holds now (restored pods keep theirs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .kubelet_status import node_addresses
from .state import pod_uid


class PodIps:
    def __init__(self) -> None:
        self._held: dict[str, dict[str, str]] = {}  # node -> pod uid -> pod IP
        self._seq: dict[str, int] = {}

    def take(self, node: str, index: int) -> str:
        """A pod IP of node ``index``'s range that no pod of the node has now."""
        _, prefix = node_addresses(index)
        used = set(self._held.get(node, {}).values())
        n = self._seq.get(node, 0)
        for _ in range(252):
            ip = f"{prefix}{2 + n % 252}"
            n += 1
            if ip not in used:
                break
        self._seq[node] = n
        return ip

    def keep(self, node: str, pod: Mapping[str, Any]) -> None:
        """Remember the IP a pod of ``node`` has (host-network pods hold none)."""
        ip = (pod.get("status") or {}).get("podIP")
        if ip and not (pod.get("spec") or {}).get("hostNetwork"):
            self._held.setdefault(node, {})[pod_uid(pod)] = str(ip)

    def release(self, node: str, uid: str) -> None:
        self._held.get(node, {}).pop(uid, None)
