"""Strings a tenant controls (the GPU annotation, override annotations, event messages,
object names) never reach a refusal, an Event, a status or a terminal raw: the decoders
quote what they refuse escaped and cut short, and every printer escapes what it shows
from the cluster (an event message carrying ``ESC ] 0 ; ... BEL ESC [ 2 J`` retitles and
clears the terminal of whoever runs ``kubectl numalign why``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_explain_realnode import FakeClient, nodetopology
from test_explain_realnode import pod as real_pod
from test_kubectl_plugin import event, rejected_pod

import testdata
from numalign.api.admission import InvalidGpuRequest, admit_resolved
from numalign.api.allocation import parse_allocation
from numalign.api.errors import WireError
from numalign.api.resolution import PodMeta, PolicyRef, policy_problems, resolve
from numalign.api.resolved import parse_resolved, resolved_or_none
from numalign.commands import explain, kubectl, kubectl_nodes, kubectl_why
from numalign.commands import explain_pending as pending
from numalign.topology.errors import TopologyError
from numalign.topology.gpu import parse_gpu_requests
from numalign.topology.ledger import Ledger
from numalign.topology.machine import load_machine
from numalign.topology.pod import pod_from_dict

HOSTILE = "\x1b]0;pwned\x07\x1b[2J"  # set the terminal's title, clear the screen
BIDI = "\u202eevil\u202c\u2066x\u2069"
# Never raw in a one-line message: any C0 (line feed included), DEL, C1, the bidi
# embeddings, overrides and isolates, the line and paragraph separators.
RAW_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
# ... and in a multi-line view the same, but the line feeds between its lines.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
DGX = load_machine(testdata.MACHINES / "dgx-a100-like.yaml")  # nvidia.com/gpu and /hca


def _gpus(*requests: dict[str, Any]) -> str:
    return json.dumps(list(requests))


def _strings(doc: Any) -> list[str]:
    """Every string in a JSON document, keys too."""
    if isinstance(doc, str):
        return [doc]
    if isinstance(doc, dict):
        return [s for k, v in doc.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(doc, list):
        return [s for v in doc for s in _strings(v)]
    return []


# ---------------------------------------------------------------- the GPU annotation

@pytest.mark.parametrize("text", [
    _gpus({"count": 1, "resource": HOSTILE}),
    _gpus({"count": 1, "resource": "nvidia.com/" + HOSTILE}),
    _gpus({"count": 1, "resource": "nvidia.com/gpu" + BIDI}),
    _gpus({"count": 1, "withResource": "nvidia.com/" + HOSTILE}),
    _gpus({"count": 1, "withResource": {"resource": HOSTILE + "/hca", "count": 1}}),
    _gpus({"count": 1, HOSTILE: 1}),
    _gpus({"count": 1, "withResource": {"resource": "nvidia.com/hca", BIDI: 1}}),
    _gpus({"count": 1, "sameGroup": HOSTILE}),
    _gpus({"count": 1, "name": "gpu\n" + HOSTILE}),
    _gpus({"count": 1, "name": "gpu\n"}),
    _gpus({"count": 1, "minMemory": HOSTILE}),
    _gpus({"count": [HOSTILE]}),
], ids=["resource", "resource-with-domain", "resource-bidi", "withResource",
        "withResource-domain", "key", "withResource-key", "sameGroup", "name",
        "name-newline", "minMemory", "count"])
@pytest.mark.parametrize("machine", [DGX, None], ids=["machine", "no-machine"])
def test_gpu_refusal_quotes_the_value_escaped(text: str, machine: Any) -> None:
    with pytest.raises(TopologyError) as err:
        parse_gpu_requests(text, machine)
    message = str(err.value)
    assert not RAW_LINE.search(message), message
    assert "\\x1b" in message or "\\u001b" in message or "\\u202e" in message \
        or "\\n" in message, message


@pytest.mark.parametrize("name", ["nvidia.com/gpu", "nvidia.com/hca", "example.com/nic",
                                  "numalign.io/sample-device", "a.com/x", "v.com/gpu_2.b"])
def test_gpu_resource_names_kubernetes_accepts_still_parse(name: str) -> None:
    [req] = parse_gpu_requests(_gpus({"count": 1, "resource": name,
                                      "withResource": "nvidia.com/hca"}))
    assert req.resource == name


@pytest.mark.parametrize("name", ["gpu", "/gpu", "nvidia.com/", "Nvidia.com/gpu",
                                  "nvidia.com/gpu/x", "nvidia..com/gpu", "-a.com/gpu",
                                  "nvidia.com/-gpu", "nvidia.com/" + "g" * 64,
                                  "a" * 254 + "/gpu", "nvidia.com/gpu\n", " nvidia.com/gpu"])
def test_gpu_resource_must_be_an_extended_resource_name(name: str) -> None:
    for req in ({"count": 1, "resource": name}, {"count": 1, "withResource": name}):
        with pytest.raises(TopologyError, match="must be an extended resource name like"):
            parse_gpu_requests(_gpus(req))


def test_gpu_refusal_shows_a_long_value_cut_short() -> None:
    for req in ({"count": 1, "resource": "nvidia.com/" + HOSTILE * 300},
                {"count": 1, "sameGroup": "x" * 5000},
                {"count": 1, "x" * 5000: 1}):
        with pytest.raises(TopologyError) as err:
            parse_gpu_requests(_gpus(req), DGX)
        assert len(str(err.value)) < 300 and "…" in str(err.value)


def test_gpu_refusal_reaching_the_pod_carries_no_raw_escape() -> None:
    """The agent's and the extender's refusal (InvalidGpuRequest: the pod's status
    message and its Warning event, the scheduler's FailedScheduling)."""
    res = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
    for text in (_gpus({"count": 1, "resource": HOSTILE}),
                 _gpus({"count": 1, "resource": "nvidia.com/" + HOSTILE}),
                 _gpus({"count": 1, "withResource": "x.com/" + BIDI}),
                 _gpus({"count": 1, "sameGroup": HOSTILE})):
        model = pod_from_dict({"metadata": {"name": "p", "namespace": "ns", "uid": "u",
                                            "annotations": {"numalign.io/gpus": text}},
                               "spec": {"containers": [{"name": "c", "resources": {
                                   "requests": res, "limits": res}}]}})
        with pytest.raises(InvalidGpuRequest) as err:
            admit_resolved(DGX, Ledger(DGX), model, parse_resolved(
                '{"policy": "single-numa-node"}'), commit=False)
        assert not RAW_LINE.search(str(err.value)), str(err.value)


# ---------------------------------------------------------------- wire and resolution

def test_resolved_source_must_name_a_topologypolicy() -> None:
    for source in ("TopologyPolicy/" + HOSTILE, "TopologyPolicy/a\nb", "TopologyPolicy/A"):
        value = json.dumps({"policy": "restricted", "source": source})
        with pytest.raises(WireError) as err:
            parse_resolved(value)
        assert not RAW_LINE.search(str(err.value)), str(err.value)
        assert resolved_or_none(value) is None
    assert parse_resolved('{"policy": "restricted", "source": "TopologyPolicy/ml-1.b"}'
                          ).source == "TopologyPolicy/ml-1.b"


@pytest.mark.parametrize("doc", [
    {"containers": {HOSTILE: {"cpus": "x"}}},
    {"containers": {"c": {"devices": {HOSTILE: "x"}}}},
    {"containers": {"c": {"hugepages": {BIDI: {"0": "lots"}}}}},
    {"gpus": {HOSTILE: [1] * 2000}},
    {"containers": {"c": {"memory": {HOSTILE: 1}}}},
])
def test_allocation_decoder_refuses_with_escaped_names(doc: dict[str, Any]) -> None:
    with pytest.raises(WireError) as err:
        parse_allocation(json.dumps(doc))
    assert not RAW_LINE.search(str(err.value)), str(err.value)


def test_override_problems_quote_the_annotation_escaped_and_short() -> None:
    ref = PolicyRef.from_object({"metadata": {"name": "p"}, "spec": {
        "policy": "restricted", "podOverrides": {"allowed": True}}})
    pod = PodMeta.from_object({"metadata": {"namespace": "ns", "annotations": {
        "numalign.io/policy": HOSTILE * 1000, "numalign.io/scope": BIDI}}})
    problems = resolve(pod, {}, [ref]).problems
    assert len(problems) == 2
    for p in problems:  # the InvalidTopologyOverride event's message
        assert not RAW_LINE.search(p) and len(p) < 300, p
    assert problems[1] == ("numalign.io/scope: '\\u202eevil\\u202c\\u2066x\\u2069' is not a "
                           "scope; allowed values: container, pod")


def test_policy_problems_escape_the_keys_they_name() -> None:
    """A TopologyPolicy's Valid condition names the bad field (a label key included)."""
    [problem] = policy_problems({"policy": "restricted",
                                 "podSelector": {"matchLabels": {HOSTILE: 5}}})
    assert problem == ("spec.podSelector.matchLabels.\\x1b]0;pwned\\x07\\x1b[2J: Input "
                       "should be a valid string")


# ---------------------------------------------------------------- kubectl numalign why

def _hostile_report() -> dict[str, Any]:
    pod = rejected_pod()
    pod["metadata"]["annotations"]["numalign.io/resolved"] = "{" + HOSTILE
    pod["status"]["message"] = "Pod was rejected: " + BIDI + HOSTILE
    events = [event("FailedScheduling", "0/2 nodes are available: " + HOSTILE + BIDI),
              event("InvalidGpuRequest", "refused\n" + HOSTILE + "\u2028line",
                    component="numalign" + HOSTILE, when="2026-01-01T00:00:04Z",
                    type_="Warning\x1b[31m")]
    return kubectl_why.why_report(pod, events, [], None)


def test_why_prints_event_messages_escaped() -> None:
    report = _hostile_report()
    text = kubectl_why.render_why(report)
    assert not RAW.search(text), text
    assert "Scheduler:  0/2 nodes are available: \\x1b]0;pwned\\x07\\x1b[2J\\u202eevil" in text
    assert "refused\\n\\x1b]0;pwned\\x07\\x1b[2J\\u2028line" in text
    assert "numalign.io/resolved is not valid: {\\x1b]0;pwned" in text
    assert "Rejected:   TopologyAffinityError: \\u202eevil" in text
    # the report itself (-o json) keeps the values as they are
    assert report["scheduler"] == ["0/2 nodes are available: " + HOSTILE + BIDI]


class _WhyClient:
    """What cmd_why reads, from memory."""

    def __init__(self, *_: Any, **__: Any) -> None:
        self.namespace = "team"

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        pod = rejected_pod()
        pod["status"]["message"] = HOSTILE
        return pod

    def list(self, path: str, what: str, params: Any = None) -> list[dict[str, Any]]:
        if what == "events":
            return [event("FailedScheduling", HOSTILE + BIDI)]
        if what == "pods":
            return [{"metadata": {"name": "p", "namespace": "team"},
                     "status": {"phase": "Failed", "reason": "Bad" + HOSTILE}}]
        return []

    def read(self, path: str, what: str, params: Any = None) -> dict[str, Any] | None:
        return None

    def close(self) -> None:
        pass


@pytest.mark.parametrize("argv", [["why", "big"], ["why", "big", "-o", "yaml"],
                                  ["why", "big", "-o", "json"], ["why"], ["why", "-o", "yaml"]])
def test_kubectl_numalign_output_has_no_raw_escape(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        argv: list[str]) -> None:
    monkeypatch.setattr(kubectl, "LiveClient", _WhyClient)
    assert kubectl.main(argv) == 0
    out = capsys.readouterr().out
    assert not RAW.search(out), out
    if "-o" in argv:
        doc = yaml.safe_load(out)  # JSON and YAML escape their strings: the value is kept
        assert any(HOSTILE in s for s in _strings(doc))


def test_kubectl_numalign_errors_have_no_raw_escape(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    class Missing(_WhyClient):
        def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
            return None

    monkeypatch.setattr(kubectl, "LiveClient", Missing)
    assert kubectl.main(["why", "p" + HOSTILE]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and not RAW_LINE.search(err.rstrip("\n")), err


def test_nodes_table_escapes_names_from_the_cluster() -> None:
    nt = {"metadata": {"name": "n1" + HOSTILE},
          "status": {"zones": [{"id": BIDI, "allocatable": {"cpu": "4", "x.com/" + HOSTILE: "1"},
                                "available": {"cpu": "2"}}],
                     "conditions": [{"type": "Ready", "status": "True" + HOSTILE}]}}
    rows = kubectl_nodes.nodes_report([nt])
    for wide in (False, True):
        text = kubectl_nodes.render_nodes(rows, wide=wide)
        assert not RAW.search(text), text
        assert "n1\\x1b]0;pwned\\x07\\x1b[2J" in text


# ---------------------------------------------------------------- numalign explain

def test_explain_pending_prints_the_schedulers_message_escaped() -> None:
    doc = pending.pending_json("p" + HOSTILE, "ns", [], "0/3 nodes: " + HOSTILE + BIDI)
    text = pending.render_pending(doc)
    assert not RAW.search(text), text
    assert "The scheduler said: 0/3 nodes: \\x1b]0;pwned\\x07\\x1b[2J\\u202eevil" in text


def test_explain_prints_annotation_values_escaped(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Live ``numalign explain`` (and ``kubectl numalign explain``) of a pod whose
    ``numalign.io/resolved`` names a TopologyPolicy no API server would accept, and
    of a pod whose rejection message carries escapes."""
    nt = nodetopology([], {})
    nt["status"]["kubelet"] = {"topologyManagerPolicy": "none", "cpuManagerPolicy": "none"}
    nt["status"]["conditions"].append({"type": "NRIPlacement", "status": "True",
                                       "reason": "Registered"})
    p = real_pod("c", "uid-c", "Pending")
    p["metadata"]["annotations"] = {
        "numalign.io/resolved": json.dumps({"policy": "single-numa-node", "scope": "pod",
                                            "source": "TopologyPolicy/" + HOSTILE}),
        "numalign.io/allocation": HOSTILE + BIDI}
    monkeypatch.setattr(FakeClient, "objects", {"pod/ns/c": p, "nt/real-1": nt})
    monkeypatch.setattr(explain, "LiveClient", FakeClient)
    assert explain.main(["c", "-n", "ns"]) == 0
    out = capsys.readouterr().out
    assert not RAW.search(out), out
    assert ("Note: annotation numalign.io/resolved: source must be pod, node-default, none "
            "or TopologyPolicy/NAME, got 'TopologyPolicy/\\x1b]0;pwned\\x07\\x1b[2J'; "
            "using the node default") in out
    assert explain.main(["c", "-n", "ns", "-o", "json"]) == 0
    assert not RAW.search(capsys.readouterr().out)


def test_explain_prints_the_kubelets_rejection_escaped(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    objects = {"pod/ns/c": real_pod("c", "uid-c", "Failed", reason="TopologyAffinityError",
                                    message="Resources cannot be allocated" + HOSTILE + BIDI),
               "nt/real-1": nodetopology([], {})}
    monkeypatch.setattr(FakeClient, "objects", objects)
    monkeypatch.setattr(explain, "LiveClient", FakeClient)
    assert explain.main(["c", "-n", "ns"]) == 0
    out = capsys.readouterr().out
    assert not RAW.search(out), out
    assert ("Kubelet's decision: REJECTED (TopologyAffinityError): Resources cannot be "
            "allocated\\x1b]0;pwned\\x07\\x1b[2J\\u202eevil") in out


def test_offline_explain_refuses_a_gpu_annotation_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
    for gpus in (_gpus({"count": 1, "resource": "nvidia.com/" + HOSTILE}),
                 _gpus({"count": 1, "withResource": {"resource": "nvidia.com/hca",
                                                     "sameGroup": HOSTILE}}),
                 _gpus({"count": 1, BIDI: True})):
        pod = tmp_path / "pod.yaml"
        pod.write_text(yaml.safe_dump({"metadata": {"name": "p", "namespace": "ns",
                                                    "annotations": {"numalign.io/gpus": gpus}},
                                       "spec": {"containers": [{"name": "c", "resources": {
                                           "requests": res, "limits": res}}]}}))
        assert explain.main(["--machine", str(testdata.MACHINES / "dgx-a100-like.yaml"),
                             "--pod", str(pod), "--policy", "single-numa-node"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("numalign explain: ") and err.count("\n") == 1, err
        assert not RAW_LINE.search(err.rstrip("\n")), err


def test_events_kopf_posts_carry_no_raw_escape() -> None:
    """The operator's filter on kopf's object logger (whose records kopf posts as the
    objects' Events) makes every message one printable line."""
    import logging

    from numalign.controller.main import printable_records

    record = logging.LogRecord("kopf.objects", logging.WARNING, __file__, 1,
                               "pod %s: %s", ("x\x1b]0;t\x07", "bad\u202evalue\nmore"), None)
    assert printable_records(record)
    message = record.getMessage()
    assert "\x1b" not in message and "\x07" not in message and "\u202e" not in message
    assert "\n" not in message and "\\x1b" in message
