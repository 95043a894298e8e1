"""The JSON of ``k8s.io/kube-scheduler/extender/v1`` (its Go types carry no json tags,
so the fields are spelled as the Go fields): ``ExtenderArgs`` in, ``ExtenderFilterResult``
and ``HostPriorityList`` out. Pure: bytes and verdicts in, JSON out.

``ExtenderArgs``: ``{"Pod": {...}, "Nodes": {"items": [...]}|null, "NodeNames":
[...]|null}``; with ``nodeCacheCapable: true`` the scheduler sends ``NodeNames`` only.
``ExtenderFilterResult``: ``{"Nodes", "NodeNames", "FailedNodes": {name: reason},
"FailedAndUnresolvableNodes": {name: reason}, "Error"}``. ``HostPriorityList``:
``[{"Host": name, "Score": 0..10}]``. The bind verb: ``ExtenderBindingArgs``
``{"PodName", "PodNamespace", "PodUID", "Node"}`` in, ``ExtenderBindingResult``
``{"Error"}`` out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .decide import MIN_SCORE, Verdict

JSON = dict[str, Any]

MAX_NODES = 20_000  # nodes in one request (a Kubernetes cluster holds at most 5,000)
MAX_NAME = 253  # a node name is a DNS subdomain


class ArgsError(ValueError):
    """Malformed ExtenderArgs; the message names the field and the problem."""


@dataclass(frozen=True)
class ExtenderArgs:
    pod: Mapping[str, Any]
    node_names: list[str]
    nodes: list[Mapping[str, Any]] | None  # the NodeList items, when sent (not cache-capable)

    @property
    def pod_name(self) -> str:
        meta = self.pod.get("metadata") or {}
        return f"{meta.get('namespace') or 'default'}/{meta.get('name') or '?'}"


def _object(body: bytes | str, what: str) -> Mapping[str, Any]:
    """The body as a JSON object; ArgsError naming ``what`` when it is not one."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise ArgsError(f"{what}: the body is not JSON: {e}") from None
    if not isinstance(doc, Mapping):
        raise ArgsError(f"{what}: must be a JSON object, got {type(doc).__name__}")
    return doc


def parse_args(body: bytes | str) -> ExtenderArgs:
    """Decode and check an ``ExtenderArgs`` body. Raises ArgsError."""
    doc = _object(body, "ExtenderArgs")
    pod = doc.get("Pod")
    if not isinstance(pod, Mapping):
        raise ArgsError("ExtenderArgs.Pod: required, a Pod object")
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise ArgsError("ExtenderArgs.Pod.metadata.name: required, a string")
    if not isinstance(pod.get("spec"), Mapping):
        raise ArgsError("ExtenderArgs.Pod.spec: required, an object")
    raw_names = doc.get("NodeNames")
    raw_nodes = doc.get("Nodes")
    nodes: list[Mapping[str, Any]] | None = None
    if raw_names is not None:
        names = _names(raw_names)
    elif raw_nodes is not None:
        items = raw_nodes.get("items") if isinstance(raw_nodes, Mapping) else None
        if not isinstance(items, list):
            raise ArgsError("ExtenderArgs.Nodes.items: must be a list of Node objects")
        if len(items) > MAX_NODES:
            raise ArgsError(f"ExtenderArgs.Nodes.items: {len(items)} nodes, at most "
                            f"{MAX_NODES}")
        nodes = []
        for i, n in enumerate(items):
            name = n.get("metadata", {}).get("name") if isinstance(n, Mapping) else None
            if not isinstance(name, str) or not name or len(name) > MAX_NAME:
                raise ArgsError(f"ExtenderArgs.Nodes.items[{i}].metadata.name: required, "
                                f"a node name of at most {MAX_NAME} characters")
            nodes.append(n)
        names = [str(n["metadata"]["name"]) for n in nodes]
    else:
        raise ArgsError("ExtenderArgs: needs NodeNames (nodeCacheCapable: true) or Nodes")
    return ExtenderArgs(pod, names, nodes)


