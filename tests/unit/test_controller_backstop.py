"""The operator's backstop completes a bound pod's deferred ``numalign.io/resolved`` with
the node's default, read as every decider reads it (``NodePolicy``)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from numalign.api.names import ANN_RESOLVED
from numalign.api.resolved import DEFERRED
from numalign.controller import cache, connection, pods


class FakeClient:
    def __init__(self) -> None:
        self.patches: list[tuple[str, Any]] = []

    async def patch(self, path: str, body: Any, kind: str) -> dict[str, Any]:
        self.patches.append((path, body))
        return {}


def _bound_deferred_pod() -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns",
                         "annotations": {ANN_RESOLVED: DEFERRED.annotation()}},
            "spec": {"nodeName": "n1"}, "status": {"phase": "Pending"}}


@pytest.mark.parametrize(("nt", "want"), [
    ({"spec": {"policy": "restricted", "scope": "pod"}},
     {"policy": "restricted", "scope": "pod", "options": {}, "source": "node-default"}),
    ({"spec": {"policy": "no-such-policy"}},
     {"policy": "none", "scope": "container", "options": {}, "source": "none"}),
    (None, {"policy": "none", "scope": "container", "options": {}, "source": "none"}),
])
async def test_deferred_pod_gets_the_node_default(monkeypatch: pytest.MonkeyPatch,
                                                  nt: dict[str, Any] | None,
                                                  want: dict[str, Any]) -> None:
    body = _bound_deferred_pod()
    assert pods._needs_backstop(body)  # type: ignore[arg-type]
    fake = FakeClient()

    async def resolve_pod(pod: Any, namespace: str | None = None) -> Any:
        return DEFERRED

    monkeypatch.setattr(pods, "resolve_pod", resolve_pod)
    monkeypatch.setattr(cache, "node_topology", lambda name: nt if name == "n1" else None)
    monkeypatch.setattr(connection, "client", lambda: fake)
    await pods.backstop(body, logging.getLogger("test"))  # type: ignore[arg-type]
    ((path, patch),) = fake.patches
    assert path.endswith("/namespaces/ns/pods/p")
    assert json.loads(patch["metadata"]["annotations"][ANN_RESOLVED]) == want
