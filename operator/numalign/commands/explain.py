"""``numalign explain``: why a pod got (or did not get) its NUMA affinity.

Offline, on a machine file::

    numalign explain --machine FILE --pod POD.yaml [--policy P] [--scope S]
                     [--option K=V]... [--allocated ALLOC.json] [-o text|json]

``--allocated`` holds what the machine already gives to other pods: a NodeTopology
(object or status), a list of its ``status.admitted`` entries, or ``numalign admit``
output (JSON lines). ``--policy`` defaults to the pod's ``numalign.io/policy`` annotation
(and ``--scope`` to ``numalign.io/scope``, else container); with neither, the command
asks for ``--policy``.

Live, on a cluster::

    numalign explain POD [-n NS] [--kubeconfig K] [--context C] [-o text|json]

reads the pod (its node, ``numalign.io/resolved`` and ``numalign.io/allocation``), the
node's NodeTopology (machine facts from status zones, devices and distances; the other
pods' allocations from ``status.admitted``) and replays the decision. ``--policy``,
``--scope`` and ``--option`` replace the resolved policy ("what if"). A pod not bound
yet (Pending): the scheduler extender's verdict on every node with a NodeTopology (which
refuse it and why) and the scheduler's last FailedScheduling message.

Errors are one line on stderr saying what to do next, exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

import yaml

from numalign.api.allocation import parse_admitted
from numalign.api.effective import NodeKind, NodePolicy, Origin, effective_policy
from numalign.api.errors import WireError
from numalign.api.names import ANN_ALLOCATION, ANN_POLICY, ANN_RESOLVED, ANN_SCOPE
from numalign.api.nodestatus import (
    held_from_document,
    held_from_status,
    ledger_from_held,
    machine_from_status,
)
from numalign.api.reads import NodeTopologyRead
from numalign.commands import explain_claims as claims
from numalign.commands import explain_pending as pending
from numalign.commands import explain_realnode as realnode
from numalign.commands.explain_text import render_text
from numalign.topology.errors import TopologyError
from numalign.topology.explain import Explanation, explain_pod
from numalign.topology.ledger import Ledger
from numalign.topology.machine import Machine, load_machine
from numalign.topology.pod import pod_from_dict
from numalign.topology.policies import check_policy
from numalign.topology.policyconfig import SCOPE_CONTAINER, check_scope, parse_policy_options
from numalign.topology.text import printable

PROG = "numalign explain"


class ExplainError(Exception):
    """One line for the user: what is wrong and what to do next."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ExplainError(f"{message} (see '{PROG} --help')")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", metavar="POD", help="live mode: the pod to explain")
    p.add_argument("-n", "--namespace", default=None, help="live mode: the pod's namespace "
                   "(default: the kubeconfig context's, else default)")
    p.add_argument("--kubeconfig", help="live mode: kubeconfig (default $KUBECONFIG, "
                                        "~/.kube/config, else in-cluster)")
    p.add_argument("--context", help="live mode: kubeconfig context")
    p.add_argument("--machine", metavar="FILE", help="offline mode: machine file")
    p.add_argument("--pod", metavar="POD.yaml", help="offline mode: the pod manifest")
    p.add_argument("--allocated", metavar="ALLOC.json",
                   help="offline mode: allocations already on the machine")
    p.add_argument("--policy", help="Topology Manager policy (offline: default the pod's "
                                    "numalign.io/policy; live: replaces the resolved one)")
    p.add_argument("--scope", help="container or pod")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="policy option, as the kubelet spells it; repeatable")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    return p


# ---------------------------------------------------------------- shared


