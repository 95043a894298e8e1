"""``kubectl numalign``: the kubectl plugin (the ``kubectl-numalign`` program installed with
the package; kubectl runs it for ``kubectl numalign ...`` when it is on PATH)::

    kubectl numalign nodes [NODE...] [-o wide|json|yaml]
    kubectl numalign why [POD] [-n NS | -A] [-o json|yaml]
    kubectl numalign explain POD [-n NS] [--policy P --scope S --option K=V] [-o json|yaml]

``nodes``: per node and NUMA zone, free/total CPUs, memory and devices, and the node's
policy (its NodeTopology). ``why POD``: what numalign knows about a Pending or Failed
pod (policy, rejection, redeploy record, scheduler messages, nodes that cannot fit it);
without POD, the Pending and Failed pods of the namespace (-A: of all). ``explain POD``:
``numalign explain``'s replay of the node's decision.

kubectl's flags that matter are honoured after the subcommand or before it:
``--kubeconfig``, ``--context``, ``-n/--namespace``, ``-A/--all-namespaces`` and
``-o/--output``. (kubectl does not hand a plugin the flags given before the plugin's
name: write ``kubectl numalign why -n NS POD``, not ``kubectl -n NS numalign why POD``.)
Errors are one line on stderr, exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, NoReturn

import yaml

from numalign.api.kube import NT_BASE, q
from numalign.commands import kubectl_nodes, kubectl_why
from numalign.commands.explain import ExplainError, LiveClient, explain_live
from numalign.commands.explain_pending import render_pending
from numalign.commands.explain_text import render_text
from numalign.controller.cache import STATE_CONFIGMAP
from numalign.topology.text import printable

PROG = "kubectl numalign"
OUTPUTS = ("text", "wide", "json", "yaml")


class PluginError(ExplainError):
    """One line for the user: what is wrong and what to do next."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise PluginError(f"{message} (see '{PROG} --help')")


def _global_flags(p: argparse.ArgumentParser, suppress: bool) -> None:
    """kubectl's flags; on the subcommands with SUPPRESS defaults, so that a flag given
    before the subcommand is not reset by the subcommand's parser."""
    d: Any = argparse.SUPPRESS if suppress else None
    p.add_argument("--kubeconfig", default=d, help="kubeconfig file (default: $KUBECONFIG, "
                   "~/.kube/config, else in-cluster)")
    p.add_argument("--context", default=d, help="kubeconfig context")
    p.add_argument("-n", "--namespace", default=d,
                   help="namespace (default: the context's, else default)")
    p.add_argument("-A", "--all-namespaces", action="store_true",
                   default=argparse.SUPPRESS if suppress else False,
                   help="why: every namespace")
    p.add_argument("-o", "--output", choices=OUTPUTS, default=argparse.SUPPRESS
                   if suppress else "text", help="text (default), wide, json or yaml")


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    _global_flags(p, suppress=False)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    nodes = sub.add_parser("nodes", help="free CPUs, memory and devices per NUMA zone")
    nodes.add_argument("nodes", nargs="*", metavar="NODE", help="only these nodes")
    why = sub.add_parser("why", help="what numalign knows about a Pending or Failed pod")
    why.add_argument("pod", nargs="?", metavar="POD",
                     help="the pod (default: list the namespace's Pending and Failed pods)")
    explain = sub.add_parser("explain", help="replay the node's decision for a pod")
    explain.add_argument("pod", metavar="POD")
    explain.add_argument("--policy", help="what if: this policy instead of the resolved one")
    explain.add_argument("--scope", help="what if: container or pod")
    explain.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                         help="what if: a policy option, as the kubelet spells it")
    for s in (nodes, why, explain):
        _global_flags(s, suppress=True)
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    args = parser().parse_args(argv)
    if args.all_namespaces and args.command == "explain":
        raise PluginError("explain takes one pod: give -n NAMESPACE, not -A")
    if args.all_namespaces and args.command == "why" and args.pod:
        raise PluginError("why POD: give -n NAMESPACE, not -A (-A lists every stuck pod)")
    return args


