"""The registry is the only list of policies: a toy fifth one (tests/toy_policy.py),
registered and nothing else edited, is taken by the CRD schema and the models, the wire,
policy resolution, an emulated node's admission, the NodeResourceTopology export and the
metrics' labels. Plugins: the loader takes it from NUMALIGN_POLICY_MODULES, says which
module is bad, and the CLI loads plugins only when a name is not a built-in one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

import testdata
from agent_helpers import given
from numalign.agent import metrics, nrt
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api import crdgen
from numalign.api.allocation import parse_admitted
from numalign.api.errors import WireError
from numalign.api.nodetopology import KubeletSettings, NodeTopologySpec
from numalign.api.resolution import PodMeta, PolicyRef, resolve
from numalign.api.resolved import Resolved, node_default, parse_resolved
from numalign.api.topologypolicy import TopologyPolicySpec
from numalign.topology import policies
from numalign.topology.errors import TopologyError
from numalign.topology.machine import load_machine
from numalign.topology.policies import load_plugins
from numalign.topology.policies.loader import PolicyPluginError, load_spec
from toy_policy import NAME as TOY
from toy_policy import AtMostTwo

TESTS = Path(__file__).resolve().parents[1]
KUBELET = ("none", "best-effort", "restricted", "single-numa-node")
MACHINE = """\
name: m
numaNodes:
  - {id: 0, cpus: "0-3", memory: 4Gi}
  - {id: 1, cpus: "4-7", memory: 4Gi}
  - {id: 2, cpus: "8-11", memory: 4Gi}
distances: [[10, 20, 20], [20, 10, 20], [20, 20, 10]]
"""


@pytest.fixture
def toy() -> Iterator[str]:
    policies.register(AtMostTwo())
    try:
        yield TOY
    finally:
        policies.unregister(TOY)


def _enums(crd: dict[str, Any]) -> dict[str, list[str]]:
    """Every string enum of a CRD's schema that lists a policy, by path."""
    out: dict[str, list[str]] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if "restricted" in node.get("enum", ()):
                out[path] = node["enum"]
            for k, v in node.items():
                walk(v, f"{path}.{k}")
        elif isinstance(node, list):
            for v in node:
                walk(v, path)

    walk(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "")
    return out


def test_the_registry_lists_the_kubelets_four_and_refuses_unknown_names() -> None:
    assert policies.names() == policies.kubelet_names() == KUBELET
    assert not policies.known("at-most-two") and not policies.known(None)
    with pytest.raises(TopologyError) as e:
        policies.check_policy("strict", "--policy")
    assert str(e.value) == ('--policy: unknown policy: "strict" (known: none, best-effort, '
                            "restricted, single-numa-node)")


def test_crd_enums_come_from_the_registry(toy: str) -> None:
    enums = {c["spec"]["names"]["kind"]: _enums(c) for c in crdgen.crds()}
    tp, nt = enums["TopologyPolicy"], enums["NodeTopology"]
    assert tp[".properties.spec.properties.policy"] == [*KUBELET, toy]
    assert tp[".properties.spec.properties.podOverrides.properties.policies.items"] == [
        *KUBELET, toy]
    assert nt[".properties.spec.properties.policy"] == [*KUBELET, toy]
    assert nt[".properties.status.properties.admitted.items.properties.policy"] == [
        *KUBELET, toy]
    # a real kubelet's configuration names only the kubelet's own
    assert nt[".properties.status.properties.kubelet.properties.topologyManagerPolicy"] == \
        list(KUBELET)
    # a TopologyPolicy may let pods ask for any of the five
    crd = next(c for c in crdgen.crds() if c["spec"]["names"]["kind"] == "TopologyPolicy")
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["podOverrides"]["properties"]["policies"]["maxItems"] == 5


def test_committed_crds_are_the_builtins_only() -> None:
    for c in crdgen.crds():
        assert all(e == list(KUBELET) for e in _enums(c).values())


def test_models_take_a_registered_policy_and_refuse_it_for_a_kubelet(toy: str) -> None:
    assert TopologyPolicySpec.model_validate({"policy": toy}).policy == toy
    every = [*KUBELET, toy]
    spec = TopologyPolicySpec.model_validate({"policy": "none", "podOverrides": {
        "allowed": True, "policies": every}})
    assert spec.pod_overrides is not None and spec.pod_overrides.policies == every
    assert NodeTopologySpec.model_validate({"policy": toy}).policy == toy
    with pytest.raises(ValidationError, match="Input should be 'none'"):
        KubeletSettings.model_validate({"topologyManagerPolicy": toy,
                                        "topologyManagerScope": "pod",
                                        "cpuManagerPolicy": "static",
                                        "memoryManagerPolicy": "Static"})
    policies.unregister(toy)
    with pytest.raises(ValidationError, match="Input should be 'none', 'best-effort', "
                                              "'restricted' or 'single-numa-node'"):
        TopologyPolicySpec.model_validate({"policy": toy})
    with pytest.raises(ValidationError, match="at most 4 items"):
        TopologyPolicySpec.model_validate({"policy": "none", "podOverrides": {
            "allowed": True, "policies": [*KUBELET, "none"]}})


def test_wire_and_resolution_carry_a_registered_policy(toy: str) -> None:
    value = json.dumps({"policy": toy, "scope": "pod", "source": "TopologyPolicy/t"})
    assert parse_resolved(value).policy == toy
    assert node_default({"policy": toy}).policy == toy
    entry = parse_admitted({"pod": "p", "uid": "u", "policy": toy, "scope": "container"})
    assert (entry.resolved.policy, entry.resolved.problems) == (toy, ())
    # a pod override names it; the TopologyPolicy allows any policy
    tp = PolicyRef("t", {"policy": "restricted", "podOverrides": {"allowed": True}})
    pod = PodMeta("ns", annotations={"numalign.io/policy": toy})
    got = resolve(pod, {}, [tp])
    assert (got.policy, got.source, got.problems) == (toy, "pod", ())
    policies.unregister(toy)
    with pytest.raises(WireError, match=f"policy must be one of none, best-effort, "
                                        f"restricted, single-numa-node, got '{toy}'"):
        parse_resolved(json.dumps({"policy": toy}))


