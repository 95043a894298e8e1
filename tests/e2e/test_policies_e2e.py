"""Policy per namespace and per pod, end to end: TopologyPolicies resolved by the
operator's webhook, pods placed by the real scheduler on emulated nodes, admitted by the
agent with the resolved policy, and every decision visible on the pod and in
``kubectl get nt -o yaml``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e_helpers import (
    POOL_LABEL,
    AgentProcess,
    annotation_json,
    delete_namespaces,
    guaranteed_pod,
    phase,
    wait_for,
)
from numalign.api.names import ANN_ALLOCATION, ANN_RESOLVED
from numalign.topology.quantity import parse_cpulist
from operator_helpers import delete_policy, operator, policy

pytestmark = pytest.mark.cluster

GPU = "gpu-vendor.com/gpu"
NIC = "nic-vendor.com/nic"


@pytest.fixture
def ml_batch(core: Any, k8s_client: Any) -> Iterator[tuple[str, str]]:
    names = ("ml", "batch")
    for n in names:
        core.create_namespace({"metadata": {"name": n}})
    policy(k8s_client, "e2e-ml", {"policy": "single-numa-node", "scope": "pod",
                                  "namespaces": ["ml"]})
    policy(k8s_client, "e2e-batch", {"policy": "best-effort", "namespaces": ["batch"],
                                     "podOverrides": {"allowed": True,
                                                      "policies": ["restricted"]}})
    try:
        yield names
    finally:
        delete_policy(k8s_client, "e2e-ml")
        delete_policy(k8s_client, "e2e-batch")
        delete_namespaces(core, names)


def test_policy_per_namespace_and_pod(kubeconfig: Path, k8s_client: Any, core: Any,
                                      kubectl: Callable[..., Any], e2e_agent: AgentProcess,
                                      ml_batch: tuple[str, str], tmp_path: Path) -> None:
    (seed,) = e2e_agent.of("seed-figure1")
    frag = e2e_agent.of("fragmented-8numa")[0]
    pool = {POOL_LABEL: e2e_agent.pool}

    def on(node: str) -> dict[str, str]:
        return {**pool, "kubernetes.io/hostname": node}

    with operator(kubeconfig, k8s_client, tmp_path / "op.log") as op:
        train = guaranteed_pod("train", 2, node_selector=on(seed), memory="256Mi")
        train["spec"]["containers"][0]["resources"]["requests"].update({GPU: "1", NIC: "1"})
        train["spec"]["containers"][0]["resources"]["limits"].update({GPU: "1", NIC: "1"})
        core.create_namespaced_pod("ml", train)
        # 6 CPUs on a machine of 4-CPU NUMA nodes: best-effort admits across NUMA nodes
        # (restricted would not: the memory hint's narrowest width is 1, the CPUs' is 2);
        # the restricted override admits 4 CPUs and their memory on one NUMA node.
        core.create_namespaced_pod("batch", guaranteed_pod("job", 6, node_selector=on(frag)))
        core.create_namespaced_pod("batch", guaranteed_pod(
            "rt", 4, node_selector=on(frag),
            annotations={"numalign.io/policy": "restricted"}))

        want = {
            ("ml", "train"): {"policy": "single-numa-node", "scope": "pod", "options": {},
                              "source": "TopologyPolicy/e2e-ml"},
            ("batch", "job"): {"policy": "best-effort", "scope": "container", "options": {},
                               "source": "TopologyPolicy/e2e-batch"},
            ("batch", "rt"): {"policy": "restricted", "scope": "container", "options": {},
                              "source": "pod"},
        }

        def all_running() -> dict[tuple[str, str], Any] | None:
            got = {(ns, n): core.read_namespaced_pod(n, ns) for ns, n in want}
            bad = [k for k, p in got.items() if phase(p) == "Failed"]
            assert not bad, [(k, got[k].status.message) for k in bad]
            return got if all(phase(p) == "Running" for p in got.values()) else None

        got = wait_for(all_running, 90, "the three pods Running")
        allocs: dict[tuple[str, str], dict[str, Any]] = {}
        for key, pod in got.items():
            assert annotation_json(pod, ANN_RESOLVED) == want[key], key
            alloc = annotation_json(pod, ANN_ALLOCATION)
            assert alloc is not None, key
            allocs[key] = alloc
        assert got[("ml", "train")].spec.node_name == seed
        assert got[("batch", "job")].spec.node_name == frag
        assert got[("batch", "rt")].spec.node_name == frag

        train_alloc = allocs[("ml", "train")]
        (numa,) = train_alloc["numaNodes"]  # single-numa-node: one NUMA node for all of it
        main = train_alloc["containers"]["main"]
        assert len(main["cpus"]) == 2
        assert main["devices"] == {GPU: [f"gpu{numa}"], NIC: [f"nic{numa}"]}
        job_nodes = allocs[("batch", "job")]["numaNodes"]
        rt_nodes = allocs[("batch", "rt")]["numaNodes"]
        assert len(job_nodes) >= 2 and len(rt_nodes) == 1
        job_cpus = set(allocs[("batch", "job")]["containers"]["main"]["cpus"])
        rt_cpus = set(allocs[("batch", "rt")]["containers"]["main"]["cpus"])
        assert len(job_cpus) == 6 and len(rt_cpus) == 4 and not job_cpus & rt_cpus

        # The same affinity, policy and source in NodeTopology status (kubectl's view).
        def published(node: str, count: int) -> Callable[[], dict[str, Any] | None]:
            def check() -> dict[str, Any] | None:
                doc: dict[str, Any] = yaml.safe_load(
                    kubectl("get", "nt", node, "-o", "yaml").stdout)
                entries = (doc.get("status") or {}).get("admitted") or []
                return doc if len(entries) == count else None

            return check

        for node, pods in ((seed, [("ml", "train")]),
                           (frag, [("batch", "job"), ("batch", "rt")])):
            doc = wait_for(published(node, len(pods)), 30,
                           f"{node}'s admitted pods in NodeTopology status")
            entries = {(e["namespace"], e["pod"]): e for e in doc["status"]["admitted"]}
            assert set(entries) == set(pods)
            for key in pods:
                e = entries[key]
                assert e["uid"] == got[key].metadata.uid
                assert (e["policy"], e["scope"], e["source"]) == (
                    want[key]["policy"], want[key]["scope"], want[key]["source"])
                assert e["numaNodes"] == allocs[key]["numaNodes"]
                assert sorted(parse_cpulist(e["cpus"])) == sorted(
                    allocs[key]["containers"]["main"]["cpus"])

        # kubectl get nt: the printer columns show what is used.
        table = kubectl("get", "nt", frag).stdout
        assert "22/32" in table, table  # 10 exclusive CPUs taken on the fragmented node
        assert "Traceback" not in op.text()
        print(json.dumps({f"{ns}/{n}": a["numaNodes"] for (ns, n), a in allocs.items()}))
