"""The numa-constraint webhook (numalign.controller.claims): a claim generated for a
single-numa-node pod gets a matchAttribute on the NUMA attribute over those of its
requests whose devices all publish it (judged from the cluster's ResourceSlices and
DeviceClasses); a claim of devices without it is never stranded; others are left as they
came; errors fail open."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import kopf
import pytest

from fake_kube import FakeKube
from numalign.api import draconstraint
from numalign.api.kube import ApiError
from numalign.api.names import ANN_RESOLVED
from numalign.api.resolved import Resolved
from numalign.controller import claims, connection, dradevices, webhookconfig

PODS = "/api/v1/namespaces/team/pods"
NUMA = "resource.kubernetes.io/numaNode"
GPU, NIC, OTHER = "gpu.example.com", "nic.example.com", "other.example.com"


@pytest.fixture(autouse=True)
def _fresh_read() -> None:
    dradevices.forget()


def device(name: str, numa: Any = None, **attrs: Any) -> dict[str, Any]:
    """A slice device; ``numa``: its numaNode attribute object ({"int": 0}...), if any."""
    a: dict[str, Any] = {k: {"string": v} for k, v in attrs.items()}
    a["resource.kubernetes.io/pcieRoot"] = {"string": "pci0000:00"}
    if numa is not None:
        a[NUMA] = numa
    return {"name": name, "attributes": a}


def add_slice(kube: FakeKube, driver: str, *devices: dict[str, Any], node: str = "n1"
              ) -> None:
    kube.add(dradevices.SLICES_PATH, {"metadata": {"name": f"{node}-{driver}"}, "spec": {
        "driver": driver, "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "devices": list(devices)}})


def add_class(kube: FakeKube, name: str, *expressions: str) -> None:
    kube.add(dradevices.CLASSES_PATH, {"metadata": {"name": name}, "spec": {
        "selectors": [{"cel": {"expression": e}} for e in expressions]}})


def numa_cluster() -> FakeKube:
    """A pod p of single-numa-node; GPUs and NICs that all publish their NUMA node (one
    NIC as a list: equally close to two nodes); a class per driver."""
    kube = FakeKube()
    kube.add(PODS, pod("single-numa-node"))
    add_slice(kube, GPU, device("g0", {"int": 0}), device("g1", {"int": 1}))
    add_slice(kube, NIC, device("n0", {"int": 0}), device("n1", {"ints": [0, 1]}))
    add_class(kube, "gpu", f'device.driver == "{GPU}"')
    add_class(kube, "nic", f'device.driver == "{NIC}"')
    return kube


def claim(owner: str | None = "p", constraints: list[Any] | None = None,
          requests: tuple[str, ...] = ("gpu", "nic"),
          classes: dict[str, str] | None = None) -> dict[str, Any]:
    """A claim generated for pod ``owner``; each request of the class of its own name
    (or ``classes[request]``)."""
    meta: dict[str, Any] = {"generateName": "p-gpus-", "namespace": "team",
                            "annotations": {claims.POD_CLAIM_ANNOTATION: "gpus"}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "name": owner,
                                    "uid": "u", "controller": True}]
    devices: dict[str, Any] = {"requests": [
        {"name": r, "exactly": {"deviceClassName": (classes or {}).get(r, r)}}
        for r in requests]}
    if constraints is not None:
        devices["constraints"] = constraints
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": {"devices": devices}}


def run(body: dict[str, Any], kube: FakeKube, monkeypatch: pytest.MonkeyPatch
        ) -> dict[str, Any]:
    monkeypatch.setattr(connection, "client", lambda: kube)
    patch = kopf.Patch()
    asyncio.run(claims.mutate_claim(body=kopf.Body(body), patch=patch,
                                    logger=logging.getLogger("test")))
    return dict(patch)


def pod(policy: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "team", "annotations": {
        ANN_RESOLVED: Resolved(policy, "container", source="pod").annotation()}}}


def test_a_single_numa_node_pods_claim_gets_one_numa_node_over_its_requests(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kube = numa_cluster()
    body = claim()
    patch = run(body, kube, monkeypatch)
    assert patch["spec"]["devices"]["constraints"] == [
        {"requests": ["gpu", "nic"], "matchAttribute": "resource.kubernetes.io/numaNode"}]
    # the requests go along unchanged: the JSON patch only adds the constraints
    ops = kopf.Patch(patch).as_json_patch(kopf.Body(body))
    assert ops == [{"op": "add", "path": "/spec/devices/constraints", "value": [
        {"requests": ["gpu", "nic"], "matchAttribute": "resource.kubernetes.io/numaNode"}]}]


@pytest.mark.parametrize("policy", ["restricted", "best-effort", "none"])
def test_other_policies_are_left_alone(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    kube.add(PODS, pod(policy))
    assert run(claim(), kube, monkeypatch) == {}


def test_claims_with_constraints_shared_claims_and_unknown_pods_are_left_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()
    kube.add(PODS, pod("single-numa-node"))
    own = [{"matchAttribute": "emulated.numalign.io/nvlink"}]
    assert run(claim(constraints=own), kube, monkeypatch) == {}
    assert run(claim(owner=None), kube, monkeypatch) == {}  # shared by name: no owner
    assert run(claim(requests=()), kube, monkeypatch) == {}
    assert run(claim(owner="gone"), kube, monkeypatch) == {}  # the pod is not found


def test_an_api_error_fails_open(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = FakeKube()

    def refuse(method: str, path: str, body: Any) -> ApiError:
        return ApiError(500, {"message": "etcd down"}, method, path)

    async def broken(path: str, params: Any = None) -> dict[str, Any]:
        raise refuse("GET", path, None)

    monkeypatch.setattr(kube, "get", broken)
    assert run(claim(), kube, monkeypatch) == {}


def test_the_webhook_is_registered_for_claim_creation_and_fails_open() -> None:
    [hook] = [h for h in webhookconfig.webhooks(True, "https://x:1", b"ca", ["kube-system"])
              if h["name"] == "numa-constraint.numalign.io"]
    assert hook["rules"] == [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                              "resources": ["resourceclaims"], "operations": ["CREATE"],
                              "scope": "Namespaced"}]
    assert hook["failurePolicy"] == "Ignore"
    assert hook["clientConfig"]["url"] == "https://x:1/numa-constraint"


def constrained(patch: dict[str, Any]) -> list[str] | None:
    """The requests the patch ties to one NUMA node (None: the claim is unchanged)."""
    if not patch:
        return None
    [c] = patch["spec"]["devices"]["constraints"]
    assert c["matchAttribute"] == NUMA
    names: list[str] = c["requests"]
    return names


def test_a_claim_whose_devices_publish_no_numa_node_is_left_unchanged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Devices known by pcieRoot only (many drivers today): the constraint could never
    hold and would leave the pod Pending forever; the claim goes as it came."""
    kube = FakeKube()
    kube.add(PODS, pod("single-numa-node"))
    add_slice(kube, GPU, device("g0"), device("g1"))
    add_slice(kube, NIC, device("n0"), device("n1", {"string": "0"}), device(
        "n2", {"ints": []}))  # a string or an empty list is no NUMA node either
    add_class(kube, "gpu", f'device.driver == "{GPU}"')
    add_class(kube, "nic", f'device.driver == "{NIC}"')
    assert run(claim(), kube, monkeypatch) == {}


