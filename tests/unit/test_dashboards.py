"""The Grafana dashboard (config/grafana) and the PrometheusRule (config/prometheus): every
PromQL expression parses, and every metric it selects is one numalign exports (the names
come from the operator's metric objects, the agent's collector and the extender's registry,
not from a list), with
labels those metrics have."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric

from agent_helpers import given
from numalign.agent.metrics import ManagerCollector
from numalign.agent.state import NodeState
from numalign.api.resolved import Resolved
from numalign.controller import metrics as operator_metrics
from numalign.extender.metrics import Metrics as ExtenderMetrics
from numalign.topology.machine import load_machine

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "config" / "grafana" / "numalign-dashboard.json"
RULE = REPO / "config" / "prometheus" / "prometheusrule.yaml"


SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "unknown": ("",),
            "histogram": ("_bucket", "_sum", "_count", "_created"),
            "summary": ("", "_sum", "_count", "_created"), "info": ("_info",)}


# ------------------------------------------------------------------------------ PromQL

FUNCTIONS = {
    # aggregations
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group",
    # functions
    "abs", "absent", "absent_over_time", "ceil", "changes", "clamp", "clamp_max",
    "clamp_min", "delta", "deriv", "exp", "floor", "histogram_quantile", "holt_winters",
    "idelta", "increase", "irate", "label_replace", "label_join", "ln", "log2", "log10",
    "predict_linear", "rate", "resets", "round", "scalar", "sort", "sort_desc", "sqrt",
    "time", "timestamp", "vector", "avg_over_time", "min_over_time", "max_over_time",
    "sum_over_time", "count_over_time", "last_over_time", "quantile_over_time",
    "present_over_time",
}
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = {"bool", "and", "or", "unless", "offset"}
TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<var>\$\{\w+\}|\$\w+)
  | (?P<duration>\d+(?:ms|[smhdwy]))
  | (?P<number>\d+(?:\.\d+)?(?:e[+-]?\d+)?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>=~|!~|==|!=|<=|>=|[-+*/%^<>=])
  | (?P<punct>[(){}\[\],:])
""", re.VERBOSE)
MATCH_OPS = {"=", "!=", "=~", "!~"}


class PromQLError(ValueError):
    pass


@dataclass
class Selector:
    metric: str
    labels: set[str] = field(default_factory=set)


def tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(expr):
        m = TOKEN.match(expr, pos)
        if m is None:
            raise PromQLError(f"unexpected {expr[pos:pos + 10]!r} at {pos} in {expr!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        if kind != "space":
            out.append((kind, m.group()))
    return out


def selectors(expr: str) -> list[Selector]:
    """The metric selectors of a PromQL expression; PromQLError when it does not parse:
    unbalanced brackets, an unknown function, a malformed label matcher or range."""
    toks = tokens(expr)
    depth: list[str] = []
    pairs = {")": "(", "}": "{", "]": "["}
    for kind, text in toks:
        if kind == "punct" and text in "({[":
            depth.append(text)
        elif kind == "punct" and text in ")}]" and (not depth or depth.pop() != pairs[text]):
            raise PromQLError(f"unbalanced {text!r} in {expr!r}")
    if depth:
        raise PromQLError(f"unclosed {depth[-1]!r} in {expr!r}")
    found: list[Selector] = []
    i = 0

    def at(k: int) -> tuple[str, str]:
        return toks[k] if k < len(toks) else ("end", "")

    def matchers(k: int, sel: Selector | None) -> int:
        """Label matchers from the '{' at k; the index after its '}'."""
        k += 1
        while at(k) != ("punct", "}"):
            (kind, name), (_, op), (vkind, _) = at(k), at(k + 1), at(k + 2)
            if kind != "ident" or op not in MATCH_OPS or vkind != "string":
                raise PromQLError(f"bad label matcher at {name!r} in {expr!r}")
            if sel is not None:
                sel.labels.add(name)
            k += 3
            if at(k) == ("punct", ","):
                k += 1
            elif at(k) != ("punct", "}"):
                raise PromQLError(f"expected ',' or '}}' after matcher {name!r} in {expr!r}")
        return k + 1

    while i < len(toks):
        kind, text = toks[i]
        if kind == "ident" and text in GROUPING:
            i += 1
            if at(i) == ("punct", "("):  # a label list
                while at(i) != ("punct", ")"):
                    i += 1
                i += 1
            continue
        if kind == "ident" and text in KEYWORDS:
            i += 1
            continue
        if kind == "ident" and text in FUNCTIONS and at(i + 1)[1] in GROUPING:
            i += 1  # an aggregation with its grouping first: sum by (x) (...)
            continue
        if kind == "ident" and at(i + 1) == ("punct", "("):
            if text not in FUNCTIONS:
                raise PromQLError(f"unknown function {text!r} in {expr!r}")
            i += 2
            continue
        if kind == "ident":
            sel = Selector(text)
            found.append(sel)
            i += 1
            if at(i) == ("punct", "{"):
                i = matchers(i, sel)
            continue
        if (kind, text) == ("punct", "{"):  # a selector by __name__ only: not used here
            raise PromQLError(f"selector without a metric name in {expr!r}")
        if (kind, text) == ("punct", "["):
            rng, close = at(i + 1), at(i + 2)
            if rng[0] not in ("duration", "var") or close[1] not in ("]", ":"):
                raise PromQLError(f"bad range in {expr!r}")
            i += 2
            continue
        i += 1
    if not found and "time()" not in expr:
        raise PromQLError(f"no metric in {expr!r}")
    return found


def test_the_parser_catches_mistakes() -> None:
    ok = selectors('sum by (node) (rate(a_total{node=~"$node", x!="y"}[5m])) / b')
    assert [(s.metric, s.labels) for s in ok] == [("a_total", {"node", "x"}), ("b", set())]
    for bad in ('sum(rate(a[5m])', 'rat(a[5m])', 'a{node="x"', 'a{node x}',
                'rate(a[five])', 'a{node="x" y="z"}', 'a # b'):
        with pytest.raises(PromQLError):
            selectors(bad)


# ------------------------------------------------------------------------------ exported


def _families() -> Iterator[Metric]:
    for obj in vars(operator_metrics).values():
        if isinstance(obj, MetricWrapperBase):
            for fam in obj.describe():
                labels = set(getattr(obj, "_labelnames", ()))
                fam.add_sample(fam.name, dict.fromkeys(labels, ""), 0)  # its label names
                yield fam
    # the operator's per-node families over a node that admitted a pod
    nodes = operator_metrics.NodeTopologyCollector()
    nodes.refresh([{"metadata": {"name": "n"}, "status": {
        "admitted": [{"policy": "single-numa-node", "source": "pod"}], "rejected": 1,
        "zones": [{"id": 0, "allocatable": {"cpu": 4}, "available": {"cpu": 3}}]}}])
    yield from nodes.collect()
    # the agent's collector over a node that decided a pod (every family has samples)
    machine = load_machine(REPO / "config" / "samples" / "machines" / "seed-figure1.yaml")
    st = NodeState("n", machine)
    st.decide({"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
               "spec": {"containers": [{"name": "c", "resources": {
                   "requests": {"cpu": "1", "memory": "1Gi"},
                   "limits": {"cpu": "1", "memory": "1Gi"}}}]}},
              given(Resolved("single-numa-node", "container")))
    yield from ManagerCollector(lambda: [st]).collect()
    # the scheduler extender's registry (its counter with a label value, as when it refused)
    ext = ExtenderMetrics()
    ext.refusals.labels(reason="TopologyAffinityError").inc()
    yield from ext.registry.collect()


def exported() -> dict[str, set[str]]:
    """Every series name numalign's registries export, with its label names."""
    out: dict[str, set[str]] = {}
    for fam in _families():
        labels = {k for s in fam.samples for k in s.labels} - {"le", "quantile"}
        for suffix in SUFFIXES[fam.type]:
            out.setdefault(fam.name + suffix, set()).update(labels)
    return out


# ------------------------------------------------------------------------------ files


def dashboard_exprs() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    out = []
    for panel in doc["panels"]:
        for t in panel.get("targets") or []:
            out.append((panel["title"], t["expr"]))
    for var in doc["templating"]["list"]:
        q = var.get("query")
        if isinstance(q, dict):
            m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", q["query"])
            assert m, f"variable {var['name']}: {q['query']!r}"
            out.append((f"variable {var['name']}", f'{m[1]}{{{m[2]}!=""}}'))
    return out


def rule_exprs() -> list[tuple[str, str]]:
    doc = yaml.safe_load(RULE.read_text())
    return [(r.get("alert") or r.get("record"), str(r["expr"]))
            for g in doc["spec"]["groups"] for r in g["rules"]]


def test_dashboard_and_rules_query_only_what_numalign_exports() -> None:
    names = exported()
    # the kubelet's manager metrics are among them (a sanity check of the collection)
    assert "numalign_topology_manager_admission_requests_total" in names
    assert "numalign_container_aligned_compute_resources_count" in names
    assert "numalign_redeploys_total" in names
    exprs = dashboard_exprs() + rule_exprs()
    assert len(exprs) > 20
    used: set[str] = set()
    for where, expr in exprs:
        for sel in selectors(expr):
            used.add(sel.metric)
            if sel.metric in names:
                missing = sel.labels - names[sel.metric]
                assert not missing, f"{where}: {sel.metric} has no label {missing}"
                continue
            raise AssertionError(f"{where}: {sel.metric} is not exported by numalign")
    # the dashboard covers what the issue asks for
    for name in ("numalign_topology_manager_admission_requests_total",
                 "numalign_topology_manager_admission_errors_total",
                 "numalign_topology_manager_admission_duration_seconds_bucket",
                 "numalign_redeploys_total", "numalign_cpu_manager_exclusive_cpu_allocation_count",
                 "numalign_node_free", "numalign_extender_filter_duration_seconds_bucket",
                 "numalign_extender_refusals_total", "numalign_extender_reservations"):
        assert name in used, name


def test_rules_have_the_alerts_on_call_needs() -> None:
    doc: Any = yaml.safe_load(RULE.read_text())
    rules = {r["alert"]: r for g in doc["spec"]["groups"] for r in g["rules"]}
    assert {"NumalignRejectionsRising", "NumalignAgentNotPublishing",
            "NumalignRedeploysGivingUp"} <= set(rules)
    for name, r in rules.items():
        assert r["labels"]["severity"] in ("critical", "warning", "info"), name
        assert r["annotations"]["summary"] and r["annotations"]["description"], name