def _options(raw: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in raw:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise ExplainError(f"--option: {item!r} is not KEY=VALUE, e.g. "
                               "--option prefer-closest-numa-nodes=true")
        out[k] = v
    return out


def _read_text(path: str, what: str) -> str:
    try:
        return sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as e:
        raise ExplainError(f"{path}: cannot read the {what}: {e.strerror or e}") from None


def _load_yaml(path: str, what: str) -> list[Any]:
    text = _read_text(path, what)
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ExplainError(f"{path}: the {what} is not valid YAML or JSON{where}: "
                           f"{getattr(e, 'problem', None) or e}") from None


def _load_allocated(path: str) -> Any:
    """A JSON (or YAML) document, or JSON lines (``numalign admit`` output)."""
    text = _read_text(path, "allocations")
    try:
        return json.loads(text)
    except ValueError:
        pass
    lines = [ln for ln in text.splitlines() if ln.strip()]
    try:
        return [json.loads(ln) for ln in lines]
    except ValueError:
        pass
    docs = _load_yaml(path, "allocations")
    return docs[0] if len(docs) == 1 else docs


def _print(text: str) -> None:
    """Output from cluster data: nothing reaches the terminal raw (the text views escape
    each value already; JSON escapes its strings)."""
    print(printable(text, keep_newlines=True))


def _emit(e: Explanation, output: str) -> None:
    if output == "json":
        _print(json.dumps(e.to_json(), indent=2))
    else:
        _print(render_text(e))


# ---------------------------------------------------------------- offline


def _offline(args: argparse.Namespace) -> Explanation:
    if args.machine is None or args.pod is None:
        raise ExplainError("offline mode needs both --machine FILE and --pod POD.yaml "
                           "(or give a pod name for live mode)")
    try:
        machine = load_machine(args.machine)
    except TopologyError as e:
        raise ExplainError(f"{e} (fix the machine file)") from None
    docs = _load_yaml(args.pod, "pod")
    if len(docs) != 1:
        raise ExplainError(f"{args.pod}: holds {len(docs)} documents; give exactly one pod")
    try:
        pod = pod_from_dict(docs[0], source=args.pod)
    except TopologyError as e:
        raise ExplainError(f"{args.pod}: {e}") from None
    policy = args.policy or pod.annotations.get(ANN_POLICY)
    if policy is None:
        raise ExplainError("no policy: give --policy (none, best-effort, restricted, "
                           "single-numa-node) or annotate the pod with numalign.io/policy")
    scope = args.scope or pod.annotations.get(ANN_SCOPE) or SCOPE_CONTAINER
    source = "--policy" if args.policy else f"pod annotation {ANN_POLICY}"
    try:
        check_policy(policy, "--policy" if args.policy else ANN_POLICY)
        check_scope(scope, "--scope" if args.scope else ANN_SCOPE)
        options = parse_policy_options(_options(args.option), "--option")
    except TopologyError as e:
        raise ExplainError(str(e)) from None
    ledger = Ledger(machine)
    notes: list[str] = []
    if args.allocated:
        try:
            held = held_from_document(_load_allocated(args.allocated), args.allocated)
        except TopologyError as e:
            raise ExplainError(f"{e} (fix the allocations file)") from None
        ledger, notes = ledger_from_held(machine, held, (pod.uid, pod.namespace, pod.name))
    try:
        ex = explain_pod(machine, pod, policy, scope, options, ledger, source=source)
    except TopologyError as err:
        raise ExplainError(f"{args.pod}: {err}") from None
    ex.notes[:0] = notes
    return ex


# ---------------------------------------------------------------- live


class _Unbound(Exception):
    def __init__(self, pod: dict[str, Any]) -> None:
        super().__init__("not bound")
        self.pod = pod


def _read(client: LiveClient, args: argparse.Namespace
          ) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """The pod, its node and the node's NodeTopology (errors name what is missing;
    _Unbound for a pod not bound yet)."""
    ns = args.namespace or client.namespace
    name = str(args.name)
    pod = client.get_pod(ns, name)
    if pod is None:
        raise ExplainError(f"pod {ns}/{name} not found: check the name and the namespace "
                           "(-n NAMESPACE)")
    node = (pod.get("spec") or {}).get("nodeName")
    if not node:
        raise _Unbound(pod)
    nt = client.get_nodetopology(str(node))
    if nt is None:
        raise ExplainError(f"node {node} has no NodeTopology: is the numalign agent running "
                           "there? (kubectl get nodetopology)")
    return pod, str(node), nt


def _machine(nt: Mapping[str, Any], node: str) -> Machine:
    try:
        return machine_from_status(nt.get("status") or {}, name=node)
    except TopologyError as e:
        raise ExplainError(f"NodeTopology {node}: {e}; wait for the agent to publish, or "
                           "check its logs") from None


def _pending(client: LiveClient, pod: dict[str, Any]) -> dict[str, Any]:
    """A pod not bound yet: the extender's verdict on every node, the scheduler's word."""
    if not isinstance(pod.get("spec"), Mapping):
        raise ExplainError("the pod has no spec")
    meta = pod.get("metadata") or {}
    ns, name = str(meta.get("namespace") or "default"), str(meta.get("name"))
    from numalign.api.kube import NT_BASE

    nts = client.list(NT_BASE, "NodeTopologies")
    bound = client.list("/api/v1/pods", "pods", {"fieldSelector": "spec.nodeName!="})
    events = client.list(f"/api/v1/namespaces/{ns}/events", "events",
                         {"fieldSelector": f"involvedObject.name={name}"})
    return pending.pending_json(name, ns, pending.pending_verdicts(pod, nts, bound),
                                pending.last_failed_scheduling(events))


def _live(args: argparse.Namespace) -> Explanation | dict[str, Any]:
    if args.machine or args.pod or args.allocated:
        raise ExplainError("give either a pod name (live mode) or --machine and --pod "
                           "(offline mode), not both")
    client = LiveClient(args.kubeconfig, args.context)
    try:
        pod, node, nt = _read(client, args)
        machine = _machine(nt, str(node))
        dra = claims.pod_devices(lambda p, w: client.read(p, w), pod, nt, machine)
    except _Unbound as u:
        return _pending(client, u.pod)
    finally:
        client.close()
    ns = args.namespace or client.namespace
    name = str(args.name)
    meta = pod.get("metadata") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    read = NodeTopologyRead.of(nt)
    uid = str(meta.get("uid") or "")
    notes = ["replayed against the node's allocations now (other pods as published in "
             "NodeTopology status.admitted), which may differ from those at admission"]
    entries = read.status.admitted_entries
    mine = next((x for x in entries if uid and x.get("uid") == uid), None)
    settings = read.status.kubelet_settings
    if settings is not None and mine is None:  # the kubelet's pods, named as it lists them
        mine = next((x for x in entries if not x.get("uid") and x.get("pod") == name
                     and x.get("namespace") == ns), None)
    held, more = held_from_status(read.status, str(node))
    notes += more
    ledger, more = ledger_from_held(machine, held, (uid, ns, name))
    notes += more

    # The policy the node applies (effective_policy: its kubelet's on a kubelet-managed
    # node, else the operator's resolution, else the default the node recorded admitting
    # the pod with, else its default now); --policy/--scope/--option replace it.
    got, unreadable = None, None
    if mine is not None:
        try:
            got = parse_admitted(mine, f"NodeTopology {node} status.admitted entry").resolved
        except WireError as e:
            unreadable = f"{e}; using the node default"
    eff = effective_policy(pod, NodePolicy.from_nodetopology(read), recorded=got)
    policy, scope, options, source = eff.name, eff.scope, dict(eff.options.given), eff.source
    ann = annotations.get(ANN_RESOLVED)
    if eff.by_kubelet:
        source = realnode.SOURCE
        if ann is not None:
            notes.append(f"node {node} is a real node: its kubelet applies its own policy "
                         f"({policy}, scope {scope}), not the pod's {ANN_RESOLVED}")
    elif eff.origin is not Origin.POD:
        if eff.problem is not None:
            notes.append(f"{eff.problem}; using the node default")
        if unreadable is not None:
            notes.append(unreadable)
        if eff.origin is Origin.RECORDED and got is not None:
            source = str((mine or {}).get("source") or "NodeTopology status.admitted")
            notes += [f"{p}; replayed with the default" for p in got.problems]
        elif ann is not None and eff.problem is None:
            notes.append(f"{ANN_RESOLVED} defers to the node's default (the pod was not "
                         "bound when the operator resolved it): using the node default")
        elif eff.problem is None:
            notes.append(f"the pod has no usable {ANN_RESOLVED} annotation (is the operator "
                         "running?): using the node default")
    if args.policy or args.scope or args.option:
        policy = args.policy or policy
        scope = args.scope or scope
        options.update(_options(args.option))
        source = "command line (what if)"
    try:
        policy = check_policy(policy or "none", "--policy")
        check_scope(scope or SCOPE_CONTAINER, "--scope")
        opts = parse_policy_options(options, "--option")
        model = pod_from_dict(pod, source=f"pod {ns}/{name}")
        ex = explain_pod(machine, model, policy, scope or SCOPE_CONTAINER, opts, ledger,
                        source=source, providers=claims.kinds(dra))
    except TopologyError as err:
        raise ExplainError(str(err)) from None
    ex.node = str(node)
    if dra is not None:
        ex.claims = claims.claims_json(dra, ex, pod)
    recorded = annotations.get(ANN_ALLOCATION)
    if recorded is not None:
        try:
            ex.recorded = json.loads(recorded)
        except ValueError:
            notes.append(f"the pod's {ANN_ALLOCATION} annotation is not valid JSON")
    if isinstance(ex.recorded, Mapping):
        rec_numa = sorted(int(n) for n in ex.recorded.get("numaNodes") or [])
        if ex.admit and rec_numa and rec_numa != ex.allocation.get("numaNodes"):
            notes.append(f"the agent recorded NUMA nodes {rec_numa}; the replay now gives "
                         f"{ex.allocation.get('numaNodes')} (the node's state changed since)")
    phase = (pod.get("status") or {}).get("phase")
    reason = (pod.get("status") or {}).get("reason")
    if phase == "Failed" and reason:
        notes.append(f"the pod is Failed with reason {reason}")
    if settings is not None and eff.node_kind is NodeKind.KUBELET_MANAGED:
        ex.kubelet = realnode.kubelet_decision(pod, mine)
        if ex.source == realnode.SOURCE:
            notes += realnode.compare(ex, ex.kubelet, machine, settings)
        else:
            notes.append("what if: the replay uses a policy other than the kubelet's, so it "
                         "is not compared with the kubelet's decision")
    ex.notes[:0] = notes
    return ex


class LiveClient:
    """The reads live mode (and ``kubectl numalign``) makes, through the one client
    (errors -> ExplainError, one line)."""

    def __init__(self, kubeconfig: str | None, context: str | None,
                 user_agent: str = "numalign-explain") -> None:
        from numalign.api.kube import SyncKube, load_config

        try:
            config = load_config(kubeconfig, context)
        except Exception as e:  # ConfigError, missing file, bad YAML ...
            raise ExplainError(f"cannot load the Kubernetes credentials: {e}; give "
                               "--kubeconfig (e.g. from 'numalign dev kubeconfig')") from None
        self.namespace = config.namespace or "default"
        self.host = config.host
        self.kube = SyncKube(config, max_connections=2, user_agent=user_agent)

    def _get(self, path: str, what: str) -> dict[str, Any] | None:
        return self.read(path, what)

    def read(self, path: str, what: str, params: Mapping[str, str] | None = None
             ) -> dict[str, Any] | None:
        """GET ``path`` (``what`` names it in errors); None when it does not exist."""
        from numalign.api.kube import ApiError

        try:
            return self.kube.request("GET", path, params=params, timeout=30)
        except ApiError as e:
            if e.status == 404:
                return None
            if e.status in (401, 403):
                raise ExplainError(f"not allowed to read {what} ({e.status} {e.reason}): "
                                   "use credentials that may get pods, events and "
                                   "nodetopologies") from None
            raise ExplainError(f"reading {what} failed: {e.status} {e.reason}") from None
        except Exception as e:  # connection refused, DNS, TLS ...
            raise ExplainError(f"cannot reach the API server at {self.host}: "
                               f"{type(e).__name__}; is the cluster up? check --kubeconfig"
                               ) from None

    def list(self, path: str, what: str, params: Mapping[str, str] | None = None
             ) -> list[dict[str, Any]]:
        """Every item of the list at ``path`` (none when the API is not there)."""
        items: list[dict[str, Any]] = []
        p = {**(params or {}), "limit": "500"}
        while True:
            doc = self.read(path, what, p)
            if doc is None:
                return items
            items += [i for i in doc.get("items") or [] if isinstance(i, dict)]
            cont = (doc.get("metadata") or {}).get("continue")
            if not cont:
                return items
            p["continue"] = str(cont)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        from numalign.api.kube import pod_path

        return self._get(pod_path(namespace, name), f"pod {namespace}/{name}")

    def get_nodetopology(self, name: str) -> dict[str, Any] | None:
        from numalign.api.kube import nt_path

        return self._get(nt_path(name), f"NodeTopology {name}")

    def close(self) -> None:
        self.kube.close()


def explain_live(argv: list[str]) -> Explanation | dict[str, Any]:
    """Live mode for another command (``kubectl numalign explain``): ``argv`` as this
    command takes it (POD, -n, --kubeconfig, --context, --policy ...); ExplainError. A pod
    not bound yet gives the extender's verdicts per node (a JSON document)."""
    return _live(_parser().parse_args(argv))


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(args_list)
        e = _live(args) if args.name is not None else _offline(args)
    except ExplainError as err:
        print(f"{PROG}: {printable(err)}", file=sys.stderr)
        return 1
    if isinstance(e, dict):  # a pod not bound yet
        _print(json.dumps(e, indent=2) if args.output == "json" else pending.render_pending(e))
        return 0
    _emit(e, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