def test_only_requests_whose_every_candidate_publishes_the_numa_node_are_tied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kube = numa_cluster()
    # another node's NICs lack the attribute: the nic request could get one of them
    add_slice(kube, NIC, device("x0"), device("x1", {"int": 0}), node="n2")
    assert constrained(run(claim(), kube, monkeypatch)) == ["gpu"]
    # selectors narrow the candidates: NICs of model a (all with a NUMA node) qualify
    add_class(kube, "nic-a", f'device.driver == "{NIC}" && '
                             f'device.attributes["{NIC}"].model == "a"')
    kube.add(dradevices.SLICES_PATH, {"metadata": {"name": "n3"}, "spec": {
        "driver": NIC, "nodeName": "n3", "pool": {"name": "n3"}, "devices": [
            device("a0", {"int": 0}, model="a"), device("b0", model="b")]}})
    dradevices.forget()
    assert constrained(run(claim(classes={"nic": "nic-a"}), kube, monkeypatch)) == [
        "gpu", "nic"]
    # firstAvailable: every subrequest's devices count; one of them lacks it
    body = claim(requests=("gpu",))
    body["spec"]["devices"]["requests"] = [{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu"},
        {"name": "any-nic", "deviceClassName": "nic"}]}]
    assert run(body, kube, monkeypatch) == {}
    # only a request without candidates, or of a class not found: unchanged
    assert run(claim(requests=("nowhere",)), kube, monkeypatch) == {}
    add_class(kube, "empty", 'device.driver == "none.example.com"')
    dradevices.forget()
    assert run(claim(requests=("empty",)), kube, monkeypatch) == {}
    assert constrained(run(claim(requests=("empty", "gpu")), kube, monkeypatch)) == ["gpu"]


def test_a_class_outside_the_cel_subset_may_match_any_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kube = numa_cluster()
    add_class(kube, "either", f'device.driver == "{GPU}" || device.driver == "{NIC}"')
    # every device of the cluster publishes its NUMA node: tied even so
    assert constrained(run(claim(requests=("either",)), kube, monkeypatch)) == ["either"]
    # a device of a third driver without it: "may match" counts it, so no constraint
    add_slice(kube, OTHER, device("o0"))
    dradevices.forget()
    assert run(claim(requests=("either",)), kube, monkeypatch) == {}
    # a term outside the subset beside a driver term: the driver still narrows it
    add_class(kube, "big-gpu", f'device.driver == "{GPU}" && '
                               'device.capacity["x"].memory.compareTo(quantity("4Gi")) >= 0')
    assert constrained(run(claim(requests=("big-gpu",)), kube, monkeypatch)) == ["big-gpu"]


