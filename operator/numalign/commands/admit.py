"""``numalign admit --machine FILE --policy P [--scope S] [--option K=V]... POD.yaml...``

Admits the pods in order (files in order, documents of a file in order; a ``kind: List``
document holds several) against one evolving allocation state, and writes one JSON line
per pod::

    {"pod": name, "admit": bool, "reason": str | null, "hint": {...},
     "containers": {NAME: {"numaNodes": [...], "cpus": [...], "memory": {"ZONE": bytes},
                           "memoryNumaNodes": [...], "devices": {RES: [ids]}}},
     "gpus": {REQUEST: [device ids]}}

``memory`` is the bytes a container took per NUMA node; ``memoryNumaNodes`` the nodes its
memory may use (the memory manager's block: a whole group for a block spanning nodes,
kept for a container that reuses its init container's memory and took no new bytes).
A rejected pod has a kubelet reason: ``TopologyAffinityError``,
``UnexpectedAdmissionError``, or from the resource-fit check that follows the Topology
Manager ``OutOfcpu``, ``OutOfmemory``, ``OutOf<resource>``. A pod asking for more than the
machine has is rejected like any other (one line).

Bad input gives one line ``numalign admit: FILE: field: problem`` on stderr; the other
pods are still admitted and the exit status is 1 at the end. Bad options exit at once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from numalign.topology.admit import admit_pod
from numalign.topology.errors import TopologyError
from numalign.topology.ledger import Ledger
from numalign.topology.machine import Machine, load_machine
from numalign.topology.pod import pod_from_dict
from numalign.topology.policies import check_policy
from numalign.topology.policyconfig import (
    SCOPE_CONTAINER,
    PolicyOptions,
    check_scope,
    parse_policy_options,
)
from numalign.topology.text import printable

PROG = "numalign admit"
USAGE = (f"usage: {PROG} --machine FILE --policy POLICY [--scope container|pod] "
         "[--option KEY=VALUE]... POD.yaml...")


class _Usage(Exception):
    pass


def _parse(argv: list[str]) -> tuple[str, str, str, dict[str, str], list[str]]:
    machine = policy = None
    scope = SCOPE_CONTAINER
    options: dict[str, str] = {}
    files: list[str] = []
    it = iter(argv)
    for arg in it:
        name, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        if name in ("--machine", "--policy", "--scope", "--option"):
            value = inline if eq else next(it, None)
            if value is None:
                raise _Usage(f"{name}: needs a value")
            if name == "--machine":
                machine = value
            elif name == "--policy":
                policy = value
            elif name == "--scope":
                scope = value
            else:
                k, sep, v = value.partition("=")
                if not sep or not k:
                    raise _Usage(f"--option: {value!r} is not KEY=VALUE")
                options[k] = v
        elif arg == "--":
            files.extend(it)
        elif arg.startswith("-") and arg != "-":
            raise _Usage(f"{arg}: unknown option")
        else:
            files.append(arg)
    if machine is None:
        raise _Usage("--machine: is required")
    if policy is None:
        raise _Usage("--policy: is required")
    if not files:
        raise _Usage("no POD.yaml given")
    return machine, policy, scope, options, files


def _documents(path: str) -> Iterator[tuple[int, Any]]:
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    for i, doc in enumerate(yaml.safe_load_all(text)):
        if doc is None:
            continue
        if isinstance(doc, dict) and doc.get("kind") == "List":
            items = doc.get("items")
            if not isinstance(items, list):
                raise TopologyError(f"documents[{i}].items", "a List must hold a list of items")
            for item in items:
                yield i, item
        else:
            yield i, doc


def _err(msg: str) -> None:
    print(f"{PROG}: {printable(msg)}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0
    try:
        machine_path, policy, scope, raw_options, files = _parse(args)
    except _Usage as e:
        _err(f"{e}\n{USAGE}")
        return 1
    try:
        check_policy(policy, "--policy")
        check_scope(scope, "--scope")
        options: PolicyOptions = parse_policy_options(raw_options, "--option")
        machine: Machine = load_machine(machine_path)
    except TopologyError as e:
        _err(str(e))
        return 1
    ledger = Ledger(machine)
    status = 0
    for path in files:
        try:
            docs = list(_documents(path))
        except OSError as e:
            _err(f"{path}: cannot read: {e.strerror or e}")
            status = 1
            continue
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            _err(f"{path}: is not valid YAML or JSON{where}: {getattr(e, 'problem', None) or e}")
            status = 1
            continue
        except TopologyError as e:
            _err(f"{path}: {e}")
            status = 1
            continue
        multi = len({i for i, _ in docs}) > 1
        for i, doc in docs:
            src = f"{path}: document {i + 1}" if multi else path
            try:
                pod = pod_from_dict(doc)
                result = admit_pod(machine, ledger, pod, policy, scope, options)
            except TopologyError as e:
                _err(f"{src}: {e}")
                status = 1
                continue
            print(json.dumps(result.to_json()), flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