def _scrape(states: list[NodeState]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    registry = CollectorRegistry()
    metrics.register(lambda: states, registry)
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _pod(name: str, cpus: int, memory: str) -> dict[str, Any]:
    res = {"cpu": str(cpus), "memory": memory}
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {"nodeName": "m-0", "containers": [
                {"name": "app", "image": "pause",
                 "resources": {"requests": res, "limits": res}}]},
            "status": {"phase": "Pending"}}


def test_an_emulated_node_admits_by_it_and_nrt_and_metrics_name_it(
        toy: str, tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(MACHINE)
    node = NodeState("m-0", load_machine(path))
    node.default = node_default({"policy": toy, "scope": "container"})
    under = Resolved(toy, "container")
    # 9 CPUs and 9Gi need three NUMA nodes (preferred: restricted would admit it)
    wide = node.decide(_pod("three", 9, "9Gi"), given(under))
    assert not wide.admit and wide.reason == "TopologyAffinityError"
    assert node.decide(_pod("two", 6, "5Gi"), given(under)).admit  # two NUMA nodes
    got = _scrape([node])
    key = frozenset({"node": "m-0", "policy": toy}.items())
    assert got[("numalign_topology_manager_admission_requests_total", key)] == 2
    assert got[("numalign_topology_manager_admission_errors_total", key)] == 1
    assert got[("numalign_cpu_manager_exclusive_cpu_allocation_count", key)] == 6
    # not a single-NUMA policy: nothing counted as aligned
    aligned = frozenset({"node": "m-0", "policy": toy, "scope": "container",
                         "boundary": "numa_node"}.items())
    assert got[("numalign_container_aligned_compute_resources_count", aligned)] == 0

    status = build_status(NodeState("n1", load_machine(testdata.MACHINES / "seed-figure1.yaml")))
    obj = nrt.build_nrt("n1", status, {"policy": toy, "scope": "pod"})
    assert {"name": "topologyManagerPolicy", "value": toy} in obj["attributes"]
    assert "topologyPolicies" not in obj  # the deprecated list has no value for it
    policies.unregister(toy)
    with pytest.raises(nrt.NrtError, match=f"'{toy}' is not one of none, best-effort"):
        nrt.build_nrt("n1", status, {"policy": toy, "scope": "pod"})


# ---------------------------------------------------------------- plugins


def test_loader_registers_a_module_named_in_the_environment() -> None:
    try:
        assert load_plugins("toy_policy", entry_points=False) == [TOY]
        assert policies.get_policy(TOY).name == TOY
        assert load_plugins(" toy_policy , ", entry_points=False) == [TOY]  # again: harmless
        assert [p.name for p in load_spec("toy_policy:AtMostTwo")] == [TOY]
    finally:
        policies.unregister(TOY)


def test_loader_takes_an_installed_packages_entry_point(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "numalign_toy-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: numalign-toy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        f"[numalign.policies]\n{TOY} = toy_policy:AtMostTwo\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert load_plugins("") == [TOY]
        assert policies.known(TOY)
    finally:
        policies.unregister(TOY)


class _Other(AtMostTwo):
    pass


def test_loader_says_which_module_is_bad(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(PolicyPluginError, match="policy plugin 'no_such_mod': cannot import "
                                                "'no_such_mod': ModuleNotFoundError"):
        load_plugins("toy_policy,no_such_mod", entry_points=False)
    policies.unregister(TOY)
    with pytest.raises(PolicyPluginError, match="module 'json' has no POLICIES"):
        load_plugins("json", entry_points=False)
    with pytest.raises(PolicyPluginError, match="'json:dumps': function is not a policy"):
        load_plugins("json:dumps", entry_points=False)
    policies.register(_Other())
    try:
        with pytest.raises(PolicyPluginError, match="'at-most-two' is empty or taken"):
            load_plugins("toy_policy", entry_points=False)
    finally:
        policies.unregister(TOY)


def _cli(args: list[str], modules: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NUMALIGN_POLICY_MODULES": modules,
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "numalign.cli", *args], input=stdin,
                          capture_output=True, text=True, env=env, timeout=60)


def test_cli_takes_a_plugin_policy_and_loads_plugins_only_on_a_miss() -> None:
    line = json.dumps({"policy": TOY, "numaNodes": [0, 1, 2], "providers": [
        {"cpu": [{"numaNodes": [0, 1, 2], "preferred": True}]}]})
    out = _cli(["merge"], "toy_policy", line)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"hint": {"numaNodes": [0, 1, 2], "preferred": True},
                                      "admit": False}
    # a bad plugin: the command says which, no traceback; a built-in policy never loads it
    out = _cli(["merge"], "no_such_mod", line)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "policy plugin 'no_such_mod': cannot import 'no_such_mod'" in out.stderr
    builtin = line.replace(TOY, "restricted")
    out = _cli(["merge"], "no_such_mod", builtin)
    assert out.returncode == 0 and json.loads(out.stdout)["admit"] is True, out.stderr
    # a long-running command refuses to start with it
    out = _cli(["agent", "--help"], "no_such_mod")
    assert out.returncode == 1
    assert out.stderr.startswith("numalign agent: policy plugin 'no_such_mod'")
