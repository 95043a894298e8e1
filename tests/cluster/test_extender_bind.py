"""The extender's bind verb against the real API server: it binds a pod it approved for
the node (the pod's ``spec.nodeName`` is set, the pod's room is reserved there at once and
no longer counted in flight elsewhere), and refuses, binding nothing, a pod it did not
approve for that node, a pod whose uid is not the one approved, and malformed
``ExtenderBindingArgs`` (the field named). Whatever a request's body says, the pod decided
and bound is the API server's (read here, as the pod watch has not shown it): a forged
filter under a real pod's uid cannot shrink what the pod reserves, a made-up uid is
refused, a node the extender did not decide is no approval. Pods here name a scheduler
that does not run, so only the extender binds them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

import testdata
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api.kube import Kube, load_config, q
from numalign.extender.fleet import Fleet
from numalign.extender.pending import PendingPods
from numalign.extender.server import ExtenderServer
from numalign.topology.machine import load_machine

pytestmark = pytest.mark.cluster

SIX = {"cpu": "6", "memory": "1Gi"}
SCHEDULER = "numalign-test-nobody"


def _published(machine: str, name: str) -> dict[str, Any]:
    """The NodeTopology of an empty node of ``machine``."""
    st = NodeState(name, load_machine(testdata.MACHINES / f"{machine}.yaml"))
    return {"metadata": {"name": name, "resourceVersion": "1"}, "spec": {},
            "status": build_status(st)}


def _pod(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": {"numalign.io/resolved": (
                '{"policy": "single-numa-node", "scope": "pod", "options": {}, '
                '"source": "TopologyPolicy/bind"}')}},
            "spec": {"schedulerName": SCHEDULER,
                     "containers": [{"name": "c", "image": "pause",
                                     "resources": {"requests": SIX, "limits": SIX}}]}}


SERVERS: dict[int, ExtenderServer] = {}


def bound_server(client: TestClient[Any, Any]) -> ExtenderServer:
    return SERVERS[id(client)]


@pytest_asyncio.fixture(loop_scope="function")
async def bound(kubeconfig: Path) -> AsyncIterator[tuple[TestClient[Any, Any], Kube, Fleet]]:
    fleet = Fleet()
    fleet.load_nodetopologies([_published("fragmented-8numa", "small"),
                               _published("dual-16core", "big")])
    fleet.load_pods([])
    async with Kube(load_config(str(kubeconfig))) as kube:
        server = ExtenderServer(fleet, kube=kube, pending=PendingPods({SCHEDULER}, kube))
        server.ready = True
        async with TestClient(TestServer(server.app())) as client:
            SERVERS[id(client)] = server
            yield client, kube, fleet
            del SERVERS[id(client)]


async def test_binds_what_it_approved_and_nothing_else(
        bound: tuple[TestClient[Any, Any], Kube, Fleet], namespace: str) -> None:
    client, kube, fleet = bound
    base = f"/api/v1/namespaces/{q(namespace)}/pods"
    made = [await kube.create(base, _pod(f"p{i}")) for i in range(2)]
    first, second = ({**m, "metadata": {**m["metadata"], "namespace": namespace}}
                     for m in made)

    r = await client.post("/filter", json={"Pod": first, "NodeNames": ["small", "big"]})
    assert (await r.json())["NodeNames"] == ["big"]
    assert len(fleet.in_flight.on_node("big")) == 1  # approved, not bound yet

    def args(p: dict[str, Any], node_name: str, uid: str | None = None) -> dict[str, Any]:
        return {"PodName": p["metadata"]["name"], "PodNamespace": namespace,
                "PodUID": uid or p["metadata"]["uid"], "Node": node_name}

    # refused: the node it was not approved for; another pod's uid; a pod never filtered
    for bad in (args(first, "small"), args(first, "big", second["metadata"]["uid"]),
                args(second, "big")):
        r = await client.post("/bind", json=bad)
        assert "was not approved for node" in (await r.json())["Error"], bad
    # malformed: the field named
    r = await client.post("/bind", json={**args(first, "big"), "PodNamespace": "../x"})
    assert r.status == 400
    assert (await r.json())["Error"].startswith("ExtenderBindingArgs.PodNamespace: ")

    r = await client.post("/bind", json=args(first, "big"))
    assert r.status == 200 and (await r.json()) == {"Error": ""}
    got = await kube.get(f"{base}/p0")
    assert got["spec"]["nodeName"] == "big"
    assert not fleet.in_flight.on_node("big")
    reserved = fleet.reservations.get(first["metadata"]["uid"])
    assert reserved is not None and reserved.node == "big"
    assert not (await kube.get(f"{base}/p1"))["spec"].get("nodeName")  # the refused one

    # the API server refuses a second binding: the error is answered, nothing reserved
    r = await client.post("/filter", json={"Pod": second, "NodeNames": ["big"]})
    await kube.create(f"{base}/p1/binding", {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p1"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "elsewhere"}})
    r = await client.post("/bind", json=args(second, "big"))
    # read from the API server (the watch has not shown it): bound already, refused
    # before any binding is tried
    assert "not an unbound pod" in (await r.json())["Error"]
    assert fleet.reservations.get(second["metadata"]["uid"]) is None
    # a watch that still shows it unbound: the API server refuses, nothing reserved
    server = bound_server(client)
    server.pending.event("ADDED", second)
    r = await client.post("/filter", json={"Pod": second, "NodeNames": ["big"]})
    r = await client.post("/bind", json=args(second, "big"))
    assert "binding" in (await r.json())["Error"]
    assert fleet.reservations.get(second["metadata"]["uid"]) is None
    assert (await kube.get(f"{base}/p1"))["spec"]["nodeName"] == "elsewhere"


async def test_a_forged_body_binds_nothing_it_describes(
        bound: tuple[TestClient[Any, Any], Kube, Fleet], namespace: str) -> None:
    """A filter under a real pod's uid with an empty spec (which would pass every node
    and reserve nothing), sent between the scheduler's filter and its bind: the pod is
    decided as the API server has it, and the bind reserves its six CPUs. A made-up uid
    is refused; a node without a NodeTopology passes filter but is not bound to."""
    client, kube, fleet = bound
    base = f"/api/v1/namespaces/{q(namespace)}/pods"
    made = await kube.create(base, _pod("victim"))
    real = {**made, "metadata": {**made["metadata"], "namespace": namespace}}
    uid = real["metadata"]["uid"]
    r = await client.post("/filter", json={"Pod": real, "NodeNames": ["small", "big"]})
    assert (await r.json())["NodeNames"] == ["big"]
    forged = {**real, "spec": {"schedulerName": SCHEDULER, "containers": [
        {"name": "c", "image": "pause"}]}}
    r = await client.post("/filter", json={"Pod": forged, "NodeNames": ["small", "big",
                                                                        "nowhere"]})
    doc = await r.json()
    assert doc["NodeNames"] == ["big", "nowhere"] and list(doc["FailedNodes"]) == ["small"]
    made_up = {**forged, "metadata": {**forged["metadata"], "uid": "0000-made-up"}}
    r = await client.post("/filter", json={"Pod": made_up, "NodeNames": ["big"]})
    assert r.status == 403 and "another uid" in (await r.json())["Error"]
    assert fleet.approved("0000-made-up", "big") is None

    args = {"PodName": "victim", "PodNamespace": namespace, "PodUID": uid}
    r = await client.post("/bind", json={**args, "Node": "nowhere"})
    assert "was not approved for node nowhere" in (await r.json())["Error"]
    r = await client.post("/bind", json={**args, "Node": "big"})
    assert (await r.json()) == {"Error": ""}
    reserved = fleet.reservations.get(uid)
    assert reserved is not None and reserved.node == "big"
    assert sum(len(a.cpus) for _, a in reserved.held.containers) == 6
    # bound now: a filter under its uid is refused (not an unbound pod)
    r = await client.post("/filter", json={"Pod": real, "NodeNames": ["big"]})
    assert r.status == 403 and "not an unbound pod" in (await r.json())["Error"]
