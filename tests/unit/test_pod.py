"""The pod model: parsing, QoS, effective requests, error messages."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from numalign.topology.errors import TopologyError
from numalign.topology.pod import (
    QOS_BEST_EFFORT,
    QOS_BURSTABLE,
    QOS_GUARANTEED,
    pod_from_dict,
)

PODS = Path(__file__).resolve().parents[1] / "fixtures" / "pods"
MI = 2**20


def _pod(containers: list[dict[str, Any]], inits: list[dict[str, Any]] | None = None) -> Any:
    spec: dict[str, Any] = {"containers": containers}
    if inits:
        spec["initContainers"] = inits
    return pod_from_dict({"metadata": {"name": "p"}, "spec": spec})


def _c(name: str, limits: dict[str, str] | None = None,
       requests: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if limits is not None:
        res["limits"] = limits
    if requests is not None:
        res["requests"] = requests
    return {"name": name, "resources": res, **extra}


def test_requests_default_to_limits_and_guaranteed() -> None:
    p = _pod([_c("a", limits={"cpu": "2", "memory": "200Mi", "gpu-vendor.com/gpu": "1"})])
    c = p.containers[0]
    assert c.request("cpu") == 2
    assert c.request("memory") == 200 * MI
    assert c.request("gpu-vendor.com/gpu") == 1
    assert p.qos == QOS_GUARANTEED
    assert p.uid == "default/p" and p.namespace == "default"


def test_qos_classes() -> None:
    assert _pod([_c("a")]).qos == QOS_BEST_EFFORT
    assert _pod([_c("a", requests={"cpu": "1"})]).qos == QOS_BURSTABLE
    # requests below limits: burstable
    assert _pod([_c("a", limits={"cpu": "2", "memory": "1Gi"},
                    requests={"cpu": "1"})]).qos == QOS_BURSTABLE
    # every container needs cpu and memory limits
    assert _pod([_c("a", limits={"cpu": "1", "memory": "1Gi"}),
                 _c("b", limits={"cpu": "1"})]).qos == QOS_BURSTABLE
    # init containers count too
    assert _pod([_c("a", limits={"cpu": "1", "memory": "1Gi"})],
                [_c("i", requests={"cpu": "1"})]).qos == QOS_BURSTABLE
    assert _pod([_c("a", limits={"cpu": "500m", "memory": "1Gi"})]).qos == QOS_GUARANTEED


def test_effective_requests_with_sidecar() -> None:
    doc = yaml.safe_load((PODS / "sidecar-init.yaml").read_text())
    p = pod_from_dict(doc)
    assert [c.name for c in p.all_containers] == ["setup", "proxy", "late-init", "main",
                                                   "helper"]
    assert p.init_containers[1].restartable and not p.init_containers[1].is_init
    assert p.init_containers[0].is_init
    eff = p.effective_requests()
    # cpu: max(setup 6, proxy 1 + late-init 4, apps 3 + sidecar 1) = 6
    assert eff["cpu"] == 6
    # memory: max(1Gi, 100Mi + 2Gi, 1.5Gi + 100Mi) = 2148Mi
    assert eff["memory"] == 2148 * MI
    assert p.uid == "1111-2222" and p.namespace == "ml"


def test_effective_requests_apps_dominate() -> None:
    p = _pod([_c("a", limits={"cpu": "3", "memory": "1Gi"}),
              _c("b", limits={"cpu": "3", "memory": "1Gi"})],
             [_c("i", limits={"cpu": "4", "memory": "1Gi"})])
    assert p.effective_requests()["cpu"] == 6
    assert p.effective(lambda c: int(c.request("cpu"))) == 6


@pytest.mark.parametrize(("doc", "message"), [
    ({"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": {"cpu": "abc"}}}]}},
     "spec.containers[0].resources.limits.cpu: 'abc' is not a quantity"),
    ({"metadata": {"name": "p"}, "spec": {"containers": []}},
     "spec.containers: must be a non-empty list"),
    ({"metadata": {}, "spec": {"containers": [{"name": "c"}]}},
     "metadata.name: must be a non-empty string"),
    ({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}, {"name": "c"}]}},
     "spec.containers[1].name: container name 'c' is used twice"),
    ({"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "c", "resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}}]}},
     "spec.containers[0].resources.requests.cpu: request 2 is more than its limit 1"),
    ({"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "c", "resources": {"limits": {"x.com/gpu": "1.5"}}}]}},
     "spec.containers[0].resources.limits.x.com/gpu: '1.5': an extended resource"),
    ({"metadata": {"name": "p"}, "spec": {"containers": [
        {"name": "c", "restartPolicy": "Always"}]}},
     "spec.containers[0].restartPolicy:"),
    ({"metadata": {"name": "p"}, "spec": {"initContainers": [
        {"name": "i", "resources": {"limits": {"memory": "-1Gi"}}}], "containers": [
        {"name": "c"}]}},
     "spec.initContainers[0].resources.limits.memory: '-1Gi' is negative"),
    ([1, 2], "a pod must be a mapping"),
    ({"kind": "Deployment", "metadata": {"name": "p"}}, "kind: must be Pod"),
])
def test_bad_pods_name_the_field(doc: Any, message: str) -> None:
    with pytest.raises(TopologyError) as err:
        pod_from_dict(doc)
    assert str(err.value).startswith(message), str(err.value)


def test_source_prefix() -> None:
    with pytest.raises(TopologyError) as err:
        pod_from_dict({"metadata": {"name": "p"}, "spec": {}}, source="pod.yaml")
    assert str(err.value) == "pod.yaml: spec.containers: must be a non-empty list"


def test_decimal_cpu_quantities() -> None:
    p = _pod([_c("a", limits={"cpu": "2000m", "memory": "1G"})])
    assert p.containers[0].request("cpu") == Decimal(2)
    assert p.containers[0].request("memory") == 10**9
