"""crds/ is generated from the models in numalign.api and must be current; the schemas
are structural and the models enforce the same rules as the CRDs' CEL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from numalign.api import (
    NodeTopologyStatus,
    TopologyPolicy,
    TopologyPolicySpec,
    crdgen,
    namespace_summary,
    summarize,
)

CRDS = Path(__file__).resolve().parents[2] / "crds"


def test_crds_are_current() -> None:
    stale = crdgen.stale_files(CRDS)
    assert not stale, (
        f"crds/ is stale ({', '.join(stale)}): run 'python -m numalign.api.crdgen'"
    )


def test_chart_crds_are_crds_and_kopfs() -> None:
    """Helm installs CRDs only from the chart's crds/: the same files as crds/ (and no
    other), plus Kopf's peering CRDs as config/crd has them."""
    chart = crdgen.chart_crd_dir()
    stale = crdgen.stale_files(chart, crdgen.chart_files())
    assert not stale, (
        f"{chart} is stale ({', '.join(stale)}): run 'python -m numalign.api.crdgen'")
    for f in CRDS.glob("*.yaml"):
        assert (chart / f.name).read_text() == f.read_text()
    assert (chart / crdgen.CHART_KOPF_PEERING).read_text() == \
        (CRDS.parent / "config/crd/kopf-peering.yaml").read_text()


