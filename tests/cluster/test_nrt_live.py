"""config/nrt/crd.yaml on a real API server, and NodeResourceTopology objects built from a
published NodeTopology status created, then replaced, through ``publish_nrt`` (the
agent's client)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import testdata
from numalign.agent import nrt
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api.kube import ApiError, SyncKube, load_config
from numalign.topology.machine import load_machine

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[2]
MACHINES = testdata.MACHINES

Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def test_nrt_crd_and_publish(kubectl: Kubectl, kubeconfig: Path,
                             wait: Callable[..., Any]) -> None:
    kubectl("apply", "-f", str(REPO / "config" / "nrt" / "crd.yaml"))
    kubectl("wait", "--for", "condition=Established", "--timeout", "60s",
            "crd/noderesourcetopologies.topology.node.k8s.io")
    status = build_status(NodeState("nrt-test", load_machine(MACHINES / "dgx-a100-like.yaml")))
    name = "nrt-test-node"
    kube = SyncKube(load_config(str(kubeconfig)))
    try:
        obj = nrt.build_nrt(name, status, {"policy": "single-numa-node", "scope": "pod"})
        wait(lambda: _try_publish(kube, obj), 30, "the NRT API to be served")
        got = json.loads(kubectl("get", "noderesourcetopology", name, "-o", "json").stdout)
        assert got["zones"] == obj["zones"]
        assert got["attributes"] == obj["attributes"]
        assert got["topologyPolicies"] == ["SingleNUMANodePodLevel"]

        # without the deprecated topologyPolicies (--no-nrt-topology-policies): the CRD
        # takes it, and the replace drops the field
        status["zones"][0]["available"]["cpu"] = 3
        again = nrt.build_nrt(name, status, {"policy": "restricted", "scope": "container",
                                             "options": {"max-allowable-numa-nodes": "16"}},
                              legacy_policies=False)
        nrt.add_fingerprint(again, [], nrt.NrtOptions())
        kube.run(nrt.publish_nrt(kube.kube, again))
        got = json.loads(kubectl("get", "node-res-topo", name, "-o", "json").stdout)
        cpu = next(r for r in got["zones"][0]["resources"] if r["name"] == "cpu")
        assert cpu["available"] == "3"
        assert "topologyPolicies" not in got
        assert {a["name"]: a["value"] for a in got["attributes"]} == {
            "topologyManagerPolicy": "restricted", "topologyManagerScope": "container",
            "topologyManagerMaxNUMANodes": "16",
            "topologyManagerPolicyOptions": "max-allowable-numa-nodes=16",
            "nodeTopologyPodsFingerprint": "pfp0v001ef46db3751d8e999",
            "nodeTopologyPodsFingerprintMethod": "with-exclusive-resources"}
    finally:
        kube.close()
        kubectl("delete", "noderesourcetopology", name, "--ignore-not-found", check=False)


def _try_publish(kube: SyncKube, obj: dict[str, Any]) -> bool:
    try:
        kube.run(nrt.publish_nrt(kube.kube, obj))
        return True
    except ApiError as e:
        if e.status == 404:  # discovery not caught up with the new CRD yet
            return False
        raise
