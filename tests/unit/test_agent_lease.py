"""One agent per node: the second agent for a node stands by while the first renews the
node's Lease, takes over once it expires, and the first then stops."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from numalign.agent.lease import LeaseLost, NodeLease
from numalign.api.kube import ApiError


class LeaseApi:
    """Leases as the API server keeps them: create refuses an existing name, replace
    refuses a stale resourceVersion (409)."""

    def __init__(self) -> None:
        self.objs: dict[str, dict[str, Any]] = {}
        self.rv = 0

    def _save(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj = copy.deepcopy(body)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objs[path] = obj
        return copy.deepcopy(obj)

    async def get(self, path: str) -> dict[str, Any]:
        if path not in self.objs:
            raise ApiError(404, {}, "GET", path)
        return copy.deepcopy(self.objs[path])

    async def create(self, base: str, body: dict[str, Any]) -> dict[str, Any]:
        path = f"{base}/{body['metadata']['name']}"
        if path in self.objs:
            raise ApiError(409, {}, "POST", base)
        return self._save(path, body)

    async def put(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.objs[path]["metadata"]["resourceVersion"] != body["metadata"].get(
                "resourceVersion"):
            raise ApiError(409, {}, "PUT", path)
        return self._save(path, body)


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _lease(api: LeaseApi, clock: Clock, who: str) -> NodeLease:
    return NodeLease(api, "node-a", "numalign-system", who, duration=40,  # type: ignore[arg-type]
                     renew_every=10, clock=clock)


def test_a_second_agent_stands_by_until_the_lease_expires() -> None:
    api, clock = LeaseApi(), Clock()
    first, second = _lease(api, clock, "agent-1"), _lease(api, clock, "agent-2")

    async def scenario() -> None:
        assert await first.try_acquire()
        assert not await second.try_acquire()  # held and fresh
        for _ in range(5):  # the first renews: the second keeps standing by
            clock.now += 10
            await first.renew()
            assert not await second.try_acquire()
        # The first stops renewing (hung, partitioned): 40 s later the second takes over.
        clock.now += 41
        assert await second.try_acquire()
        [obj] = api.objs.values()
        assert obj["spec"]["holderIdentity"] == "agent-2"
        assert obj["spec"]["leaseTransitions"] == 1
        # The first notices at its next renewal and stops.
        with pytest.raises(LeaseLost, match="held by agent-2"):
            await first.renew()

    asyncio.run(scenario())


def test_two_agents_racing_for_an_expired_lease_one_wins() -> None:
    api, clock = LeaseApi(), Clock()
    old = _lease(api, clock, "agent-0")
    a, b = _lease(api, clock, "agent-1"), _lease(api, clock, "agent-2")

    async def scenario() -> list[bool]:
        assert await old.try_acquire()
        clock.now += 100
        # Both read the expired Lease, then both write: the second write is stale.
        real_get = api.get
        seen: dict[str, Any] = {}

        async def get(path: str) -> dict[str, Any]:
            if "obj" not in seen:
                seen["obj"] = await real_get(path)
            return copy.deepcopy(seen["obj"])

        api.get = get  # type: ignore[method-assign]
        return [await a.try_acquire(), await b.try_acquire()]

    assert asyncio.run(scenario()) == [True, False]


def test_an_agent_that_cannot_renew_in_time_stops() -> None:
    api, clock = LeaseApi(), Clock()
    lease = _lease(api, clock, "agent-1")

    async def scenario() -> None:
        assert await lease.try_acquire()

        async def down(path: str, *a: Any) -> dict[str, Any]:
            raise ApiError(503, {}, "GET", path)

        api.get = down  # type: ignore[method-assign]
        lease.renew_every = 0.001
        clock.now += 41
        with pytest.raises(LeaseLost, match="could not be renewed"):
            await asyncio.wait_for(lease.keep(), 5)

    asyncio.run(scenario())


async def test_a_released_lease_is_taken_at_once_and_only_the_holder_releases() -> None:
    api, clock = LeaseApi(), Clock()
    first, second = _lease(api, clock, "agent-1"), _lease(api, clock, "agent-2")
    assert await first.try_acquire()
    assert not await second.try_acquire()
    await second.release()  # not its Lease: nothing changes
    assert not await second.try_acquire()
    await first.release()  # a clean stop: no waiting for the 40 s to run out
    assert await second.try_acquire()
    with pytest.raises(LeaseLost):
        await first.renew()
