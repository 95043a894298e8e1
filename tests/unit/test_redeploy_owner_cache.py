"""The controllers the redeploy step reads are cached for a few seconds, keeping of each
only what is read (its replicas and its redeploy-reset annotation), not the whole
ReplicaSet with its pod template."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from numalign.api.names import ANN_REDEPLOY_RESET
from numalign.controller.redeploy import store


def _rs(replicas: Any) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web-1", "namespace": "ns", "uid": "rs-uid",
                         "annotations": {ANN_REDEPLOY_RESET: "2", "other": "x" * 500},
                         "managedFields": [{"manager": "kube", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"replicas": replicas, "template": {"spec": {"containers": [
                {"name": "c", "image": "registry.example/web:1"}]}}},
            "status": {"replicas": 3}}


def _pod(kind: str = "ReplicaSet") -> dict[str, Any]:
    return {"metadata": {"name": "web-1-a", "namespace": "ns", "ownerReferences": [
        {"kind": kind, "name": "web-1", "uid": "rs-uid", "controller": True}]}}


@pytest.mark.parametrize(("replicas", "want"), [(3, 3), (0, 1), ("3", 1), (None, 1)])
def test_replicas_and_reset_are_read_and_only_they_are_kept(
        monkeypatch: pytest.MonkeyPatch, replicas: Any, want: int) -> None:
    reads: list[str] = []

    async def read_owner(kind: str, name: str, namespace: str) -> dict[str, Any]:
        reads.append(name)
        return _rs(replicas)

    monkeypatch.setattr(store, "read_owner", read_owner)
    monkeypatch.setattr(store, "_OWNERS", {})
    got, owner = asyncio.run(store.owner_replicas(_pod()))
    again, _ = asyncio.run(store.owner_replicas(_pod()))
    assert (got, again, reads) == (want, want, ["web-1"])  # the second from the cache
    assert owner is not None
    assert owner["metadata"]["annotations"] == {ANN_REDEPLOY_RESET: "2"}
    assert "template" not in owner["spec"] and "managedFields" not in owner["metadata"]
    assert store._OWNERS["rs-uid"][1] == owner


def test_a_controller_without_the_annotation_or_malformed() -> None:
    assert store.slim_owner({"metadata": {"name": "x"}}) == {
        "metadata": {"annotations": {}}, "spec": {}}
    assert store.slim_owner({"metadata": "x", "spec": ["y"]}) == {
        "metadata": {"annotations": {}}, "spec": {}}
