"""The operator keeps of a NodeTopology only what its readers use (cache.slim_nt): every
reader answers the same from the kept copy as from the whole object, and the per-node
metrics read the same at a scrape as the gauges did."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fake_kube import FakeKube
from numalign.agent.publish import build_status, nodetopology_object
from numalign.agent.state import NodeState
from numalign.api.effective import NodeKind, NodePolicy, effective_policy
from numalign.api.kube import NT_BASE, Kube
from numalign.api.names import ANN_RESOLVED
from numalign.api.reads import NodeTopologyRead
from numalign.api.resolved import Resolved
from numalign.api.zonefit import unfit_among
from numalign.controller import cache, connection, metrics, nodedefaults, policies
from numalign.topology.machine import load_machine

MACHINES = Path(__file__).resolve().parents[2] / "config" / "samples" / "machines"
KUBELET = {"topologyManagerPolicy": "single-numa-node", "topologyManagerScope": "pod"}
NRI = {"type": "NRIPlacement", "status": "True", "reason": "Registered",
       "message": "placing", "lastTransitionTime": "2026-01-01T00:00:00Z"}


def _pod(name: str, cpu: str, gpus: int = 0, policy: str = "single-numa-node",
         scope: str = "pod", source: str = "TopologyPolicy/snn") -> dict[str, Any]:
    res: dict[str, Any] = {"cpu": cpu, "memory": "1Gi"}
    if gpus:
        res["nvidia.com/gpu"] = str(gpus)
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}",
                         "annotations": {ANN_RESOLVED: Resolved(policy, scope,
                                                                source=source).annotation()}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": res,
                                                                 "limits": res}}]}}


def _published(machine: str, name: str, pods: list[dict[str, Any]]) -> dict[str, Any]:
    st = NodeState(name, load_machine(MACHINES / f"{machine}.yaml"))
    for p in pods:
        eff = effective_policy(p, NodePolicy(NodeKind.EMULATED, st.default))
        st.decide(p, eff)
    nt = nodetopology_object(name, {"kubernetes.io/hostname": name})
    nt["metadata"].update({"uid": f"uid-{name}", "resourceVersion": "7"})
    nt["spec"] = {"policy": "single-numa-node", "scope": "pod", "source": "TopologyPolicy/snn",
                  "policyGeneration": 2}
    nt["status"] = build_status(st)
    return dict(json.loads(json.dumps(nt)))


def _fleet() -> list[dict[str, Any]]:
    loads = [_pod(f"p{i}", str(1 + i % 3), gpus=i % 2,
                  policy=("single-numa-node", "best-effort", "restricted")[i % 3],
                  source=("TopologyPolicy/snn", "node-default", "pod")[i % 3])
             for i in range(12)]
    nts = [_published(m, f"{m}-0", loads) for m in (
        "fragmented-8numa", "dgx-a100-like", "group4-gpu", "seed-figure1", "dual-16core")]
    real = copy.deepcopy(nts[2])
    real["metadata"]["name"] = "real"
    real["status"]["kubelet"] = KUBELET
    nri = copy.deepcopy(nts[3])
    nri["metadata"]["name"] = "nri"
    nri["status"]["kubelet"] = {"topologyManagerPolicy": "none"}
    nri["status"]["conditions"] = [*nri["status"].get("conditions", []), NRI]
    odd = copy.deepcopy(nts[0])
    odd["metadata"]["name"] = "odd"
    odd["status"]["zones"] = ["x", *odd["status"]["zones"][:2],
                              {"id": 9, "capacity": {"cpu": 2, "memory": "1Gi"},
                               "available": {"cpu": 1}},
                              {"id": 10, "capacity": {"cpu": 64}, "allocatable": {}}]
    odd["status"]["admitted"] = ["x", 5, *odd["status"]["admitted"][:3], {"other": 1},
                                 {"policy": 1}, {"policy": True}, {"policy": ["x"]}]
    odd["status"]["rejected"] = 3
    return [*nts, real, nri, odd,
            {"metadata": {"name": "bare"}},
            {"metadata": {"name": "zones-object"}, "spec": {}, "status": {"zones": {"a": 1},
                                                                          "admitted": "x"}},
            {"metadata": {}, "status": {"zones": []}}]


FLEET = _fleet()
PODS = [_pod("a", "1"), _pod("b", "6"), _pod("c", "2", gpus=2), _pod("d", "12", gpus=1),
        _pod("e", "30", policy="best-effort", scope="container", source="pod"),
        _pod("f", "3", gpus=4, policy="restricted", scope="container")]


def _slim(nts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [cache.slim_nt(nt) for nt in nts]


def test_the_kept_copy_is_small_and_drops_what_no_reader_uses() -> None:
    whole = FLEET[1]
    slim = cache.slim_nt(whole)
    assert set(slim["status"]) <= {"conditions", "kubelet", "zones", "admitted", "rejected",
                                   "summary"}
    assert "devices" in whole["status"] and "cpus" in whole["status"]["admitted"][0]
    assert all(set(a) <= {"policy", "source"} for a in slim["status"]["admitted"])
    assert len(slim["status"]["admitted"]) == len(whole["status"]["admitted"])
    assert len(repr(slim)) * 3 < len(repr(whole))
    # admitted pods under the same policy and source share one read-only entry
    entries = slim["status"]["admitted"]
    same = [a for a in entries if a == entries[0]]
    assert len(same) > 1 and all(a is same[0] for a in same)
    with pytest.raises(TypeError):
        entries[0]["policy"] = "none"  # type: ignore[index]
    # what is not what the schema says is kept as it came
    assert cache.slim_nt({"metadata": {"name": "x"}, "status": "x"}) == {
        "metadata": {"name": "x"}, "status": "x"}


@pytest.mark.parametrize("pod", PODS, ids=lambda p: p["metadata"]["name"])
def test_unfit_nodes_are_the_same(pod: dict[str, Any]) -> None:
    assert unfit_among(pod, _slim(FLEET)) == unfit_among(pod, FLEET)
    assert unfit_among(pod, _slim(FLEET), ["odd"]) == unfit_among(pod, FLEET, ["odd"])


def test_some_node_is_judged_unfit() -> None:
    """The comparisons above judge something: the big pods do not fit everywhere."""
    assert unfit_among(PODS[3], FLEET) and unfit_among(PODS[5], FLEET) != unfit_among(
        PODS[5], FLEET[:0])


def test_node_policy_kind_and_reads_are_the_same() -> None:
    kinds = set()
    for whole, slim in zip(FLEET, _slim(FLEET), strict=True):
        assert NodePolicy.from_nodetopology(slim) == NodePolicy.from_nodetopology(whole)
        a, b = NodeTopologyRead.of(whole), NodeTopologyRead.of(slim)
        assert (b.metadata.name, b.metadata.resource_version, b.spec) == (
            a.metadata.name, a.metadata.resource_version, a.spec)
        assert (b.status.zones, b.status.kubelet_settings, b.status.nri_placing) == (
            a.status.zones, a.status.kubelet_settings, a.status.nri_placing)
        labels = {"numalign.io/managed": "nri"}
        assert NodeKind.of(b.with_node_labels(labels)) == NodeKind.of(a.with_node_labels(labels))
        kinds.add(NodeKind.of(a))
    assert kinds == set(NodeKind)


def test_node_defaults_are_the_same() -> None:
    pols = [{"metadata": {"name": "snn"}, "spec": {"policy": "single-numa-node",
                                                   "scope": "pod", "nodeSelector": {}}}]
    for whole, slim in zip(FLEET, _slim(FLEET), strict=True):
        for labels in ({}, {"numalign.io/managed": "nri"}):
            want = nodedefaults.desired_spec(labels, pols, whole)
            assert nodedefaults.desired_spec(labels, pols, slim) == want
            assert nodedefaults.spec_patch(slim.get("spec") or {}, want) == \
                nodedefaults.spec_patch(whole.get("spec") or {}, want)


def test_policy_counts_are_the_same() -> None:
    for name in ("snn", "other"):
        obj = {"metadata": {"name": name, "generation": 1},
               "spec": {"policy": "single-numa-node"}}
        whole = policies.compute_status(obj, [], {}, FLEET, [])
        slim = policies.compute_status(obj, [], {}, _slim(FLEET), [])
        assert slim["admittedPods"] == whole["admittedPods"]
        assert policies._same(slim, whole)
    snn = {"metadata": {"name": "snn"}, "spec": {"policy": "single-numa-node"}}
    assert policies.compute_status(snn, [], {}, _slim(FLEET), [])["admittedPods"] > 0


def _scrape(nts: list[dict[str, Any]]) -> str:
    collector = metrics.NodeTopologyCollector()
    collector.refresh(nts)
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def test_node_metrics_are_the_same_from_the_kept_copy() -> None:
    whole = _scrape(FLEET)
    assert _scrape(_slim(FLEET)) == whole
    assert 'numalign_node_free{node="dgx-a100-like-0",resource="cpu",zone="0"}' in whole
    assert 'numalign_pods_rejected{node="odd"} 3.0' in whole
    assert 'numalign_pods_admitted{node="fragmented-8numa-0",policy="restricted",' \
        'source="pod"} 4.0' in whole


def test_node_metrics_read_the_statuses_as_the_gauges_did() -> None:
    nts = [{"metadata": {"name": "n"}, "status": {
        "admitted": [{"policy": "single-numa-node", "source": "pod"}, {"source": "pod"},
                     {"policy": "single-numa-node", "source": "pod"}, "x"],
        "rejected": 2, "zones": [
            {"id": 0, "allocatable": {"cpu": 4, "memory": "1Gi"},
             "available": {"cpu": "1500m", "memory": "bad"}}, "x"]}}]
    text = _scrape(nts)
    for line in ('numalign_pods_admitted{node="n",policy="single-numa-node",source="pod"} 2.0',
                 'numalign_pods_admitted{node="n",policy="none",source="pod"} 1.0',
                 'numalign_pods_rejected{node="n"} 2.0',
                 'numalign_node_free{node="n",resource="cpu",zone="0"} 1.5',
                 'numalign_node_allocatable{node="n",resource="memory",zone="0"} 1.073741824e+09'):
        assert line in text
    assert 'numalign_node_free{node="n",resource="memory",zone="0"}' not in text
    metrics.refresh_from_node_topologies([])
    assert "numalign_node_free{" not in _scrape([])


def test_the_store_keeps_the_slim_copy_from_events_lists_and_writes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    kube.add(NT_BASE, copy.deepcopy(FLEET[0]))
    monkeypatch.setattr(connection, "client", lambda: kube)
    store = cache.Store("nts", cache._custom(NT_BASE, cache.slim_nt), cache._name, cache.slim_nt)
    cache.feed(store, FLEET[1], "ADDED")
    assert store.get("dgx-a100-like-0") == cache.slim_nt(FLEET[1])
    asyncio.run(store.fill())
    assert store.get("fragmented-8numa-0") == cache.slim_nt(FLEET[0])
    assert store.get("dgx-a100-like-0") == cache.slim_nt(FLEET[1])  # newer than the LIST
    assert cache.NODE_TOPOLOGIES._slim is cache.slim_nt


class _Pages(FakeKube):
    """Answers a LIST a page (``limit``) at a time; counts the pages read."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = self.pages = 0

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]:
        doc = await super().get(path, None)
        p = dict(params or {})
        start, limit = int(p.get("continue") or 0), int(p["limit"])
        items = doc["items"][start:start + limit]
        self.largest = max(self.largest, len(items))
        self.pages += 1
        more = start + limit < len(doc["items"])
        return {"items": items, "metadata": {"resourceVersion": "9",
                                             "continue": str(start + limit) if more else ""}}


def test_a_list_keeps_what_keep_says_page_by_page() -> None:
    kube = _Pages()
    for i in range(7):
        kube.add("/api/v1/nodes", {"metadata": {"name": f"n{i}", "labels": {"i": str(i)}},
                                   "status": {"images": ["x"] * 10}})
    held: list[int] = []

    def keep(obj: dict[str, Any]) -> dict[str, Any] | None:
        held.append(kube.pages)
        return None if obj["metadata"]["name"] == "n3" else cache.slim_labels(obj)

    items, rv = asyncio.run(Kube.list_all(kube, "/api/v1/nodes", page=3,  # type: ignore[arg-type]
                                          keep=keep))
    assert [i["metadata"]["name"] for i in items] == ["n0", "n1", "n2", "n4", "n5", "n6"]
    assert all("status" not in i for i in items) and rv == "9"
    # each page is kept before the next one is read
    assert kube.largest == 3 and held == [1, 1, 1, 2, 2, 2, 3]
