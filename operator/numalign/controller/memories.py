"""Kopf's per-object memories, kept only while they hold something.

Kopf remembers every object of every kind it watches (a ``ResourceMemory`` per uid:
~0.9 KiB each) from its first event until its DELETED event: every pod of the cluster,
and for good every pod deleted while a watch was down (its DELETED event never comes).
What such a memory holds matters to handlers this operator does not have (change
detection, resuming, daemons, timers, indexes: a unit test keeps it so) and to Kopf's
error throttling; for the event and admission handlers here, a memory at rest (nothing
throttled, no patch left over, nothing in its memo) is the same as a fresh one, which
Kopf makes at the object's next event. :meth:`PrunedMemories.prune` (each periodic
pass) forgets the memories at rest.
"""

from __future__ import annotations

from kopf._core.reactor.inventory import ResourceMemories, ResourceMemory


def at_rest(memory: ResourceMemory) -> bool:
    """Whether ``memory`` holds nothing a fresh one would not."""
    throttler = memory.error_throttler
    daemons = memory.daemons_memory
    return (throttler.source_of_delays is None and throttler.active_until is None
            and throttler.last_used_delay is None
            and not memory.remaining_patch
            and memory.indexing_memory.indexing_state is None
            and daemons.live_fresh_body is None and not daemons.running_daemons
            and not daemons.forever_stopped
            and isinstance(memory.memo, dict) and not memory.memo)


class PrunedMemories(ResourceMemories):
    """Kopf's memories, with the ones at rest forgotten by :meth:`prune`."""

    def __len__(self) -> int:
        return len(self._items)

    def prune(self) -> int:
        """Forget the memories at rest; how many were forgotten."""
        rest = [key for key, memory in self._items.items() if at_rest(memory)]
        for key in rest:
            del self._items[key]
        return len(rest)


MEMORIES = PrunedMemories()
