"""What a pod's claims may get on a node (numalign.api.draasks): the CEL subset, claims
from templates or by name, allocated claims as fixed devices, constraints, bad input."""

from __future__ import annotations

from typing import Any

import testdata
from numalign.api import draemulated as de
from numalign.api.draasks import (
    NUMA_ATTRIBUTE,
    NodeDevice,
    parse_selector,
    pod_choices,
    pod_claim_asks,
)
from numalign.extender.dra import DraCatalog
from numalign.topology.machine import load_machine

MACHINE = load_machine(testdata.MACHINES / "group4-gpu.yaml")  # gpu0,1: NUMA 0; gpu2,3: 1
NAMES = dict(zip((d.id for d in MACHINE.devices), de.device_names(MACHINE.devices),
                 strict=True))
GPU_CLASS = de.device_class_name("nvidia.com/gpu")


def dev(name: str, numa: tuple[int, ...] | None, **attrs: Any) -> NodeDevice:
    return NodeDevice("drv.example.com", "p", name, numa, numa is not None,
                      {f"drv.example.com/{k}": v for k, v in attrs.items()})


def test_the_cel_subset_reads_driver_and_attribute_equalities() -> None:
    sel = parse_selector('device.driver == "drv.example.com" && '
                         'device.attributes["drv.example.com"].model == "a100" && '
                         'device.attributes["drv.example.com"].mig == false && '
                         'device.attributes["drv.example.com"].index == 3')
    assert sel.matches(dev("d", (0,), model="a100", mig=False, index=3))
    assert not sel.matches(dev("d", (0,), model="h100", mig=False, index=3))
    assert not sel.matches(dev("d", (0,), model="a100", mig=False, index=2))
    assert not sel.matches(dev("d", (0,), model="a100", index=3))  # no such attribute
    assert not sel.matches(dev("d", (0,), model="a100", mig=False, index="3"))  # a string


def test_cel_outside_the_subset_may_match() -> None:
    d = dev("d", (0,), model="h100")
    for expr in ('device.attributes["drv.example.com"].model == "a100" || true',
                 '!(device.attributes["drv.example.com"].model == "a100")',
                 'device.capacity["drv.example.com"].memory.compareTo(quantity("8Gi")) >= 0',
                 "device.driver != 'x'", 42, ""):
        assert parse_selector(expr).matches(d), expr
    # a term outside the subset may hold; the others must
    sel = parse_selector('device.attributes["drv.example.com"].model == "a100" && '
                         'device.capacity["drv.example.com"].memory.isGreaterThan(quantity("1"))')
    assert not sel.matches(d)
    assert sel.matches(dev("d", (0,), model="a100"))


def pod(*claims: dict[str, Any], generated: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"resourceClaims": list(claims), "containers": [
                {"name": "c", "resources": {"claims": [{"name": c["name"]} for c in claims]}}]},
            "status": {"resourceClaimStatuses": [
                {"name": k, "resourceClaimName": v} for k, v in (generated or {}).items()]}}


def claim_spec(count: int = 1, cls: str = GPU_CLASS, constraint: bool = False,
               **extra: Any) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": cls, "count": count, **extra}}]}
    if constraint:
        devices["constraints"] = [{"matchAttribute": NUMA_ATTRIBUTE}]
    return {"devices": devices}


def catalog(*claims: dict[str, Any], templates: dict[str, dict[str, Any]] | None = None
            ) -> DraCatalog:
    cat = DraCatalog()
    cat.load("deviceclasses", de.device_classes(["nvidia.com/gpu"]))
    cat.load("resourceslices", de.resource_slices(MACHINE, "n0"))
    cat.load("resourceclaims", list(claims))
    cat.load("resourceclaimtemplates", [
        {"metadata": {"name": k, "namespace": "ns"}, "spec": {"spec": v}}
        for k, v in (templates or {}).items()])
    return cat


def held(name: str, *gpus: str, ns: str = "other") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": claim_spec(len(gpus)),
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": de.DRIVER, "pool": "n0", "device": NAMES[g]}
                for g in gpus]}}}}


def numas(cat: DraCatalog, p: dict[str, Any]) -> list[tuple[Any, ...]]:
    got = cat.choices(p, "n0", MACHINE.numa_ids)
    assert got.refusal is None, got.refusal
    return sorted(c[("gpus", "gpu")][0] for c in got.choices)


def test_a_template_claim_may_get_any_free_gpu_and_node_devices_read_numa() -> None:
    cat = catalog(templates={"t": claim_spec(1)})
    devs = cat.node_devices("n0", MACHINE.numa_ids)
    assert sorted((d.device, d.numa_nodes) for d in devs) == [
        (NAMES["gpu0"], (0,)), (NAMES["gpu1"], (0,)), (NAMES["gpu2"], (1,)),
        (NAMES["gpu3"], (1,))]
    p = pod({"name": "gpus", "resourceClaimTemplateName": "t"})
    assert numas(cat, p) == [((0,),), ((1,),)]
    # two GPUs: on NUMA 0, on NUMA 1, or one on each
    cat = catalog(templates={"t": claim_spec(2)})
    assert numas(cat, p) == [((0,),), ((0,), (1,)), ((1,),)]


