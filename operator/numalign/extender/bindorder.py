"""Bindings to one node land in the order the extender counted them.

The bind verb makes a pod's hold on its node (what the next pods are decided against)
and then posts the Binding. kube-scheduler runs its binding cycles at once, so two pods
bound to one node post together, and the API server may store the second first: the
node (an emulated one, or the kubelet, which admits pods one after another as it sees
them bound) then decides the second pod first, and may give it the CPUs the first one
was counted on, next to the first one's device, and refuse the first one. A node's
bindings therefore take turns: the next one makes its hold and posts once the one before
it has landed (or failed). A turn waits :data:`TURN_WAIT` at most (a stuck API server
holds a node's other bindings up no longer; counted by the caller), and a node's queue is
forgotten once empty.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

TURN_WAIT = 1.0  # seconds a binding waits for the one before it on its node


class BindOrder:
    """Per node, one binding at a time, in the order they asked."""

    def __init__(self, turn_wait: float = TURN_WAIT) -> None:
        self.turn_wait = turn_wait
        self._locks: dict[str, asyncio.Lock] = {}
        self._users: dict[str, int] = {}

    @property
    def nodes(self) -> int:
        """Nodes with a binding under way or waiting (what is kept)."""
        return len(self._locks)

    @asynccontextmanager
    async def turn(self, node: str) -> AsyncIterator[bool]:
        """Hold ``node``'s turn for the block; yields False when the binding before it
        did not land within ``turn_wait`` (the block then runs without its turn)."""
        lock = self._locks.get(node)
        if lock is None:
            lock = self._locks[node] = asyncio.Lock()
        self._users[node] = self._users.get(node, 0) + 1
        got = False
        try:
            try:
                await asyncio.wait_for(lock.acquire(), self.turn_wait)
                got = True
            except TimeoutError:
                pass
            yield got
        finally:
            if got:
                lock.release()
            left = self._users[node] - 1
            if left:
                self._users[node] = left
            else:
                del self._users[node]
                del self._locks[node]
