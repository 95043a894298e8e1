"""``kubectl numalign``: argument parsing (kubectl's flags before or after the
subcommand), the nodes table, the why report, and the krew manifest (krew's validation
rules, the archive its sha256 names)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import re
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

import testdata
from agent_helpers import given
from numalign.agent.publish import build_status
from numalign.agent.state import NodeState
from numalign.api.resolved import Resolved
from numalign.commands import kubectl, kubectl_nodes, kubectl_why
from numalign.controller.redeploy.record import WorkloadState, workload_key
from numalign.topology.machine import load_machine

KREW = Path(__file__).resolve().parents[2] / "plugins" / "krew"
SNN = Resolved("single-numa-node", "pod")


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize("argv", [
    ["why", "p1", "-n", "team", "--context", "c1", "--kubeconfig", "kc", "-o", "json"],
    ["-n", "team", "--context", "c1", "why", "p1", "--kubeconfig", "kc", "-o", "json"],
    ["--namespace=team", "--kubeconfig=kc", "--context=c1", "-ojson", "why", "p1"],
])
def test_kubectl_flags_before_or_after_the_subcommand(argv: list[str]) -> None:
    args = kubectl.parse(argv)
    assert (args.command, args.pod, args.namespace, args.context, args.kubeconfig,
            args.output) == ("why", "p1", "team", "c1", "kc", "json")


def test_defaults_and_subcommand_arguments() -> None:
    args = kubectl.parse(["nodes", "n1", "n2", "-o", "wide"])
    assert (args.nodes, args.output, args.namespace, args.all_namespaces) == (
        ["n1", "n2"], "wide", None, False)
    args = kubectl.parse(["why", "-A"])
    assert args.pod is None and args.all_namespaces
    args = kubectl.parse(["explain", "p", "--policy", "restricted", "--option", "a=b"])
    assert (args.pod, args.policy, args.option, args.output) == (
        "p", "restricted", ["a=b"], "text")


@pytest.mark.parametrize("argv,needle", [
    ([], "COMMAND"),
    (["top"], "invalid choice"),
    (["nodes", "-o", "xml"], "invalid choice"),
    (["explain"], "POD"),
    (["explain", "p", "-A"], "not -A"),
    (["why", "p", "-A"], "not -A"),
])
def test_bad_arguments_are_one_line(argv: list[str], needle: str,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert kubectl.main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("kubectl numalign: ") and needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_unreachable_cluster_is_one_line(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert kubectl.main(["nodes", "--kubeconfig", str(tmp_path / "none")]) == 1
    err = capsys.readouterr().err
    assert "cannot load the Kubernetes credentials" in err and "Traceback" not in err


# ---------------------------------------------------------------- nodes


def nodetopology(name: str, st: NodeState, spec: dict[str, Any] | None = None
                 ) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec or {}, "status": build_status(st)}


def seed_state() -> NodeState:
    st = NodeState("n1", load_machine(testdata.MACHINES / "seed-figure1.yaml"))
    res = {"cpu": "2", "memory": "1Gi", "gpu-vendor.com/gpu": "1"}
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": res}}]}}
    assert st.decide(pod, given(SNN)).admit
    return st


def test_nodes_rows_free_and_total_per_zone() -> None:
    nts = [nodetopology("n2", NodeState("n2", load_machine(
               testdata.MACHINES / "seed-figure1.yaml"))),
           nodetopology("n1", seed_state(), {"policy": "single-numa-node", "scope": "pod"})]
    rows = kubectl_nodes.nodes_report(nts)
    assert [r["name"] for r in rows] == ["n1", "n2"]
    n1 = rows[0]
    assert (n1["policy"], n1["scope"], n1["pods"], n1["ready"]) == (
        "single-numa-node", "pod", 1, "True")
    used = [z for z in n1["zones"] if z["cpu"]["free"] == 2]
    assert len(used) == 1  # the pod's zone: 2 of 4 CPUs left, its GPU taken
    z = used[0]
    assert z["cpu"] == {"free": 2, "total": 4}
    assert z["memory"] == {"free": 31 << 30, "total": 32 << 30}
    assert z["devices"]["gpu-vendor.com/gpu"] == {"free": 0, "total": 1}
    assert rows[1]["policy"] == "none"
    assert kubectl_nodes.nodes_report(nts, ["n2"]) == rows[1:]


def test_nodes_policy_of_a_real_node_is_its_kubelets() -> None:
    nt = nodetopology("real", NodeState("real", load_machine(
        testdata.MACHINES / "seed-figure1.yaml")), {"policy": "none"})
    nt["status"]["kubelet"] = {"topologyManagerPolicy": "restricted",
                               "topologyManagerScope": "pod"}
    row = kubectl_nodes.node_row(nt)
    assert (row["policy"], row["scope"]) == ("restricted", "pod")


def test_nodes_table_text_and_wide() -> None:
    rows = kubectl_nodes.nodes_report([nodetopology("n1", seed_state(),
                                                    {"policy": "restricted"})])
    text = kubectl_nodes.render_nodes(rows).splitlines()
    assert text[0].split() == ["NODE", "POLICY", "NUMA", "CPU", "MEMORY", "DEVICES"]
    assert text[1].split() == ["n1", "restricted", "0", "2/4", "31Gi/32Gi",
                               "gpu-vendor.com/gpu=0/1,nic-vendor.com/nic=1/1"]
    assert text[2].split() == ["1", "4/4", "32Gi/32Gi",
                               "gpu-vendor.com/gpu=1/1,nic-vendor.com/nic=1/1"]
    wide = kubectl_nodes.render_nodes(rows, wide=True).splitlines()
    assert wide[0].split()[-4:] == ["HUGEPAGES", "SCOPE", "PODS", "READY"]
    assert wide[1].split()[-3:] == ["container", "1", "True"]
    assert "No NodeTopologies" in kubectl_nodes.render_nodes([])


# ---------------------------------------------------------------- why


def rejected_pod() -> dict[str, Any]:
    res = {"cpu": "8", "memory": "1Gi"}
    return {"metadata": {"name": "big", "namespace": "team", "uid": "u-big",
                         "annotations": {"numalign.io/resolved": SNN.annotation()}},
            "spec": {"nodeName": "n1",
                     "containers": [{"name": "c", "resources": {"limits": res}}]},
            "status": {"phase": "Failed", "reason": "TopologyAffinityError",
                       "message": "Pod was rejected: Resources cannot be allocated with "
                                  "Topology locality"}}


def event(reason: str, message: str, uid: str = "u-big", when: str = "2026-01-01T00:00:10Z",
          component: str = "default-scheduler", type_: str = "Warning") -> dict[str, Any]:
    return {"involvedObject": {"kind": "Pod", "name": "big", "uid": uid},
            "reason": reason, "message": message, "type": type_, "count": 2,
            "source": {"component": component}, "lastTimestamp": when}


def test_why_report_gathers_what_numalign_knows() -> None:
    pod = rejected_pod()
    st = WorkloadState(attempts=2, rejections={"n1": "2026-01-01T00:00:05Z"}, budget=3,
                       gave_up={"u-big": "2026-01-01T00:00:09Z"})
    cm = {"data": {workload_key(pod): st.dump()}}
    events = [event("FailedScheduling", "0/2 nodes are available: 2 numalign: no NUMA node "
                    "fits"),
              event("TopologyAffinityError", "Resources cannot be allocated",
                    when="2026-01-01T00:00:04Z", component="kubelet"),
              event("FailedScheduling", "an earlier pod of that name", uid="u-old")]
    nts = [nodetopology("n1", seed_state(), {"policy": "single-numa-node"}),
           nodetopology("n2", NodeState("n2", load_machine(
               testdata.MACHINES / "dgx-a100-like.yaml")))]
    report = kubectl_why.why_report(pod, events, nts, cm)
    assert report["resolved"]["policy"] == "single-numa-node"
    assert report["rejection"] == {"reason": "TopologyAffinityError", "message":
                                   "Resources cannot be allocated with Topology locality"}
    assert report["redeploy"]["attempts"] == 2 and report["redeploy"]["budget"] == 3
    assert report["redeploy"]["rejectedBy"] == {"n1": "2026-01-01T00:00:05Z"}
    assert report["redeploy"]["gaveUpOnThisPod"] == "2026-01-01T00:00:09Z"
    assert report["scheduler"] == ["0/2 nodes are available: 2 numalign: no NUMA node fits"]
    assert [e["reason"] for e in report["events"]] == ["TopologyAffinityError",
                                                       "FailedScheduling"]
    # 8 CPUs in one NUMA node: seed-figure1's zones have 4 each; the DGX has room
    assert report["unfit"] == ["n1"] and report["nodes"] == 2
    text = kubectl_why.render_why(report, now=datetime(2026, 1, 1, 0, 1, tzinfo=UTC))
    assert "Pod team/big: Failed on node n1" in text
    assert "Rejected:   TopologyAffinityError: Resources cannot" in text
    assert "Redeploy:   2 of 3 attempts; rejected by n1 (55s ago); gave up" in text
    assert "Scheduler:  0/2 nodes are available" in text
    assert "Cannot fit: n1 (1 of 2 nodes" in text
    assert "kubectl numalign explain big -n team" in text
    json.dumps(report)  # -o json


def test_why_pending_pod_without_numalign_data() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
           "spec": {"containers": [{"name": "c"}]},
           "status": {"phase": "Pending", "conditions": [
               {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}}
    report = kubectl_why.why_report(pod, [], [], None)
    assert "resolved" not in report and "rejection" not in report
    assert "redeploy" not in report and report["unfit"] == []
    text = kubectl_why.render_why(report)
    assert "(not bound)" in text and "no numalign.io/resolved" in text
    assert "is the numalign agent running" in text
    assert kubectl_why.summary_row(pod) == ["ns", "p", "Pending", "Unschedulable", "-"]
    assert kubectl_why.stuck(pod) and not kubectl_why.stuck(
        {"status": {"phase": "Running"}})


# ---------------------------------------------------------------- krew


def _load_archive_module() -> Any:
    spec = importlib.util.spec_from_file_location("krew_archive", KREW / "archive.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SEMVER = re.compile(r"^v(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
                    r"(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")


def test_krew_manifest_is_valid() -> None:
    """krew's ``validation.ValidatePlugin`` rules (internal/index/validation)."""
    path = KREW / "numalign.yaml"
    m = yaml.safe_load(path.read_text())
    assert m["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert m["kind"] == "Plugin"
    assert set(m) == {"apiVersion", "kind", "metadata", "spec"}
    name = m["metadata"]["name"]
    assert name == path.stem and re.fullmatch(r"[\w-]+", name)
    spec = m["spec"]
    assert set(spec) <= {"version", "shortDescription", "description", "caveats",
                         "homepage", "platforms"}
    assert spec["shortDescription"] and not re.search(r"[\r\n]", spec["shortDescription"])
    assert SEMVER.match(spec["version"])
    assert spec["platforms"]
    for pl in spec["platforms"]:
        assert set(pl) <= {"uri", "sha256", "selector", "files", "bin"}
        assert pl["uri"] and pl["bin"]
        assert re.fullmatch(r"[a-f0-9]{64}", pl["sha256"])
        sel = pl["selector"]
        keys = list(sel.get("matchLabels") or {}) + [e["key"] for e in
                                                      sel.get("matchExpressions") or []]
        assert keys and set(keys) <= {"os", "arch"}
        for op in pl.get("files", []):
            assert op["from"] and op["to"]


def test_krew_archive_is_what_the_manifest_names(tmp_path: Path) -> None:
    data = _load_archive_module().archive_bytes()
    m = yaml.safe_load((KREW / "numalign.yaml").read_text())
    [pl] = m["spec"]["platforms"]
    assert hashlib.sha256(data).hexdigest() == pl["sha256"]
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        member = tar.getmember(pl["bin"])
        assert member.mode & 0o111  # krew links it as the plugin: it must be executable
        script = tar.extractfile(member)
        assert script is not None
        text = script.read().decode()
    assert text.startswith("#!/bin/sh") and "-m numalign.commands.kubectl" in text
    assert [op["from"] for op in pl["files"]] == [pl["bin"]]


def test_malformed_objects_do_not_break_the_reports() -> None:
    nts: list[dict[str, Any]] = [
        {"metadata": {"name": "odd"}, "status": {"zones": [
            "zone", {"id": 0, "allocatable": {"cpu": "lots", "memory": None},
                     "available": ["x"]},
            {"id": 1, "allocatable": {"cpu": 4, "example.com/x": "2"},
             "available": {"cpu": "-", "example.com/x": "1"}}],
            "conditions": ["Ready"], "summary": {"pods": "many"}}},
        {"metadata": {"name": "empty"}},
    ]
    rows = kubectl_nodes.nodes_report(nts)
    odd = next(r for r in rows if r["name"] == "odd")
    assert odd["zones"] == [{"id": 1, "cpu": {"free": None, "total": 4},
                             "memory": {"free": None, "total": None}, "hugepages": {},
                             "devices": {"example.com/x": {"free": 1, "total": 2}}}]
    text = kubectl_nodes.render_nodes(rows)
    assert "?/4" in text and "empty" in text
    events = [{"involvedObject": "pod"}, {"involvedObject": {"name": "big"}, "count": "x"},
              {"regarding": {"kind": "Pod", "name": "big"}, "note": "from events.k8s.io"}]
    pod = rejected_pod()
    report = kubectl_why.why_report(pod, events, nts, {"data": {workload_key(pod): "{nope"}})
    assert [e["message"] for e in report["events"]] == ["", "from events.k8s.io"]
    assert report["redeploy"]["attempts"] == 0
    kubectl_why.render_why(report)
