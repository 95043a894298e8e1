"""The pods of a numalign-managed node, as the NRI placer needs them: by uid, each with its
resolved policy (pure: fed by the agent's pod watch).

- The policy is :func:`numalign.api.effective.effective_policy` on a numalign-managed node:
  the pod's ``numalign.io/resolved``; a deferred, missing or malformed one is the node's
  default (its ``NodeTopology`` spec), as on emulated nodes.
- A pod's recorded allocation (``numalign.io/allocation``) is read only when the node's
  state is restored (:meth:`numalign.agent.state.NodeState.restore`, which checks it).
- The runtime may ask about a pod before the watch has delivered it: :meth:`PodIndex.wait_for`
  waits for it (the placer awaits it before deciding).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from numalign.agent.nri.placer import PodView
from numalign.api.effective import NodeKind, NodePolicy, effective_policy
from numalign.api.resolved import node_default


class PodIndex:
    def __init__(self) -> None:
        self.pods: dict[str, Mapping[str, Any]] = {}
        self.node_spec: Mapping[str, Any] | None = None
        self._changed = asyncio.Event()

    def on_pod(self, typ: str, pod: Mapping[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        if typ == "DELETED":
            self.pods.pop(uid, None)
        else:
            self.pods[uid] = pod
        self._changed.set()

    def on_node_spec(self, spec: Mapping[str, Any] | None) -> None:
        self.node_spec = spec

    def __call__(self, uid: str) -> PodView | None:
        pod = self.pods.get(uid)
        if pod is None:
            return None
        node = NodePolicy(NodeKind.NUMALIGN_MANAGED, node_default(self.node_spec))
        return PodView(pod, effective_policy(pod, node))

    async def wait_for(self, uid: str, timeout: float) -> bool:
        """Wait until the pod with ``uid`` is known; False after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while uid not in self.pods:
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return uid in self.pods
        return True