def test_check_flag_reports_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert crdgen.main(["--check", "--out", str(tmp_path)]) == 1
    assert "stale" in capsys.readouterr().err
    assert crdgen.main(["--out", str(tmp_path)]) == 0
    assert crdgen.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "numalign.io_topologypolicies.yaml").write_text("edited\n")
    assert crdgen.main(["--check", "--out", str(tmp_path)]) == 1


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        out.append((path, node))
        for key, sub in (node.get("properties") or {}).items():
            out += _walk(sub, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            out += _walk(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            out += _walk(node["additionalProperties"], f"{path}[*]")
    return out


@pytest.mark.parametrize("name", ["numalign.io_nodetopologies.yaml",
                                  "numalign.io_topologypolicies.yaml"])
def test_schemas_are_structural(name: str) -> None:
    doc = yaml.safe_load((CRDS / name).read_text())
    assert doc["apiVersion"] == "apiextensions.k8s.io/v1"
    spec = doc["spec"]
    assert spec["scope"] == "Cluster"
    assert spec["names"]["categories"] == ["numalign"]
    (version,) = spec["versions"]
    assert version["subresources"] == {"status": {}}
    schema = version["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node and "title" not in node, path
        assert node.get("additionalProperties") is not False, path
        assert "uniqueItems" not in node, path
        assert (
            "type" in node
            or node.get("x-kubernetes-int-or-string")
            or node.get("x-kubernetes-preserve-unknown-fields")
        ), f"{path} has no type"
        assert not ("properties" in node and "additionalProperties" in node), path


def test_printer_columns() -> None:
    by_kind = {c["spec"]["names"]["kind"]: c for c in crdgen.crds()}
    names = {k: [col["name"].upper() for col in c["spec"]["versions"][0]
                  ["additionalPrinterColumns"] if not col.get("priority")]
             for k, c in by_kind.items()}
    assert names["NodeTopology"] == ["POLICY", "SCOPE", "NUMA", "CPUS", "DEVICES", "PODS",
                                     "REJECTED", "DRA", "AGE"]
    assert names["TopologyPolicy"] == ["POLICY", "SCOPE", "PRIORITY", "VALID", "NAMESPACES",
                                       "AGE"]
    assert by_kind["NodeTopology"]["spec"]["names"]["shortNames"] == ["nt"]
    assert by_kind["TopologyPolicy"]["spec"]["names"]["shortNames"] == ["tp"]


def test_topologypolicy_defaults_and_round_trip() -> None:
    tp = TopologyPolicy.model_validate(
        {"apiVersion": "numalign.io/v1alpha1", "kind": "TopologyPolicy",
         "metadata": {"name": "ml"}, "spec": {"policy": "single-numa-node", "namespaces": ["ml"]}}
    )
    assert tp.name == "ml"
    assert tp.spec.scope == "container" and tp.spec.priority == 0
    assert tp.spec.redeploy.enabled and tp.spec.redeploy.max_attempts == 3
    d = tp.spec.to_dict()
    assert d["redeploy"] == {"enabled": True, "maxAttempts": 3, "backoffSeconds": 10,
                             "avoidRejectingNodes": True}
    assert TopologyPolicySpec.model_validate(d) == tp.spec
    assert tp.spec.matches_namespace("ml") and not tp.spec.matches_namespace("other")


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"policy": "single-numa"}, "single-numa-node"),
        ({"policy": "restricted", "priority": -1}, "greater than or equal to 0"),
        ({"policy": "restricted", "options": {"maxAllowableNumaNodes": 4}}, "at least 8"),
        ({"policy": "restricted", "options": {"maxAllowableNumaNodes": 65}}, "64"),
        ({"policy": "restricted", "options": {"bogus": True}}, "bogus"),
        ({"policy": "restricted", "podOverrides": {"policies": ["none"]}}, "allowed is true"),
        ({"policy": "restricted", "namespaces": []}, "at least one namespace"),
        ({"policy": "restricted",
          "podSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}, "non-empty"),
        ({"policy": "restricted",
          "podSelector": {"matchExpressions": [{"key": "a", "operator": "Exists",
                                                "values": ["x"]}]}}, "empty"),
        ({"policy": "restricted", "redeploy": {"maxAttempts": 0}}, "greater than or equal to 1"),
    ],
)
def test_topologypolicy_spec_refused(spec: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValidationError) as err:
        TopologyPolicySpec.model_validate(spec)
    assert needle in str(err.value)


def test_selectors_and_overrides() -> None:
    spec = TopologyPolicySpec.model_validate({
        "policy": "restricted",
        "podSelector": {"matchLabels": {"tier": "rt"},
                        "matchExpressions": [{"key": "env", "operator": "NotIn",
                                              "values": ["dev"]}]},
        "podOverrides": {"allowed": True, "policies": ["single-numa-node"]},
    })
    assert spec.matches_pod({"tier": "rt", "env": "prod"})
    assert not spec.matches_pod({"tier": "rt", "env": "dev"})
    assert not spec.matches_pod({})
    assert spec.pod_overrides is not None
    assert spec.pod_overrides.permits("single-numa-node")
    assert not spec.pod_overrides.permits("none")


def test_summary() -> None:
    status = NodeTopologyStatus.model_validate({
        "zones": [
            {"id": 0, "cpus": "0-7", "allocatable": {"cpu": 8}, "available": {"cpu": "6"}},
            {"id": 1, "cpus": "8-15"},
        ],
        "devices": [
            {"resource": "nvidia.com/gpu", "id": "g0", "numaNode": 0},
            {"resource": "nvidia.com/gpu", "id": "g1", "numaNode": 1},
        ],
        "admitted": [
            {"pod": "p", "namespace": "ns", "uid": "u", "policy": "restricted",
             "scope": "pod", "source": "none", "devices": {"nvidia.com/gpu": ["g1"]}},
        ],
    })
    s = summarize(status)
    assert (s.numa_nodes, s.cpus, s.devices, s.pods) == (2, "14/16", "1/2", 1)
    assert namespace_summary(["b", "a"]) == "a,b"
    assert namespace_summary(["a", "b", "c", "d", "e"]) == "a,b,c,+2"
    assert namespace_summary([], every=True) == "*"


def test_api_policy_and_scope_names_are_the_engines() -> None:
    # The CRD's policy enum is the engine's registry (tests/unit/test_registered_policy.py);
    # the scope enum comes from the api's Literal type, the engine decides with its own
    # names. A scope added to one and not the other would pass validation and then fail
    # admission, so the two lists must stay equal.
    from numalign.api.common import SCOPES as API_SCOPES
    from numalign.topology.policies import names
    from numalign.topology.policyconfig import SCOPES

    tp = next(c for c in crdgen.crds() if c["spec"]["names"]["kind"] == "TopologyPolicy")
    spec = tp["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["policy"]["enum"] == list(names())
    assert API_SCOPES == SCOPES


def test_every_map_and_list_a_tenant_or_agent_fills_is_bounded() -> None:
    """matchLabels of every selector has maxProperties; a NodeTopology's zones, devices
    and admitted pods have maxItems (the API server refuses oversized objects before any
    handler reads them, and CEL cost estimates stay bounded)."""
    by_kind = {c["spec"]["names"]["kind"]: c["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
               for c in crdgen.crds()}
    selectors = 0
    for kind, schema in by_kind.items():
        for path, node in _walk(schema):
            if path.endswith(".matchLabels"):
                selectors += 1
                assert 0 < node.get("maxProperties", 0) <= 64, f"{kind} {path}"
    assert selectors >= 3  # namespaceSelector, nodeSelector, podSelector
    status = by_kind["NodeTopology"]["properties"]["status"]["properties"]
    assert status["zones"]["maxItems"] == 64
    for key in ("devices", "admitted"):
        assert 0 < status[key]["maxItems"] <= 1024, key
    labels = {f"k{i}": "v" for i in range(65)}
    with pytest.raises(ValidationError, match="at most 64 items"):
        TopologyPolicySpec.model_validate({"policy": "restricted",
                                           "podSelector": {"matchLabels": labels}})
    with pytest.raises(ValidationError, match="at most 1024 items"):
        NodeTopologyStatus.model_validate({"admitted": [{}] * 1025})
