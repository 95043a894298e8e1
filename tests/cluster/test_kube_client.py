"""The one Kubernetes client against the real API server: every verb the product uses,
the one error type, events, watches and the synchronous facade."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from numalign.api.kube import (
    JSON_PATCH,
    STRATEGIC_PATCH,
    ApiError,
    Kube,
    SyncKube,
    load_config,
    q,
)

pytestmark = pytest.mark.cluster


async def test_verbs_errors_and_watch(kubeconfig: Path, namespace: str) -> None:
    base = f"/api/v1/namespaces/{q(namespace)}/configmaps"
    async with Kube(load_config(str(kubeconfig))) as kube:
        made = await kube.create(base, {"metadata": {"name": "a"}, "data": {"k": "1"}})
        with pytest.raises(ApiError) as exc:
            await kube.create(base, {"metadata": {"name": "a"}})
        assert (exc.value.status, exc.value.reason) == (409, "AlreadyExists")

        await kube.patch(f"{base}/a", {"data": {"m": "2"}})
        await kube.patch(f"{base}/a", [{"op": "replace", "path": "/data/k", "value": "3"}],
                         JSON_PATCH)
        await kube.patch(f"{base}/a", {"metadata": {"labels": {"l": "x"}}}, STRATEGIC_PATCH)
        got = await kube.get(f"{base}/a")
        assert got["data"] == {"k": "3", "m": "2"} and got["metadata"]["labels"] == {"l": "x"}

        for i in range(5):
            await kube.create(base, {"metadata": {"name": f"p{i}", "labels": {"l": "y"}}})
        items, rv = await kube.list_all(base, {"labelSelector": "l=y"}, page=2)
        assert sorted(i["metadata"]["name"] for i in items) == [f"p{i}" for i in range(5)]
        assert int(rv) >= int(made["metadata"]["resourceVersion"])

        async def first_change() -> tuple[str, str]:
            async for ev in kube.watch(base, {"resourceVersion": rv}, timeout_seconds=30):
                if ev["type"] != "BOOKMARK":
                    return ev["type"], ev["object"]["metadata"]["name"]
            raise AssertionError("the watch ended without an event")

        watcher = asyncio.create_task(first_change())
        await kube.delete(f"{base}/p0")
        assert await asyncio.wait_for(watcher, 30) == ("DELETED", "p0")
        assert await kube.get_or_none(f"{base}/p0") is None

        assert await kube.event(got, "Normal", reason="Tested", message="hello")
        events, _ = await kube.list_all(f"/api/v1/namespaces/{q(namespace)}/events")
        mine = [e for e in events if e["involvedObject"]["name"] == "a"]
        assert [(e["reason"], e["message"], e["involvedObject"]["kind"]) for e in mine] == [
            ("Tested", "hello", "ConfigMap")]


def test_sync_facade_same_client(kubeconfig: Path, namespace: str) -> None:
    base = f"/api/v1/namespaces/{q(namespace)}/configmaps"
    with SyncKube(load_config(str(kubeconfig))) as kube:
        assert kube.ok("/readyz")
        kube.create(base, {"metadata": {"name": "s"}, "data": {"k": "v"}})
        assert kube.get(f"{base}/s")["data"] == {"k": "v"}
        with pytest.raises(ApiError) as exc:
            kube.get(f"{base}/missing")
        assert (exc.value.status, exc.value.reason) == (404, "NotFound")

        async def inside_a_loop() -> str:  # callable from async code too
            return str(kube.get(f"{base}/s")["metadata"]["name"])

        assert asyncio.run(inside_a_loop()) == "s"
        kube.delete(f"{base}/s")
        assert kube.get_or_none(f"{base}/s") is None
