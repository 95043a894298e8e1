"""The informer loop hands the event loop on between events: a watch stream's chunk
can carry hundreds of events, and the scheduler extender's verbs share the loop with
its watches (a filter waiting for a backlog of NodeTopology events is a pod's
scheduling cycle waiting)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from numalign.api.kube.listwatch import list_watch

EVENTS = 500


class Backlog:
    """A watch whose events are all there at once (one chunk), then idles."""

    async def watch(self, path: str, params: dict[str, str], timeout_seconds: int = 300,
                    metadata_only: bool = False) -> AsyncIterator[dict[str, Any]]:
        for i in range(EVENTS):
            yield {"type": "MODIFIED", "object": {"metadata": {
                "name": f"n{i}", "resourceVersion": str(i + 2)}}}
        await asyncio.Event().wait()


def test_a_request_is_served_between_events_of_a_backlog() -> None:
    async def scenario() -> tuple[int, list[str]]:
        handled: list[str] = []
        task = asyncio.create_task(list_watch(
            Backlog(), "/apis/numalign.io/v1alpha1/nodetopologies",  # type: ignore[arg-type]
            lambda items: None, lambda typ, obj: handled.append(obj["metadata"]["name"]),
            since="1"))
        await asyncio.sleep(0)  # the watch starts and meets its backlog
        # a verb arriving now: served after the event in hand, not after the backlog
        await asyncio.sleep(0)
        served_after = len(handled)
        while len(handled) < EVENTS:
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return served_after, handled

    served_after, handled = asyncio.run(scenario())
    assert handled == [f"n{i}" for i in range(EVENTS)]  # every one, in order
    assert served_after <= 2, served_after
