"""The watch-fed cache of the operator and the exhausted/released redeploy record."""

from __future__ import annotations

import asyncio
from typing import Any

from numalign.controller.cache import Store
from numalign.controller.redeploy import WorkloadState, has_gate


def _obj(name: str, rv: int, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(rv)}, **extra}


def test_store_keeps_the_newest_version() -> None:
    listed: list[dict[str, Any]] = [_obj("a", 5, v=1), _obj("b", 5)]

    async def lister() -> tuple[list[dict[str, Any]], int | None]:
        return listed, 6

    store = Store("t", lister, lambda o: o["metadata"]["name"])
    assert not store.filled
    asyncio.run(store.ensure())  # the first reader fills it
    assert [o["metadata"]["name"] for o in store.values()] == ["a", "b"]
    listed.append(_obj("z", 6))
    asyncio.run(store.ensure())  # filled already: no second LIST
    assert store.get("z") is None
    store.put(_obj("a", 9, v=2))
    store.put(_obj("a", 7, v=3))  # an older event arriving late changes nothing
    assert store.get("a")["v"] == 2  # type: ignore[index]
    store.put(_obj("c", 10))  # created after the LIST below was taken
    listed[:] = [_obj("a", 5, v=1)]
    asyncio.run(store.fill())  # b is gone; a stays at its newer version; c is newer than the LIST
    assert sorted(o["metadata"]["name"] for o in store.values()) == ["a", "c"]
    assert store.get("a")["v"] == 2  # type: ignore[index]
    store.remove(_obj("c", 11))
    assert store.get("c") is None


def test_exhausted_record_round_trip_and_release() -> None:
    st = WorkloadState(attempts=4, gave_up={"u": "2020-01-01T00:00:00Z"},
                       exhausted="2020-01-01T00:00:00Z", owner={"kind": "ReplicaSet",
                                                                "name": "rs"},
                       reset="", last="2020-01-01T00:00:00Z", budget=4)
    back = WorkloadState.parse(st.dump())
    assert (back.exhausted, back.owner, back.budget) == (st.exhausted, st.owner, 4)
    t0 = 1577836800.0
    back.expire(t0 + 60)  # within the hour: still exhausted
    assert back.exhausted and back.attempts == 4
    back.expire(t0 + 3601)  # no rejection for an hour: released
    assert not back.exhausted and back.attempts == 0
    assert back.gave_up == {} and back.released == {"u": "2020-01-01T00:00:00Z"}
    assert "exhausted" not in WorkloadState.parse(back.dump()).dump()


def test_has_gate() -> None:
    assert has_gate({"spec": {"schedulingGates": [{"name": "numalign.io/redeploy"}]}})
    assert not has_gate({"spec": {"schedulingGates": [{"name": "other"}]}})
    assert not has_gate({})


def test_readers_at_once_share_one_list() -> None:
    """Webhooks arriving together before the first fill make one LIST, not one each."""
    calls = 0

    async def lister() -> tuple[list[dict[str, Any]], int | None]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)
        return [_obj("a", 1)], 1

    store = Store("t", lister, lambda o: o["metadata"]["name"])

    async def many() -> None:
        await asyncio.gather(*(store.ensure() for _ in range(20)))

    asyncio.run(many())
    assert calls == 1 and store.get("a") is not None