def test_devices_other_claims_hold_are_no_candidates() -> None:
    cat = catalog(held("x", "gpu0"), held("y", "gpu2"), templates={"t": claim_spec(2)})
    p = pod({"name": "gpus", "resourceClaimTemplateName": "t"})
    assert numas(cat, p) == [((0,), (1,))]  # gpu1 and gpu3 left
    cat = catalog(held("x", "gpu0", "gpu1", "gpu2"), templates={"t": claim_spec(2)})
    got = cat.choices(p, "n0", MACHINE.numa_ids)
    assert got.refusal is not None and "claim gpus request gpu" in got.refusal
    assert "not enough free devices" in got.refusal


def test_the_numa_constraint_keeps_a_claims_devices_on_one_numa_node() -> None:
    cat = catalog(held("x", "gpu0"), templates={"t": claim_spec(2, constraint=True)})
    p = pod({"name": "gpus", "resourceClaimTemplateName": "t"})
    assert numas(cat, p) == [((1,),)]  # gpu1 alone on NUMA 0
    cat = catalog(held("x", "gpu0", "gpu2"), templates={"t": claim_spec(2, constraint=True)})
    got = cat.choices(p, "n0", MACHINE.numa_ids)
    assert got.refusal is not None and "one NUMA node" in got.refusal


def test_the_generated_claim_counts_once_known_and_an_allocated_one_is_fixed() -> None:
    generated = {"metadata": {"name": "p-gpus", "namespace": "ns"},
                 "spec": claim_spec(1, constraint=True)}
    p = pod({"name": "gpus", "resourceClaimTemplateName": "t"}, generated={"gpus": "p-gpus"})
    cat = catalog(generated, templates={"t": claim_spec(2)})
    assert numas(cat, p) == [((0,),), ((1,),)]  # the claim's spec, not the template's
    cat = catalog(held("p-gpus", "gpu3", ns="ns"), templates={"t": claim_spec(1)})
    got = cat.choices(p, "n0", MACHINE.numa_ids)
    assert [c[("gpus", "gpu")] for c in got.choices] == [(((1,),), 0, 1)]


def test_selectors_narrow_the_candidates() -> None:
    sel = [{"cel": {"expression": f'device.attributes["{de.DRIVER}"].nvlink == "nvlink1"'}}]
    cat = catalog(templates={"t": claim_spec(1, selectors=sel)})
    assert numas(cat, pod({"name": "gpus", "resourceClaimTemplateName": "t"})) == [((1,),)]


def test_a_missing_class_is_named_and_a_shared_claim_not_found_too() -> None:
    cat = catalog(templates={"t": claim_spec(1, cls="no-such-class")})
    got = cat.choices(pod({"name": "gpus", "resourceClaimTemplateName": "t"}), "n0")
    assert got.refusal == "DRA: claim gpus request gpu: DeviceClass no-such-class not found"
    got = cat.choices(pod({"name": "gpus", "resourceClaimName": "gone"}), "n0")
    assert got.refusal == "DRA: claim gpus: ResourceClaim gone not found"
    got = cat.choices(pod({"name": "gpus", "resourceClaimTemplateName": "nope"}), "n0")
    assert got.refusal == "DRA: claim gpus: ResourceClaimTemplate nope not found"


def test_bad_requests_are_named_by_field() -> None:
    p = pod({"name": "gpus", "resourceClaimTemplateName": "t"})
    asks, _ = pod_claim_asks(p, {}, {"t": {"spec": {"spec": claim_spec(0)}}})
    assert asks[0].problem == ("ResourceClaimTemplate t: spec.devices.requests[0].exactly"
                               ".count: want an integer 1-128")
    asks, _ = pod_claim_asks(p, {}, {"t": {"spec": {"spec": {"devices": {
        "requests": [{"name": "gpu"}]}}}}})
    assert asks[0].problem is not None and "neither exactly nor firstAvailable" in \
        asks[0].problem
    asks, problems = pod_claim_asks({"spec": {"resourceClaims": "x"}}, {}, {})
    assert (asks, problems) == ([], ["spec.resourceClaims: want a list"])


def test_a_malformed_numa_node_is_unknown_never_guessed() -> None:
    slices = de.resource_slices(MACHINE, "n0")
    slices[0]["spec"]["devices"][0]["attributes"][NUMA_ATTRIBUTE] = {"string": "zero"}
    slices[0]["spec"]["devices"][1]["attributes"][NUMA_ATTRIBUTE] = {"int": 7}  # not there
    cat = catalog(templates={"t": claim_spec(1)})
    cat.load("resourceslices", slices)
    devs = {d.device: d for d in cat.node_devices("n0", MACHINE.numa_ids)}
    assert devs[NAMES["gpu0"]].numa_nodes is None and devs[NAMES["gpu1"]].numa_nodes is None
    got = cat.choices(pod({"name": "gpus", "resourceClaimTemplateName": "t"}), "n0",
                      MACHINE.numa_ids)
    assert sorted(c[("gpus", "gpu")][:2] for c in got.choices) == [((), 1), (((1,),), 0)]


