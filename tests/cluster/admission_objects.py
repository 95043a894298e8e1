"""The objects tests/cluster/test_config.py writes as numalign's identities and as
others (YAML for ``kubectl create -f -``): NodeTopologies of fresh node names, core/v1
and events.k8s.io/v1 Events, pods with annotations, a node or scheduling gates, and the
forged values of numalign's annotations."""

from __future__ import annotations

import json
import uuid
from typing import Any

import yaml

from numalign.api.names import ANN_ALLOCATION, ANN_REJECTION, ANN_RESOLVED


def new_node_name() -> str:
    return f"cfg-node-{uuid.uuid4().hex[:6]}"


def nodetopology_yaml(name: str) -> str:
    return yaml.safe_dump({"apiVersion": "numalign.io/v1alpha1", "kind": "NodeTopology",
                           "metadata": {"name": name}})


def status_patch() -> str:
    return json.dumps({"status": {"observedPolicyGeneration": 0}})


def event_yaml(namespace: str, kind: str, name: str, reporter: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"ev-{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "involvedObject": {"apiVersion": "v1", "kind": kind, "name": name,
                           "namespace": namespace},
        "reason": "Test", "message": "m", "type": "Normal",
        "source": {"component": "numalign-agent", "host": reporter},
        "reportingComponent": "numalign-agent", "reportingInstance": reporter})


def event_v1_yaml(namespace: str, kind: str, name: str, reporter: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": f"ev-{uuid.uuid4().hex[:8]}", "namespace": namespace},
        "regarding": {"apiVersion": "v1", "kind": kind, "name": name, "namespace": namespace},
        "reason": "Test", "note": "m", "type": "Normal", "action": "Test",
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "numalign.io/agent", "reportingInstance": reporter})


def pod_yaml(name: str, annotations: dict[str, str] | None = None, node: str | None = None,
         gates: list[str] | None = None) -> str:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "registry.example/none:1"}]}
    if node:
        spec["nodeName"] = node
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "annotations": annotations or {}},
                           "spec": spec})


def forged_value(annotation: str) -> str:
    return {ANN_RESOLVED: '{"policy":"none","scope":"container","source":"pod"}',
            ANN_ALLOCATION: '{"numaNodes":[0],"containers":{"c":{"cpus":"1-7"}}}',
            ANN_REJECTION: "forged"}.get(annotation, "true")