def _names(raw: Any) -> list[str]:
    if not isinstance(raw, list):
        raise ArgsError("ExtenderArgs.NodeNames: must be a list of node names")
    if len(raw) > MAX_NODES:
        raise ArgsError(f"ExtenderArgs.NodeNames: {len(raw)} nodes, at most {MAX_NODES}")
    for i, n in enumerate(raw):
        if not isinstance(n, str) or not n or len(n) > MAX_NAME:
            raise ArgsError(f"ExtenderArgs.NodeNames[{i}]: must be a node name of at most "
                            f"{MAX_NAME} characters")
    return list(raw)


@dataclass(frozen=True)
class BindingArgs:
    """``ExtenderBindingArgs``: bind the pod ``namespace/name`` (uid ``uid``) to ``node``."""

    name: str
    namespace: str
    uid: str
    node: str

    @property
    def pod_name(self) -> str:
        return f"{self.namespace}/{self.name}"

    def binding(self) -> JSON:
        """The ``v1`` Binding object to create (``pods/<name>/binding``); the uid makes
        the API server refuse it for another pod of the same name."""
        return {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": self.name, "namespace": self.namespace, "uid": self.uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": self.node}}


def parse_binding(body: bytes | str) -> BindingArgs:
    """Decode and check an ``ExtenderBindingArgs`` body. Raises ArgsError."""
    doc = _object(body, "ExtenderBindingArgs")
    out = []
    for field_, pattern, what in _BINDING_FIELDS:
        value = doc.get(field_)
        if not isinstance(value, str) or not pattern.fullmatch(value):
            raise ArgsError(f"ExtenderBindingArgs.{field_}: required, {what}; got "
                            f"{json.dumps(value)[:80]}")
        out.append(value)
    return BindingArgs(*out)


_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_BINDING_FIELDS = (
    ("PodName", _SUBDOMAIN, "a pod name (a DNS subdomain)"),
    ("PodNamespace", re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"),
     "a namespace name (a DNS label)"),
    ("PodUID", re.compile(r"[A-Za-z0-9][-A-Za-z0-9]{0,127}"), "the pod's uid"),
    ("Node", _SUBDOMAIN, "a node name (a DNS subdomain)"),
)


def binding_result(error: str = "") -> JSON:
    """``ExtenderBindingResult``: empty ``Error`` when bound."""
    return {"Error": error}


def filter_result(args: ExtenderArgs, verdicts: Sequence[Verdict]) -> JSON:
    """``ExtenderFilterResult``: the nodes that fit (as they came: names, or the Node
    objects), the refused ones with the kubelet's reason."""
    fits = {v.node for v in verdicts if v.fits}
    failed = {v.node: v.failure for v in verdicts if not v.fits and v.resolvable}
    unresolvable = {v.node: v.failure for v in verdicts if not v.fits and not v.resolvable}
    out: JSON = {"FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable,
                 "Error": ""}
    if args.nodes is not None:
        kept = [n for n in args.nodes if n["metadata"]["name"] in fits]
        out.update({"Nodes": {"apiVersion": "v1", "kind": "NodeList", "metadata": {},
                              "items": kept}, "NodeNames": None})
    else:
        out.update({"Nodes": None, "NodeNames": [n for n in args.node_names if n in fits]})
    return out


def priority_list(verdicts: Sequence[Verdict]) -> list[JSON]:
    """``HostPriorityList``: each node's score (0 for a node that would refuse)."""
    return [{"Host": v.node, "Score": v.score if v.fits else MIN_SCORE} for v in verdicts]


def error_result(message: str) -> JSON:
    """An ``ExtenderFilterResult`` carrying only an error (the scheduler then ignores
    this extender for the pod: it is ignorable)."""
    return {"Nodes": None, "NodeNames": None, "FailedNodes": {},
            "FailedAndUnresolvableNodes": {}, "Error": message}
