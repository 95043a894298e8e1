"""The bind verb of a pod with DRA claims: the pod's hold on the node (what the next
pods are decided against until the node publishes it) is decided with the devices the
scheduler allocated, read from the API server at bind, not with whichever device the
allocator might have given. Before, the hold of a single-numa-node pod sat next to the
first GPU it could have got, and the node then put the pod next to the GPU it did get:
the next pods were decided against CPUs that were not the ones taken (the DRA placement
bench saw TopologyAffinityErrors with the extender)."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from test_extender_dra import NAMES, fleet, pod

from numalign.api import draemulated as de
from numalign.api.kube import ApiError
from numalign.extender.fleet import Fleet
from numalign.extender.pending import PendingPods
from numalign.extender.server import ExtenderServer

P = pod("p", "single-numa-node", gpus=1)
P["status"] = {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "p-gpus"}]}
BIND = {"PodName": "p", "PodNamespace": "ns", "PodUID": "uid-p", "Node": "n0"}
NUMA1 = set(range(16, 32))


def allocated(device: str) -> dict[str, Any]:
    """The claim as the scheduler wrote it before asking to bind: ``device``."""
    return {"metadata": {"name": "p-gpus", "namespace": "ns",
                         "annotations": {"resource.kubernetes.io/pod-claim-name": "gpus"},
                         "ownerReferences": [{"kind": "Pod", "name": "p", "uid": "uid-p"}]},
            "spec": P["_template"]["spec"]["spec"],
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": de.DRIVER, "pool": "n0",
                 "device": NAMES[device]}]}}}}


class Api:
    """Bindings succeed; a GET of the pod's claim answers ``claim`` (None: 503)."""

    def __init__(self, claim: dict[str, Any] | None) -> None:
        self.claim = claim
        self.calls: list[tuple[str, str]] = []

    async def request(self, method: str, path: str, **_: Any) -> Any:
        self.calls.append((method, path))
        if method == "GET":
            if self.claim is None:
                raise ApiError(503, {"message": "unavailable"}, "GET", path)
            return self.claim
        return {}


async def _bound(claim: dict[str, Any] | None) -> tuple[ExtenderServer, Api]:
    pending = PendingPods()
    pending.load([P])
    api = Api(claim)
    server = ExtenderServer(Fleet(fleet({"n0": ()}, P)), pending=pending,
                            kube=api)  # type: ignore[arg-type]
    server.fleet.load_pods([])
    server.ready = True
    async with TestClient(TestServer(server.app())) as c:
        r = await c.post("/filter", json={"Pod": P, "Nodes": None, "NodeNames": ["n0"]})
        assert (await r.json())["NodeNames"] == ["n0"]
        r = await c.post("/bind", json=BIND)
        assert (await r.json())["Error"] == ""
    return server, api


def _held_cpus(server: ExtenderServer) -> set[int]:
    (held,) = server.fleet.reservations.on_node("n0")
    return {c for _, alloc in held.containers for c in alloc.cpus}


async def test_the_hold_sits_next_to_the_gpu_the_scheduler_allocated() -> None:
    server, api = await _bound(allocated("gpu2"))  # gpu2 is on NUMA node 1
    assert ("GET", "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/p-gpus") in api.calls
    cpus = _held_cpus(server)
    assert len(cpus) == 4 and cpus <= NUMA1, cpus


async def test_a_claim_that_cannot_be_read_leaves_the_watchs_view() -> None:
    # the API server does not answer: the pod is still bound, its hold decided as the
    # claims' watch has them (here: not allocated yet, the first choice, NUMA node 0)
    server, _api = await _bound(None)
    assert server.fleet.bound.get("uid-p") == "n0"
    cpus = _held_cpus(server)
    assert len(cpus) == 4 and not cpus & NUMA1, cpus
