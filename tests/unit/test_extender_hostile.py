"""The extender against a hostile client on the pod network and a tenant who may create
pods: forged pods are not decided, counted or kept; bodies are bounded in bytes and in
JSON values; slow or idle connections are closed; the probes answer on their own
listener; one pod's filter cannot hold up the others; the machine table shrinks with
the fleet. The bind verb against the real API server: tests/cluster/test_extender_bind.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from test_extender_decide import node, pod, published

from numalign.agent.state import NodeState
from numalign.extender.decide import OUT_OF_TIME, Decider
from numalign.extender.fleet import Fleet
from numalign.extender.guard import GuardedSite, Limits
from numalign.extender.pending import PendingPods, slim
from numalign.extender.server import ExtenderServer
from numalign.topology.machine import load_machine
from testdata import MACHINES

SMALL = node("fragmented-8numa", "small")
BIG = node("dual-16core", "big")
SIX = pod("six", {"cpu": "6", "memory": "1Gi"})
EMPTY_SIX = {**SIX, "spec": {"containers": [{"name": "main", "image": "pause"}]}}
SERVERS: dict[int, ExtenderServer] = {}


def args(p: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": p, "Nodes": None, "NodeNames": names}


@pytest_asyncio.fixture(loop_scope="function")
async def client() -> AsyncIterator[TestClient[Any, Any]]:
    fleet = Fleet()
    fleet.load_nodetopologies([published(SMALL, 1), published(BIG, 1)])
    fleet.load_pods([])
    pending = PendingPods()
    pending.load([SIX])
    server = ExtenderServer(fleet, pending=pending)
    server.ready = True
    async with TestClient(TestServer(server.app())) as c:
        SERVERS[id(c)] = server
        yield c
        del SERVERS[id(c)]


# ---------------------------------------------------------------- forged pods (1, 2, 3)


async def test_a_made_up_pod_is_refused_and_nothing_of_it_counts(
        client: TestClient[Any, Any]) -> None:
    """A pod the API server does not have (a made-up uid), with an empty spec that would
    pass every node: refused, in flight nowhere, so it refuses no real pod."""
    fleet = SERVERS[id(client)].fleet
    forged = pod("forged", {"cpu": "16", "memory": "1Gi"})
    for _ in range(3):
        r = await client.post("/filter", json=args(forged, ["small", "big", "nowhere"]))
        assert r.status == 403
        doc = await r.json()
        assert "no pod" in doc["Error"] or "not a pending pod" in doc["Error"], doc
        assert doc["NodeNames"] is None
    assert len(fleet.in_flight) == 0
    assert fleet.approved("uid-forged", "big") is None
    # the real pod is decided as before
    r = await client.post("/filter", json=args(SIX, ["small", "big"]))
    assert (await r.json())["NodeNames"] == ["big"]


async def test_the_watched_spec_is_decided_not_the_bodys(
        client: TestClient[Any, Any]) -> None:
    """A body under a real pod's uid with another spec (an empty one, passing every node)
    is decided with the spec the API server has: the real pod's approval and what it
    would hold stay the real pod's."""
    fleet = SERVERS[id(client)].fleet
    r = await client.post("/filter", json=args(EMPTY_SIX, ["small", "big"]))
    doc = await r.json()
    assert doc["NodeNames"] == ["big"] and list(doc["FailedNodes"]) == ["small"]
    approved = fleet.approved("uid-six", "big")
    assert approved is not None
    assert approved["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "6", "memory": "1Gi"}}
    [(_, held)] = fleet.in_flight.on_node("big")
    assert sum(len(a.cpus) for _, a in held.containers) == 6


@pytest.mark.parametrize("change", ["another-scheduler", "bound", "other-name"])
async def test_only_unbound_pods_of_our_schedulers_under_their_own_name(
        client: TestClient[Any, Any], change: str) -> None:
    pending = SERVERS[id(client)].pending
    body = SIX
    if change == "another-scheduler":
        pending.event("MODIFIED", {**SIX, "spec": {**SIX["spec"], "schedulerName": "other"}})
    elif change == "bound":
        pending.event("DELETED", SIX)
    else:
        body = {**SIX, "metadata": {**SIX["metadata"], "name": "victim"}}
    r = await client.post("/filter", json=args(body, ["big"]))
    assert r.status == 403, await r.text()
    assert SERVERS[id(client)].fleet.approved("uid-six", "big") is None


async def test_nodes_not_decided_pass_but_are_no_approval(
        client: TestClient[Any, Any]) -> None:
    """A node without a NodeTopology (or a name that does not exist) passes filter (fail
    open), but the bind verb binds only onto nodes the extender decided."""
    fleet = SERVERS[id(client)].fleet
    r = await client.post("/filter", json=args(SIX, ["big", "nowhere"]))
    assert (await r.json())["NodeNames"] == ["big", "nowhere"]
    assert fleet.approved("uid-six", "big") is not None
    assert fleet.approved("uid-six", "nowhere") is None


# ---------------------------------------------------------------- what a body costs (4)


async def test_a_body_of_tiny_values_is_refused_before_it_is_parsed(
        client: TestClient[Any, Any]) -> None:
    """Under the byte limit, a body of tiny JSON arrays (which would parse to ~20 times
    its size) is refused by its count of values, before parsing."""
    limits = SERVERS[id(client)].limits
    body = b'{"Pod": ' + b"[" + b"[]," * (limits.max_body // 4) + b"[]]}"
    assert len(body) < limits.max_body
    r = await client.post("/filter", data=body, headers={"Content-Type": "application/json"})
    assert r.status == 413
    assert "JSON values" in (await r.json())["Error"]


async def test_nothing_of_a_large_body_is_kept(client: TestClient[Any, Any]) -> None:
    """The pod decided and kept is the slim one of the watch, whatever the body holds."""
    server = SERVERS[id(client)]
    fat = {**SIX, "metadata": {**SIX["metadata"], "annotations": {
        **SIX["metadata"]["annotations"], "junk": "x" * 1_000_000}}}
    r = await client.post("/filter", json=args(fat, ["big"]))
    assert (await r.json())["NodeNames"] == ["big"]
    approved = server.fleet.approved("uid-six", "big")
    assert approved is server.pending.get("uid-six")
    assert len(json.dumps(approved)) < 1000


def test_slim_keeps_what_the_decision_reads_and_nothing_else() -> None:
    full = {**SIX, "metadata": {**SIX["metadata"], "resourceVersion": "7",
                                "managedFields": [{"x": "y" * 10_000}],
                                "annotations": {**SIX["metadata"]["annotations"],
                                                "numalign.io/gpus": "[]",
                                                "kubectl.kubernetes.io/last-applied-"
                                                "configuration": "z" * 100_000}},
            "spec": {**SIX["spec"], "schedulerName": "s", "volumes": [{"name": "v"}] * 100,
                     "initContainers": [{"name": "i", "image": "x", "command": ["a"] * 99,
                                         "restartPolicy": "Always"}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled"}]}}
    s = slim(full)
    assert s["metadata"]["annotations"] == {
        "numalign.io/resolved": SIX["metadata"]["annotations"]["numalign.io/resolved"],
        "numalign.io/gpus": "[]"}
    assert s["metadata"]["resourceVersion"] == "7" and "managedFields" not in s["metadata"]
    assert s["spec"] == {"containers": [{"name": "main", "resources": {
        "limits": {"cpu": "6", "memory": "1Gi"}}}],
        "initContainers": [{"name": "i", "restartPolicy": "Always"}], "schedulerName": "s"}
    assert s["status"] == {"phase": "Pending"}


# ---------------------------------------------------------------- slow clients (5)


async def _serve(server: ExtenderServer, limits: Limits
                 ) -> tuple[list[web.AppRunner], int, int]:
    runners = [web.AppRunner(app, access_log=None, **limits.runner_args())
               for app in (server.app(), server.probe_app())]
    ports = []
    for r in runners:
        await r.setup()
        site = GuardedSite(r, "127.0.0.1", 0, limits)
        await site.start()
        ports.append(int(r.addresses[0][1]))
    return runners, ports[0], ports[1]


async def _closed(reader: asyncio.StreamReader, within: float) -> bytes | None:
    """What the server sent before closing, or None if still open after ``within``."""
    try:
        return await asyncio.wait_for(reader.read(), within)
    except TimeoutError:
        return None


async def _get(port: int, path: str = "/healthz") -> bytes | None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    try:
        return await _closed(reader, 2.0)
    finally:
        writer.close()


async def test_partial_requests_are_closed_and_the_probes_still_answer() -> None:
    """A client (another address) holding every connection with requests it never
    finishes: the scheduler's address still gets in (the hog's oldest goes), the probes'
    listener answers, and every slow one is closed by its deadline."""
    limits = Limits(header_timeout=0.5, body_timeout=0.5, max_connections=8)
    fleet = Fleet()
    fleet.load_nodetopologies([published(BIG, 1)])
    server = ExtenderServer(fleet, pending=PendingPods(), limits=limits)
    server.ready = True
    runners, port, probe_port = await _serve(server, limits)
    conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        # a request head never finished, and a body that never arrives
        for i in range(limits.max_connections):
            reader, writer = await asyncio.open_connection("127.0.0.1", port,
                                                           local_addr=("127.0.0.2", 0))
            if i % 2:
                writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            else:
                writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: "
                             b"application/json\r\nContent-Length: 1000\r\n\r\n{\"Pod\"")
            await writer.drain()
            conns.append((reader, writer))
        # the listener is full: the scheduler's address is served, the hog's oldest goes
        answer = await _get(port)
        assert answer is not None and answer.startswith(b"HTTP/1.1 200"), answer
        assert await _closed(conns[0][0], 0.2) is not None  # closed (or answered 408)
        # the probes' listener answers
        answer = await _get(probe_port)
        assert answer is not None and answer.startswith(b"HTTP/1.1 200")
        # every slow one is closed by its deadline (those in their body answered 408)
        answers = await asyncio.gather(*(_closed(r, 5.0) for r, _ in conns[1:]))
        assert all(a is not None for a in answers), answers
        assert all(a.startswith(b"HTTP/1.1 408") for a in answers[1::2]), answers[1::2]
    finally:
        for _, w in conns:
            w.close()
        for r in runners:
            await r.cleanup()


def test_the_probes_app_serves_no_verb() -> None:
    app = ExtenderServer(Fleet()).probe_app()
    paths = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
    assert paths == {"/healthz", "/readyz", "/metrics"}


# ---------------------------------------------------------------- one pod's time (6)


def test_a_pod_whose_filter_runs_out_of_time_holds_up_nothing() -> None:
    """Past the budget, the nodes left pass undecided (fail open, as the scheduler does
    without an answer) and are no approval."""
    ticks = iter(range(100))
    names = [f"n{i}" for i in range(5)]
    fleet = Fleet()
    fleet.load_nodetopologies([published(node("dual-16core", n), 1) for n in names])
    verdicts = fleet.decider.filter(SIX, names, budget=2.5, clock=lambda: next(ticks))
    assert [v.covered for v in verdicts] == [True, True, False, False, False]
    assert all(v.fits for v in verdicts) and verdicts[-1].note == OUT_OF_TIME


# ---------------------------------------------------------------- the machine table (7)


def _nt(machine: str, name: str) -> dict[str, Any]:
    return published(NodeState(name, load_machine(MACHINES / f"{machine}.yaml")), 1)


def test_the_machine_table_shrinks_with_the_fleet() -> None:
    """Machines, and the verdicts cached for them, go with the last node of that machine
    (deleted, or missing from a relisting)."""
    machines = ["dual-16core", "fragmented-8numa", "group4-gpu", "seed-figure1"]
    d = Decider()
    fleet = Fleet(decider=d)
    fleet.load_nodetopologies([_nt(m, f"{m}-{i}") for m in machines for i in range(2)])
    assert len(d.machines) == len(machines)
    # prioritize: every node decided in full (a filter's refusal may be shared between
    # machines), one verdict cached per machine
    fleet.filter(SIX, list(d.views), approve=False)
    assert len(d._cache) == len(machines)
    fleet.node_topology("DELETED", {"metadata": {"name": "dual-16core-0"}})
    assert len(d.machines) == len(machines)  # dual-16core-1 still has it
    fleet.node_topology("DELETED", {"metadata": {"name": "dual-16core-1"}})
    assert len(d.machines) == len(machines) - 1 and len(d._cache) == len(machines) - 1
    fleet.load_nodetopologies([_nt("group4-gpu", "group4-gpu-0")])  # a relisting
    assert len(d.machines) == 1 and len(d._cache) == 1
    fleet.load_nodetopologies([])
    assert d.machines == {} and len(d._cache) == 0


# ---------------------------------------------------------------- earlier rounds' corpora


def _corpus() -> list[tuple[str, dict[str, Any]]]:
    """The hostile quantities and GPU requests of the earlier rounds
    (tests/unit/test_hostile_input.py), as pods the API server could hold."""
    from test_hostile_input import HOSTILE_QUANTITIES

    out = []
    for i, q in enumerate(HOSTILE_QUANTITIES):
        if not isinstance(q, str):
            continue  # the API server stores quantities as strings
        out.append((f"memory={q[:12]}", pod(f"q{i}", {"cpu": "1", "memory": q})))
    for i, gpus in enumerate(['[{"count": 1, "minMemory": "1e999999"}]', "[" * 5000,
                              '[{"count": 99999999}]', '{"count": 1}',
                              '[{"count": 1, "resource": "\\u001b]0;x\\u0007"}]',
                              json.dumps([{"name": f"g{k}", "count": 1} for k in range(64)])]):
        out.append((f"gpus={gpus[:12]}", pod(f"g{i}", {"cpu": "1", "memory": "1Gi"},
                                             annotations={"numalign.io/gpus": gpus})))
    return out


@pytest.mark.parametrize(("what", "bad"), _corpus(), ids=[w for w, _ in _corpus()])
async def test_hostile_pods_get_an_answer_and_break_nothing(
        client: TestClient[Any, Any], what: str, bad: dict[str, Any]) -> None:
    """Each is answered (refused with the field named, or left to the node), with no raw
    control character; the next pod is decided as before."""
    server = SERVERS[id(client)]
    server.pending.event("ADDED", bad)
    r = await client.post("/filter", json=args(bad, ["small", "big"]))
    assert r.status == 200, await r.text()
    text = await r.text()
    assert "\x1b" not in text and "\x07" not in text
    r = await client.post("/filter", json=args(SIX, ["small", "big"]))
    assert (await r.json())["NodeNames"] == ["big"]
