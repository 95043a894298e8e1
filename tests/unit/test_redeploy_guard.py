"""The operator's own checks before a redeploy acts: it deletes only pods Failed with a
topology rejection, never in kube-system, and creates only a replacement with the
rejected pod's spec (no node, node avoidance at most) that names it."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import pytest

from fake_kube import FakeKube
from numalign.api.names import REJECT_REASON
from numalign.api.topologypolicy import RedeployPolicy
from numalign.controller import cache, connection
from numalign.controller.redeploy import build_replacement, step
from numalign.controller.redeploy import rejected as redeploy
from numalign.controller.redeploy.guard import (
    RedeployRefused,
    refusal_to_create,
    refusal_to_delete,
    spec_matches,
)


def _pod(ns: str = "ns", phase: str = "Failed", reason: str = REJECT_REASON
         ) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": ns, "uid": "uid-web",
                         "labels": {"app": "web"}, "annotations": {"a": "b"}},
            "spec": {"nodeName": "node-a", "serviceAccountName": "web",
                     "containers": [{"name": "c", "image": "registry.example/web:1"}]},
            "status": {"phase": phase, "reason": reason}}


def test_deletes_only_topology_rejected_pods_outside_kube_system() -> None:
    assert refusal_to_delete(_pod()) is None
    running = refusal_to_delete(_pod(phase="Running", reason=""))
    assert running == ("pod ns/web is Running (reason none), not Failed with "
                       "TopologyAffinityError")
    evicted = refusal_to_delete(_pod(reason="Evicted"))
    assert evicted is not None and "reason Evicted" in evicted
    system = refusal_to_delete(_pod(ns="kube-system"))
    assert system == "pod kube-system/web is in kube-system, whose pods numalign never deletes"


def test_its_own_replacement_is_allowed_with_node_avoidance() -> None:
    pod = _pod()
    assert refusal_to_create(pod, build_replacement(pod, "web-r1", [])) is None
    assert refusal_to_create(pod, build_replacement(pod, "web-r1", ["node-a", "node-b"])) is None


def _changed(change: str) -> dict[str, Any]:
    pod = _pod()
    new = build_replacement(pod, "web-r1", ["node-a"])
    spec = new["spec"]
    if change == "image":
        spec["containers"][0]["image"] = "registry.example/miner:1"
    elif change == "serviceAccountName":
        spec["serviceAccountName"] = "admin"
    elif change == "privileged":
        spec["containers"][0]["securityContext"] = {"privileged": True}
    elif change == "nodeName":
        spec["nodeName"] = "node-b"
    elif change == "affinity":
        spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"][0]["matchFields"] = [
                {"key": "metadata.name", "operator": "In", "values": ["node-z"]}]
    elif change == "hostPath":
        spec["volumes"] = [{"name": "root", "hostPath": {"path": "/"}}]
    return new


@pytest.mark.parametrize("change", ["image", "serviceAccountName", "privileged", "nodeName",
                                    "affinity", "hostPath"])
def test_a_replacement_with_another_spec_is_refused(change: str) -> None:
    pod = _pod()
    new = _changed(change)
    assert not spec_matches(pod, new)
    assert refusal_to_create(pod, new) == (
        "replacement ns/web-r1 has another spec than web (only the node may differ)")


def test_a_replacement_elsewhere_or_of_another_pod_is_refused() -> None:
    pod = _pod()
    new = build_replacement(pod, "web-r1", [])
    other_ns = copy.deepcopy(new)
    other_ns["metadata"]["namespace"] = "kube-system"
    assert refusal_to_create(pod, other_ns) == (
        "pod kube-system/web-r1: numalign never creates pods in kube-system")
    moved = copy.deepcopy(new)
    moved["metadata"]["namespace"] = "other"
    assert refusal_to_create(pod, moved) == (
        "replacement other/web-r1 is not in ns, the namespace of web")
    forged = copy.deepcopy(new)
    forged["metadata"]["annotations"]["numalign.io/redeploy-of-uid"] = "uid-other"
    why = refusal_to_create(pod, forged)
    assert why is not None and "does not name web (uid uid-web)" in why
    running = _pod(phase="Running", reason="")
    why = refusal_to_create(running, build_replacement(running, "web-r1", []))
    assert why is not None and why.endswith("not Failed with TopologyAffinityError: "
                                            "it has no replacement")
    assert refusal_to_create(_pod(ns="kube-system"),
                             build_replacement(_pod(ns="kube-system"), "web-r1", [])) == (
        "pod kube-system/web-r1: numalign never creates pods in kube-system")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeKube]:
    cache.clear()
    api = FakeKube()
    monkeypatch.setattr(connection, "client", lambda: api)
    monkeypatch.setattr(redeploy, "RECREATE_BARE_PODS", True)
    monkeypatch.setattr(redeploy, "governing_settings", lambda pod: ("p", RedeployPolicy()))
    monkeypatch.setattr(redeploy, "with_unfit", lambda pod, avoid: avoid)
    data: dict[str, str] = {}

    async def save_state(ns: str, new: dict[str, str], rv: str | None) -> None:
        data.clear()
        data.update(new)

    monkeypatch.setattr(redeploy, "load_state", lambda ns: (dict(data), "1"))
    monkeypatch.setattr(redeploy, "save_state", save_state)
    yield api
    cache.clear()


def test_step_acts_on_a_rejected_pod_but_never_on_a_running_one(fake: FakeKube) -> None:
    pods = "/api/v1/namespaces/ns/pods"
    pod = fake.add(pods, _pod())
    assert asyncio.run(step(pod, first_seen=0.0, now=1000.0)) is None
    assert fake.created == ["web-r1"] and fake.deleted == ["web"]
    # A decision replayed for a pod that is Running now (a stale record, a bug): refused
    # before any call.
    running = fake.add(pods, _pod(phase="Running", reason=""))
    decision = {"action": "recreate", "replacement": "web-r2", "avoid": []}
    with pytest.raises(RedeployRefused, match="is Running"):
        asyncio.run(redeploy._finish(running, decision))
    assert fake.created == ["web-r1"] and fake.deleted == ["web"]
