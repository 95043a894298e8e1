"""The extender's HTTP protocol (k8s.io/kube-scheduler/extender/v1 JSON) on a real
aiohttp server: filter, prioritize, bad input (clear 400s, bounded size), readiness,
metrics with the names the dashboard reads."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from test_extender_decide import node, pod, published, resolved_of

from agent_helpers import given
from numalign.extender.fleet import Fleet
from numalign.extender.pending import PendingPods
from numalign.extender.server import ExtenderServer

SMALL = node("fragmented-8numa", "small")
BIG = node("dual-16core", "big")
MAX_BODY = 128 << 10
SERVERS: dict[int, ExtenderServer] = {}


@pytest_asyncio.fixture(loop_scope="function")  # the loop the test runs in
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    fleet = Fleet()
    fleet.load_nodetopologies([published(SMALL, 1), published(BIG, 1)])
    fleet.load_pods([])
    pending = PendingPods()
    pending.load([SIX, SPREAD])  # the pods the API server has, unbound
    server = ExtenderServer(fleet, max_body=MAX_BODY, pending=pending)
    server.ready = True
    async with TestClient(TestServer(server.app())) as c:
        SERVERS[id(c)] = server
        yield c
        del SERVERS[id(c)]


def args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": p, "Nodes": None, "NodeNames": names}


SIX = pod("six", {"cpu": "6", "memory": "1Gi"})
SPREAD = pod("spread", {"cpu": "8", "memory": "1Gi"}, policy="best-effort")


async def test_filter_refuses_with_the_kubelets_reason(client: TestClient[Any, Any]) -> None:
    r = await client.post("/filter", json=args(SIX, ["small", "big", "no-numalign"]))
    assert r.status == 200
    doc = await r.json()
    assert doc["NodeNames"] == ["big", "no-numalign"]
    assert doc["Nodes"] is None and doc["Error"] == ""
    assert list(doc["FailedNodes"]) == ["small"]
    assert doc["FailedNodes"]["small"].startswith(
        "TopologyAffinityError: Resources cannot be allocated with Topology locality")
    assert "policy single-numa-node" in doc["FailedNodes"]["small"]
    assert doc["FailedAndUnresolvableNodes"] == {}
    # the same verdict as the node itself
    assert not SMALL.decide(SIX, given(resolved_of(SIX))).admit
    SMALL.release("uid-six")


async def test_filter_with_node_objects_when_not_cache_capable(
        client: TestClient[Any, Any]) -> None:
    nodes = {"apiVersion": "v1", "kind": "NodeList", "items": [
        {"metadata": {"name": "small"}}, {"metadata": {"name": "big"}}]}
    r = await client.post("/filter", json={"Pod": SIX, "Nodes": nodes, "NodeNames": None})
    doc = await r.json()
    assert [n["metadata"]["name"] for n in doc["Nodes"]["items"]] == ["big"]
    assert doc["NodeNames"] is None and list(doc["FailedNodes"]) == ["small"]


async def test_prioritize_scores_alignment(client: TestClient[Any, Any]) -> None:
    r = await client.post("/prioritize", json=args(SPREAD, ["small", "big", "other"]))
    assert r.status == 200
    scores = {h["Host"]: h["Score"] for h in await r.json()}
    assert scores["big"] == 10 > scores["small"] and scores["other"] == 5
    r = await client.post("/prioritize", json=args(SIX, ["small", "big"]))
    assert {h["Host"]: h["Score"] for h in await r.json()} == {"small": 0, "big": 10}


@pytest.mark.parametrize(("body", "status", "error"), [
    (b"{not json", 400, "ExtenderArgs: the body is not JSON"),
    (b"[1, 2]", 400, "ExtenderArgs: must be a JSON object, got list"),
    (json.dumps({"NodeNames": ["a"]}).encode(), 400, "ExtenderArgs.Pod: required"),
    (json.dumps({"Pod": {"metadata": {}}, "NodeNames": []}).encode(), 400,
     "ExtenderArgs.Pod.metadata.name: required"),
    (json.dumps({"Pod": {"metadata": {"name": "x"}}, "NodeNames": []}).encode(), 400,
     "ExtenderArgs.Pod.spec: required"),
    (json.dumps({"Pod": SIX, "NodeNames": ["a", 7]}).encode(), 400,
     "ExtenderArgs.NodeNames[1]: must be a node name"),
    (json.dumps({"Pod": SIX, "NodeNames": "a"}).encode(), 400,
     "ExtenderArgs.NodeNames: must be a list"),
    (json.dumps({"Pod": SIX}).encode(), 400, "ExtenderArgs: needs NodeNames"),
    (json.dumps({"Pod": SIX, "Nodes": {"items": [{"metadata": {}}]}}).encode(), 400,
     "ExtenderArgs.Nodes.items[0].metadata.name: required"),
    (b"[" * 100_000 + b"]" * 100_000, 413, "over"),
    (b"[" * 30_000 + b"]" * 30_000, 413, "JSON values"),
    (b"[" * 2_000 + b"]" * 2_000, 400, "ExtenderArgs: the body is not JSON"),
    (json.dumps({"Pod": SIX, "NodeNames": ["n"] * 5000 + ["x" * 300]}).encode(), 400,
     "ExtenderArgs.NodeNames[5000]: must be a node name of at most 253 characters"),
])
@pytest.mark.parametrize("verb", ["/filter", "/prioritize"])
async def test_bad_input_is_a_clear_error(client: TestClient[Any, Any], verb: str,
                                          body: bytes, status: int, error: str) -> None:
    r = await client.post(verb, data=body, headers={"Content-Type": "application/json"})
    assert r.status == status
    doc = await r.json()
    assert error in doc["Error"], doc["Error"]
    # the server still answers
    r = await client.post("/filter", json=args(SIX, ["big"]))
    assert (await r.json())["NodeNames"] == ["big"]


async def test_not_ready_until_listed(client: TestClient[Any, Any]) -> None:
    server = SERVERS[id(client)]
    server.ready = False
    r = await client.post("/filter", json=args(SIX, ["big"]))
    assert r.status == 503 and "not ready" in (await r.json())["Error"]
    assert (await client.get("/readyz")).status == 503
    assert (await client.get("/healthz")).status == 200
    server.ready = True
    assert (await client.get("/readyz")).status == 200


async def test_metrics_names(client: TestClient[Any, Any]) -> None:
    await client.post("/filter", json=args(SIX, ["small", "big"]))
    await client.post("/prioritize", json=args(SIX, ["small", "big"]))
    server = SERVERS[id(client)]
    server.fleet.pod("ADDED", {**SIX, "spec": {**SIX["spec"], "nodeName": "big"},
                               "status": {"phase": "Pending"}})
    text = await (await client.get("/metrics")).text()
    assert 'numalign_extender_refusals_total{reason="TopologyAffinityError"} 1.0' in text
    assert "numalign_extender_filter_duration_seconds_count 1.0" in text
    assert "numalign_extender_prioritize_duration_seconds_count 1.0" in text
    assert 'numalign_extender_decide_cpu_seconds_count{verb="filter"} 1.0' in text
    assert "numalign_extender_reservations 1.0" in text


async def test_https(tmp_path: Path) -> None:
    """--tls-cert/--tls-key: the verbs over HTTPS, the certificate checked by the client;
    with --client-ca only a client with a certificate that CA signed (the scheduler's) is
    answered."""
    import ssl

    import aiohttp
    from aiohttp import web

    from numalign.devcluster import certs
    from numalign.extender.server import ssl_context

    pki = certs.generate(tmp_path / "pki")
    fleet = Fleet()
    fleet.load_nodetopologies([published(BIG, 1)])
    fleet.load_pods([])
    pending = PendingPods()
    pending.load([SIX])
    server = ExtenderServer(fleet, pending=pending)
    server.ready = True
    runner = web.AppRunner(server.app())
    await runner.setup()
    tls = ssl_context(str(pki.apiserver.cert), str(pki.apiserver.key))
    mutual = ssl_context(str(pki.apiserver.cert), str(pki.apiserver.key), str(pki.ca.cert))
    sites = [web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx) for ctx in (tls, mutual)]
    for site in sites:
        await site.start()
    try:
        port, mutual_port = (a[1] for a in runner.addresses)
        trust = ssl.create_default_context(cafile=str(pki.ca.cert))
        async with aiohttp.ClientSession() as session, session.post(
                f"https://127.0.0.1:{port}/filter", ssl=trust, json=args(SIX, ["big"])) as r:
            assert r.status == 200
            assert (await r.json())["NodeNames"] == ["big"]
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientError):  # no client certificate: refused
                async with session.post(f"https://127.0.0.1:{mutual_port}/bind", ssl=trust,
                                        json={}) as r:
                    await r.read()
            trust.load_cert_chain(str(pki.scheduler.cert), str(pki.scheduler.key))
            async with session.post(f"https://127.0.0.1:{mutual_port}/filter", ssl=trust,
                                    json=args(SIX, ["big"])) as r:
                assert r.status == 200
                assert (await r.json())["NodeNames"] == ["big"]
    finally:
        await runner.cleanup()


async def test_bind_needs_the_api_server_and_well_formed_args(
        client: TestClient[Any, Any]) -> None:
    """Without an API server (not started with one) or not ready: 503, nothing bound (the
    scheduler binds). Bound pods: tests/cluster/test_extender_bind.py."""
    body = {"PodName": "six", "PodNamespace": "default", "PodUID": "uid-six", "Node": "big"}
    await client.post("/filter", json=args(SIX, ["big"]))
    r = await client.post("/bind", json=body)
    assert r.status == 503 and "no API server" in (await r.json())["Error"]
    SERVERS[id(client)].ready = False
    r = await client.post("/bind", json=body)
    assert r.status == 503 and "not ready" in (await r.json())["Error"]
    assert SERVERS[id(client)].fleet.reservations.get("uid-six") is None


def test_gc_pacer_freezes_survivors_and_collects_them_now_and_then() -> None:
    """Between requests the survivors are frozen (full collections do not walk them);
    a cycle that becomes garbage afterwards goes at the next rare full pass."""
    import gc
    import weakref

    from numalign.extender.server import NO_AUTOMATIC_FULL, GcPacer

    class Cycle:
        me: object = None

    thresholds = gc.get_threshold()
    pacer = GcPacer(full_every=3)
    try:
        # the collector's own full passes are left to the pacer
        assert gc.get_threshold() == (*thresholds[:2], NO_AUTOMATIC_FULL)
        a = Cycle()
        a.me = a
        ref = weakref.ref(a)
        pacer.tick()
        assert gc.get_freeze_count() > 0
        del a
        pacer.tick()  # the young generations only: the frozen cycle stays
        assert ref() is not None
        pacer.tick()  # the full pass
        assert ref() is None
    finally:
        gc.unfreeze()
        pacer.close()
    assert gc.get_threshold() == thresholds