def _dump(doc: Any, output: str) -> str:
    if output == "yaml":
        return yaml.safe_dump(doc, sort_keys=False).rstrip()
    return json.dumps(doc, indent=2)


def _table(rows: list[list[str]], head: list[str]) -> str:
    lines = [head, *([printable(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in lines)


# ---------------------------------------------------------------- subcommands


def cmd_nodes(client: LiveClient, args: argparse.Namespace) -> str:
    nts = client.list(NT_BASE, "NodeTopologies")
    rows = kubectl_nodes.nodes_report(nts, args.nodes)
    missing = sorted(set(args.nodes) - {r["name"] for r in rows})
    if missing:
        raise PluginError(f"no NodeTopology for node {', '.join(missing)}: is the numalign "
                          "agent running there? (kubectl get nodetopology)")
    if args.output in ("json", "yaml"):
        return _dump({"nodes": rows}, args.output)
    return kubectl_nodes.render_nodes(rows, wide=args.output == "wide")


def cmd_why(client: LiveClient, args: argparse.Namespace) -> str:
    ns = args.namespace or client.namespace
    if not args.pod:
        path = "/api/v1/pods" if args.all_namespaces else f"/api/v1/namespaces/{q(ns)}/pods"
        pods = [p for p in client.list(path, "pods") if kubectl_why.stuck(p)]
        rows = sorted(kubectl_why.summary_row(p) for p in pods)
        if args.output in ("json", "yaml"):
            keys = ("namespace", "pod", "phase", "reason", "node")
            return _dump({"pods": [dict(zip(keys, r, strict=True)) for r in rows]},
                         args.output)
        if not rows:
            where = "any namespace" if args.all_namespaces else f"namespace {ns}"
            return f"No Pending or Failed pods in {where}"
        return _table(rows, ["NAMESPACE", "POD", "PHASE", "REASON", "NODE"])
    pod = client.get_pod(ns, args.pod)
    if pod is None:
        raise PluginError(f"pod {ns}/{args.pod} not found: check the name and the namespace "
                          "(-n NAMESPACE)")
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    selector = f"involvedObject.name={args.pod}" + (f",involvedObject.uid={uid}" if uid else "")
    events = client.list(f"/api/v1/namespaces/{q(ns)}/events", "events",
                         {"fieldSelector": selector})
    nts = client.list(NT_BASE, "NodeTopologies")
    cm = client.read(f"/api/v1/namespaces/{q(ns)}/configmaps/"
                     f"{q(STATE_CONFIGMAP)}", "the redeploy records")
    report = kubectl_why.why_report(pod, events, nts, cm)
    if args.output in ("json", "yaml"):
        return _dump(report, args.output)
    return kubectl_why.render_why(report)


def cmd_explain(args: argparse.Namespace) -> str:
    argv = [args.pod]
    for flag, value in (("-n", args.namespace), ("--kubeconfig", args.kubeconfig),
                        ("--context", args.context), ("--policy", args.policy),
                        ("--scope", args.scope)):
        if value:
            argv += [flag, value]
    for opt in args.option:
        argv += ["--option", opt]
    ex = explain_live(argv)
    doc = ex if isinstance(ex, dict) else ex.to_json()
    if args.output in ("json", "yaml"):
        return _dump(doc, args.output)
    return render_pending(ex) if isinstance(ex, dict) else render_text(ex)


def run(args: argparse.Namespace) -> str:
    if args.command == "explain":
        return cmd_explain(args)
    client = LiveClient(args.kubeconfig, args.context, user_agent="kubectl-numalign")
    try:
        if args.command == "nodes":
            return cmd_nodes(client, args)
        return cmd_why(client, args)
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(list(sys.argv[1:] if argv is None else argv))
        out = run(args)
    except ExplainError as err:
        print(f"{PROG}: {printable(err)}", file=sys.stderr)
        return 1
    # Whatever came from the cluster, escaped once more: nothing reaches the terminal raw
    # (the views escape each value already; JSON and YAML escape their strings).
    print(printable(out, keep_newlines=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
