"""The pods of a numalign-managed node, as the NRI placer needs them: by uid, each with its
resolved policy and its recorded allocation (pure: fed by the agent's pod watch).

- The policy is :func:`numalign.api.effective.effective_policy` on a numalign-managed node:
  the pod's ``numalign.io/resolved``; a deferred, missing or malformed one is the node's
  default (its ``NodeTopology`` spec), as on emulated nodes.
- The recorded allocation is the pod's ``numalign.io/allocation`` (a malformed one counts as
  none: the pod is admitted again).
- The runtime may ask about a pod before the watch has delivered it: :meth:`PodIndex.wait_for`
  waits for it (the placer awaits it before deciding).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from numalign.agent.nri.placer import PodView
from numalign.api.effective import NUMALIGN_MANAGED, NodePolicy, effective_policy
from numalign.api.wire import (
    ANN_ALLOCATION,
    Allocation,
    WireError,
    node_default,
    parse_allocation,
)


class PodIndex:
    def __init__(self) -> None:
        self.pods: dict[str, Mapping[str, Any]] = {}
        self.node_spec: Mapping[str, Any] | None = None
        # uid -> (the annotation's text, its allocation): parsed once per text, not per lookup
        self._allocations: dict[str, tuple[str, Allocation | None]] = {}
        self._changed = asyncio.Event()

    def on_pod(self, typ: str, pod: Mapping[str, Any]) -> None:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        if not uid:
            return
        if typ == "DELETED":
            self.pods.pop(uid, None)
            self._allocations.pop(uid, None)
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
        node = NodePolicy(NUMALIGN_MANAGED, node_default(self.node_spec))
        return PodView(pod, effective_policy(pod, node).resolved,
                       self._allocation(uid, str(ann.get(ANN_ALLOCATION) or "")))

    def _allocation(self, uid: str, text: str) -> Allocation | None:
        cached = self._allocations.get(uid)
        if cached is not None and cached[0] == text:
            return cached[1]
        allocation = None
        if text:
            try:
                allocation = parse_allocation(text)
            except WireError:
                allocation = None
        self._allocations[uid] = (text, allocation)
        return allocation

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
