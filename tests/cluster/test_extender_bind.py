"""The extender's bind verb against the real API server: it binds a pod it approved for
the node (the pod's ``spec.nodeName`` is set, the pod's room is reserved there at once and
no longer counted in flight elsewhere), and refuses, binding nothing, a pod it did not
approve for that node, a pod whose uid is not the one approved, and malformed
``ExtenderBindingArgs`` (the field named). Pods here name a scheduler that does not run,
so only the extender binds them."""

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
from numalign.extender.server import ExtenderServer
from numalign.topology.machine import load_machine

pytestmark = pytest.mark.cluster

SIX = {"cpu": "6", "memory": "1Gi"}


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
            "spec": {"schedulerName": "numalign-test-nobody",
                     "containers": [{"name": "c", "image": "pause",
                                     "resources": {"requests": SIX, "limits": SIX}}]}}


@pytest_asyncio.fixture(loop_scope="function")
async def bound(kubeconfig: Path) -> AsyncIterator[tuple[TestClient[Any, Any], Kube, Fleet]]:
    fleet = Fleet()
    fleet.load_nodetopologies([_published("fragmented-8numa", "small"),
                               _published("dual-16core", "big")])
    fleet.load_pods([])
    async with Kube(load_config(str(kubeconfig))) as kube:
        server = ExtenderServer(fleet, kube=kube)
        server.ready = True
        async with TestClient(TestServer(server.app())) as client:
            yield client, kube, fleet


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
    assert "binding" in (await r.json())["Error"]
    assert fleet.reservations.get(second["metadata"]["uid"]) is None
    assert (await kube.get(f"{base}/p1"))["spec"]["nodeName"] == "elsewhere"