def test_firstavailable_subrequests_all_count_and_all_mode_takes_every_device() -> None:
    spec = {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": GPU_CLASS, "count": 1, "selectors": [
            {"cel": {"expression": f'device.attributes["{de.DRIVER}"].nvlink == "nvlink0"'}}]},
        {"name": "any", "deviceClassName": GPU_CLASS, "count": 1}]}]}}
    cat = catalog(templates={"t": spec})
    assert numas(cat, pod({"name": "gpus", "resourceClaimTemplateName": "t"})) == [
        ((0,),), ((1,),)]
    cat = catalog(held("x", "gpu0"), templates={"t": claim_spec(allocationMode="All")})
    got = cat.choices(pod({"name": "gpus", "resourceClaimTemplateName": "t"}), "n0")
    assert [c[("gpus", "gpu")] for c in got.choices] == [(((0,), (1,)), 0, 3)]


def test_the_choices_key_follows_the_claims_state() -> None:
    p = pod({"name": "gpus", "resourceClaimTemplateName": "t"})
    cat = catalog(templates={"t": claim_spec(2)})
    before = cat.choices(p, "n0").key()
    cat.event("resourceclaims", "ADDED", held("x", "gpu0"))
    after = cat.choices(p, "n0").key()
    assert before != after
    cat.event("resourceclaims", "DELETED", held("x", "gpu0"))
    assert cat.choices(p, "n0").key() == before


def test_pod_choices_direct_use_bounds_the_enumeration() -> None:
    devs = [dev(f"d{i}", (i % 8,)) for i in range(64)]
    p = pod(*({"name": f"c{i}", "resourceClaimTemplateName": "t"} for i in range(4)))
    asks, problems = pod_claim_asks(p, {}, {"t": {"spec": {"spec": claim_spec(2, cls="k")}}})
    got = pod_choices(p, asks, devs, {}, {"k": []}, problems)
    assert got.refusal is None and not got.complete and len(got.choices) == 256


def test_shared_devices_and_admin_access_stay_candidates_when_held() -> None:
    p = pod({"name": "gpus", "resourceClaimTemplateName": "t"})
    held_all = {"drv.example.com/p/a": "other/x", "drv.example.com/p/b": "other/y"}
    devs = [dev("a", (0,)), dev("b", (1,))]
    asks, problems = pod_claim_asks(p, {}, {"t": {"spec": {"spec": claim_spec(1, cls="k")}}})
    got = pod_choices(p, asks, devs, held_all, {"k": []}, problems)
    assert got.refusal is not None  # both held
    shared = [NodeDevice("drv.example.com", "p", "a", (0,), True, {}, shared=True), devs[1]]
    got = pod_choices(p, asks, shared, held_all, {"k": []}, problems)
    assert [c[("gpus", "gpu")][0] for c in got.choices] == [((0,),)]
    asks, problems = pod_claim_asks(p, {}, {"t": {"spec": {"spec": claim_spec(
        1, cls="k", adminAccess=True)}}})
    got = pod_choices(p, asks, devs, held_all, {"k": []}, problems)
    assert sorted(c[("gpus", "gpu")][0] for c in got.choices) == [((0,),), ((1,),)]


def test_a_device_on_several_numa_nodes_lifts_the_constraint_to_every_choice() -> None:
    # matchAttribute over a list attribute holds on any common NUMA node: all choices count
    p = pod({"name": "gpus", "resourceClaimTemplateName": "t"})
    devs = [dev("a", (1, 2)), dev("b", (1,)), dev("c", (0,)), dev("d", (0,))]
    asks, problems = pod_claim_asks(p, {}, {"t": {"spec": {"spec": claim_spec(
        2, cls="k", constraint=True)}}})
    got = pod_choices(p, asks, devs, {}, {"k": []}, problems)
    assert ((0,), (1, 2)) in [c[("gpus", "gpu")][0] for c in got.choices]
    assert ((1, 2),) not in [c[("gpus", "gpu")][0] for c in got.choices]  # one device only


def test_a_generated_claim_is_found_by_its_owner_before_the_pod_status_names_it() -> None:
    p = pod({"name": "gpus", "resourceClaimTemplateName": "t"})
    generated = {"metadata": {"name": "p-gpus-x7", "namespace": "ns", "annotations": {
        "resource.kubernetes.io/pod-claim-name": "gpus"}, "ownerReferences": [
            {"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}]},
        "spec": claim_spec(1, constraint=True)}
    generated["spec"] = claim_spec(2, constraint=True)
    cat = catalog(held("x", "gpu0"), templates={"t": claim_spec(2)})
    assert numas(cat, p) == [((0,), (1,)), ((1,),)]  # the template's: gpu1, gpu2, gpu3
    cat.event("resourceclaims", "ADDED", generated)
    assert numas(cat, p) == [((1,),)]  # the generated claim's, on one NUMA node
    cat.event("resourceclaims", "DELETED", generated)
    assert numas(cat, p) == [((0,), (1,)), ((1,),)]
