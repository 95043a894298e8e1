"""The pods of a numalign-managed node, as the NRI placer needs them: by uid, each with its
resolved policy (pure: fed by the agent's pod watch).

- The policy is the pod's ``numalign.io/resolved``; a deferred or missing one is the node's
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
from numalign.api.wire import ANN_RESOLVED, node_default, resolved_or_none


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
        ann = (pod.get("metadata") or {}).get("annotations") or {}
        resolved = resolved_or_none(ann.get(ANN_RESOLVED))
        if resolved is None or resolved.policy is None:
            resolved = node_default(self.node_spec)
        return PodView(pod, resolved)

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