def _counting(kube: FakeKube, fail: int | None = None) -> list[str]:
    """The paths the webhook reads; ``fail``: the status the device listings get."""
    reads: list[str] = []
    get = kube.get

    async def counted(path: str, params: Any = None) -> dict[str, Any]:
        reads.append(path)
        if fail is not None and path.startswith("/apis/resource.k8s.io/"):
            raise ApiError(fail, {"message": "no"}, "GET", path)
        return await get(path, params)

    kube.get = counted  # type: ignore[method-assign]
    return reads


def test_a_read_error_leaves_the_claim_unchanged_and_is_not_retried_per_claim(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kube = numa_cluster()
    reads = _counting(kube, fail=403)  # e.g. RBAC missing
    monkeypatch.setattr(connection, "client", lambda: kube)

    async def burst() -> list[dict[str, Any]]:
        out = []
        for _ in range(3):
            patch = kopf.Patch()
            await claims.mutate_claim(body=kopf.Body(claim()), patch=patch,
                                      logger=logging.getLogger("test"))
            out.append(dict(patch))
        return out

    assert asyncio.run(burst()) == [{}, {}, {}]
    assert reads.count(dradevices.SLICES_PATH) == 1  # kept a few seconds, as a success is
    # a read that hangs is cut short: unchanged, well within the webhook's timeout
    dradevices.forget()

    async def hang(path: str, params: Any = None) -> dict[str, Any]:
        if path.startswith("/apis/resource.k8s.io/"):
            await asyncio.sleep(60)
        return await FakeKube.get(kube, path, params)

    kube.get = hang  # type: ignore[method-assign]
    monkeypatch.setattr(dradevices, "READ_TIMEOUT_SECONDS", 0.05)
    assert run(claim(), kube, monkeypatch) == {}


def test_a_burst_of_claims_lists_the_devices_once_and_other_policies_never(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kube = numa_cluster()
    reads = _counting(kube)
    monkeypatch.setattr(connection, "client", lambda: kube)

    async def burst() -> list[dict[str, Any]]:
        patches = [kopf.Patch() for _ in range(5)]
        await asyncio.gather(*(claims.mutate_claim(
            body=kopf.Body(claim()), patch=p, logger=logging.getLogger("test"))
            for p in patches))
        return [dict(p) for p in patches]

    assert all(constrained(p) == ["gpu", "nic"] for p in asyncio.run(burst()))
    assert reads.count(dradevices.SLICES_PATH) == 1
    assert reads.count(dradevices.CLASSES_PATH) == 1
    other = FakeKube()
    other.add(PODS, pod("best-effort"))
    reads = _counting(other)
    assert run(claim(), other, monkeypatch) == {}
    assert not [r for r in reads if r.startswith("/apis/resource.k8s.io/")]


def test_more_slices_than_the_bound_leave_the_claim_unchanged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Paged reads stop at the bound; what was not read may lack the attribute."""
    kube = numa_cluster()
    pages: list[Mapping[str, str]] = []

    async def endless(path: str, params: Any = None) -> dict[str, Any]:
        if path == dradevices.SLICES_PATH:
            pages.append(dict(params or {}))
            n = len(pages)
            return {"items": [{"metadata": {"name": f"s{n}"}, "spec": {
                "driver": GPU, "pool": {"name": f"p{n}"},
                "devices": [device(f"g{n}", {"int": 0})]}}],
                "metadata": {"continue": f"c{n}"}}
        return await FakeKube.get(kube, path, params)

    kube.get = endless  # type: ignore[method-assign]
    monkeypatch.setattr(dradevices, "MAX_SLICES", 3)
    assert run(claim(requests=("gpu",)), kube, monkeypatch) == {}
    assert len(pages) == 3 and pages[1]["continue"] == "c1"
    assert all(p["limit"] == str(dradevices.PAGE) for p in pages)


def test_a_device_publishes_its_numa_node_as_an_integer_or_a_list() -> None:
    def has(attr: Any) -> bool:
        return draconstraint.publishes_numa_node({"name": "d", "attributes": {NUMA: attr}})
    assert has({"int": 0}) and has({"ints": [0, 1]})
    assert not has({"ints": []}) and not has({"string": "0"}) and not has({"bool": True})
    assert not draconstraint.publishes_numa_node({"name": "d"})
    # too many devices to judge: incomplete, nothing qualifies
    cluster = draconstraint.cluster_devices([{"spec": {
        "driver": GPU, "devices": [device(f"g{i}", {"int": 0}) for i in range(3)]}}],
        [{"metadata": {"name": "gpu"}, "spec": {}}])
    spec = {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu"}}]}}
    assert draconstraint.numa_requests(spec, cluster) == ["g"]
    cut = draconstraint.ClusterDevices(cluster.offer, cluster.classes, complete=False)
    assert draconstraint.numa_requests(spec, cut) == []
    # a claim spec that cannot be read: nothing qualifies
    assert draconstraint.numa_requests({"devices": {"requests": [{"name": "g"}]}},
                                       cluster) == []
