"""Kopf's per-object memories are forgotten once at rest (controller.memories): the
operator's memory does not grow with every pod it has seen, and what Kopf keeps while it
matters (error throttling, a memo) stays."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest
from kopf._core.actions.throttlers import throttled

from numalign.controller import main, memories

LOG = logging.getLogger("test")


def _pod(i: int) -> Any:
    return {"metadata": {"uid": f"uid-{i}", "name": f"p{i}", "namespace": "ns"}}


def test_the_operators_handlers_need_no_memory_at_rest() -> None:
    """Pruning is sound only while the operator has no handler that reads what a memory
    keeps between events (change detection and resuming: noticed_by_listing,
    fully_handled_once; daemons and timers; indexes). Adding one: keep its kind's
    memories (controller.memories)."""
    assert main.run  # the handlers are registered on import
    registry = kopf.get_default_registry()
    assert registry._watching.get_all_handlers()  # the event handlers
    assert not registry._changing.get_all_handlers()
    assert not registry._spawning.get_all_handlers()
    assert not registry._indexing.get_all_handlers()


def test_memories_at_rest_are_forgotten_and_busy_ones_kept() -> None:
    async def scenario() -> tuple[int, int, int, int]:
        mem = memories.PrunedMemories()
        for i in range(100):
            await mem.recall(_pod(i), noticed_by_listing=True)
        memo = await mem.recall(_pod(0))
        memo.memo["k"] = "v"  # type: ignore[index]
        failing = await mem.recall(_pod(1))
        async with throttled(throttler=failing.error_throttler, delays=[0.0], logger=LOG):
            raise RuntimeError("the API server is away")
        first = mem.prune()
        kept = len(mem)
        # the failing object's next event goes well: its throttling is over
        again = await mem.recall(_pod(1))
        assert again is failing
        async with throttled(throttler=again.error_throttler, delays=[0.0], logger=LOG):
            pass
        second = mem.prune()
        return first, kept, second, len(mem)

    assert asyncio.run(scenario()) == (98, 2, 1, 1)


def test_a_forgotten_memory_comes_back_fresh_at_the_next_event() -> None:
    async def scenario() -> bool:
        mem = memories.PrunedMemories()
        old = await mem.recall(_pod(7), noticed_by_listing=True)
        mem.prune()
        new = await mem.recall(_pod(7))
        return new is not old and memories.at_rest(new) and len(mem) == 1

    assert asyncio.run(scenario())


def test_each_periodic_pass_forgets_them_and_the_operator_hands_kopf_its_own(
        monkeypatch: pytest.MonkeyPatch) -> None:
    async def nothing(*_: Any, **__: Any) -> None:
        return None

    for mod, name in ((main.cache, "resync"), (main.nodedefaults, "reconcile_all"),
                      (main.policies, "reconcile_all"), (main.redeploy, "periodic_release")):
        monkeypatch.setattr(mod, name, nothing)
    monkeypatch.setattr(main.cache, "node_topologies", lambda: [])
    handed: dict[str, Any] = {}

    async def operator(**kw: Any) -> None:
        handed.update(kw)

    monkeypatch.setattr(main.kopf, "operator", operator)
    monkeypatch.setattr(main.connection, "configure", lambda *_: None)
    asyncio.run(main.run(main.Options()))
    mem = handed["memories"]
    assert isinstance(mem, memories.PrunedMemories) and mem is memories.MEMORIES
    asyncio.run(mem.recall(_pod(1)))
    asyncio.run(main._periodic_pass())
    assert len(mem) == 0
