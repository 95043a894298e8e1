"""The pod-set fingerprint (nodeTopologyPodsFingerprint): podfingerprint's golden vectors,
XXH64 reference values, which pods each method and informer mode count, and the
fingerprint the agent publishes in NodeResourceTopology as its node's pods change."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import testdata
from agent_helpers import given
from numalign.agent import nrt
from numalign.agent import podfingerprint as pfp
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api.resolved import NONE, Resolved
from numalign.topology.machine import load_machine

VECTORS = Path(__file__).resolve().parents[1] / "fixtures" / "podfingerprint"
CASES = sorted(p.stem for p in VECTORS.glob("compat-*.txt"))


def load_case(stem: str) -> tuple[list[tuple[str, str]], str]:
    pods = []
    for line in (VECTORS / f"{stem}.txt").read_text().splitlines():
        fields = line.split()
        if line.startswith("#") or len(fields) < 2:
            continue
        pods.append((fields[0], fields[1]))
    return pods, (VECTORS / f"{stem}.sign").read_text().strip()


def test_all_vectors_are_here() -> None:
    assert len(CASES) == 6
    for stem in CASES:
        assert (VECTORS / f"{stem}.sign").is_file()


@pytest.mark.parametrize("stem", CASES)
def test_compat_golden_sign(stem: str) -> None:
    pods, expected = load_case(stem)
    assert pfp.sign(pods) == expected


@pytest.mark.parametrize("stem", CASES)
def test_compat_golden_order_independent(stem: str) -> None:
    pods, expected = load_case(stem)
    shuffled = list(pods)
    random.Random(12345).shuffle(shuffled)
    assert shuffled != pods
    assert pfp.sign(shuffled) == expected
    assert pfp.sign(pods[1:]) != expected  # one pod less: another fingerprint


@pytest.mark.parametrize("data,seed,digest", [
    (b"", 0, 0xEF46DB3751D8E999),
    (b"a", 0, 0xD24EC4F1A98C6E5B),
    (b"Nobody inspects the spammish repetition", 0, 0xFBCEA83C8A378BF1),  # 39 bytes
])
def test_xxh64_reference_values(data: bytes, seed: int, digest: int) -> None:
    assert pfp.xxh64(data, seed) == digest


def test_empty_set_and_format() -> None:
    sign = pfp.sign([])
    assert sign.startswith("pfp0v001") and len(sign) == 24
    assert sign == "pfp0v001" + f"{pfp.xxh64(b''):016x}"


def pod(name: str, *, ns: str = "ns", phase: str = "Running",
        containers: list[dict[str, Any]] | None = None,
        init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers or [{"name": "c"}]}
    if init:
        spec["initContainers"] = init
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}"},
            "spec": spec, "status": {"phase": phase}}


def c(cpu: str, memory: str) -> dict[str, Any]:
    """A container whose requests are its limits."""
    return {"name": "c", "resources": {"limits": {"cpu": cpu, "memory": memory}}}


NRT_RESOURCES = {"cpu", "memory", "example.com/gpu"}


@pytest.mark.parametrize("p,exclusive", [
    (pod("best-effort"), False),
    (pod("guaranteed-int", containers=[c(cpu="2", memory="1Gi")]), True),
    # Guaranteed memory is exclusive too (scheduler-plugins' IsExclusive)
    (pod("guaranteed-frac", containers=[c(cpu="1500m", memory="1Gi")]), True),
    (pod("burstable", containers=[{"name": "c", "resources": {
        "requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "4", "memory": "1Gi"}}}]),
     False),
    (pod("device", containers=[{"name": "c", "resources": {
        "limits": {"example.com/gpu": "1"}}}]), True),
    (pod("unlisted-device", containers=[{"name": "c", "resources": {
        "limits": {"other.com/nic": "1"}}}]), False),
    (pod("init-device", containers=[{"name": "c"}], init=[{"name": "i", "resources": {
        "limits": {"example.com/gpu": "1"}}}]), False),
    (pod("sidecar-device", containers=[{"name": "c"}], init=[{
        "name": "i", "restartPolicy": "Always",
        "resources": {"limits": {"example.com/gpu": "1"}}}]), True),
    (pod("unreadable", containers=[{"name": "c", "resources": {"limits": {"cpu": "lots"}}}]),
     False),
])
def test_exclusive_resources(p: dict[str, Any], exclusive: bool) -> None:
    assert pfp.pod_entry(p).exclusive(NRT_RESOURCES) is exclusive


def test_methods_and_informer_modes() -> None:
    g = [c(cpu="1", memory="1Gi")]
    entries = [pfp.pod_entry(pod("a", containers=g)),
               pfp.pod_entry(pod("b")),
               pfp.pod_entry(pod("rejected", phase="Failed", containers=g)),
               pfp.pod_entry(pod("waiting", phase="Pending", containers=g))]
    sign = pfp.fingerprint
    assert sign(entries, pfp.METHOD_ALL) == pfp.sign([("ns", "a"), ("ns", "b"),
                                                       ("ns", "rejected")])
    assert sign(entries, pfp.METHOD_EXCLUSIVE, NRT_RESOURCES) == pfp.sign(
        [("ns", "a"), ("ns", "rejected")])
    assert sign(entries, pfp.METHOD_ALL, informer=pfp.INFORMER_SHARED) == pfp.sign(
        [("ns", "a"), ("ns", "b")])
    with pytest.raises(ValueError, match="fingerprint method"):
        sign(entries, "some")
    with pytest.raises(ValueError, match="informer mode"):
        sign(entries, pfp.METHOD_ALL, informer="Eager")


def attrs(obj: dict[str, Any]) -> dict[str, str]:
    return {a["name"]: a["value"] for a in obj["attributes"]}


def test_node_state_tracks_the_pods_and_the_nrt_carries_their_fingerprint() -> None:
    st = NodeState("n1", load_machine(testdata.MACHINES / "seed-figure1.yaml"))
    snn = Resolved("single-numa-node", "container")
    fits = pod("fits", containers=[c(cpu="2", memory="1Gi")])
    too_big = pod("too-big", containers=[c(cpu="64", memory="1Gi")])
    shared = pod("shared")
    for p, resolved in ((fits, snn), (too_big, snn), (shared, NONE)):
        st.decide(p, given(resolved))
    assert {u: (e.name, e.phase) for u, e in st.pods.items()} == {
        "uid-fits": ("fits", "Running"), "uid-too-big": ("too-big", "Failed"),
        "uid-shared": ("shared", "Running")}

    def published(options: nrt.NrtOptions) -> dict[str, str]:
        obj = nrt.build_nrt("n1", build_status(st))
        nrt.add_fingerprint(obj, st.pods.values(), options)
        return attrs(obj)

    got = published(nrt.NrtOptions())
    assert got["nodeTopologyPodsFingerprintMethod"] == "with-exclusive-resources"
    # what scheduler-plugins computes from its (Dedicated) informer: not-Pending pods
    # holding exclusive resources -- the rejected Guaranteed pod is one of them
    assert got["nodeTopologyPodsFingerprint"] == pfp.sign([("ns", "fits"), ("ns", "too-big")])
    every = published(nrt.NrtOptions(pfp.METHOD_ALL, pfp.INFORMER_SHARED))
    assert every["nodeTopologyPodsFingerprintMethod"] == "all"
    assert every["nodeTopologyPodsFingerprint"] == pfp.sign([("ns", "fits"), ("ns", "shared")])

    version = st.version
    assert st.release("uid-fits")
    assert st.version > version and "uid-fits" not in st.pods
    assert published(nrt.NrtOptions())["nodeTopologyPodsFingerprint"] == pfp.sign(
        [("ns", "too-big")])


def test_restore_counts_running_and_finished_pods() -> None:
    st = NodeState("n1", load_machine(testdata.MACHINES / "seed-figure1.yaml"))
    report = st.restore(None, [pod("running"), pod("done", phase="Succeeded"),
                               pod("queued", phase="Pending")])
    assert [p["metadata"]["name"] for p in report.pending] == ["queued"]
    assert sorted((e.name, e.phase) for e in st.pods.values()) == [
        ("done", "Succeeded"), ("running", "Running")]
