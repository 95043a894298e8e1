"""``numalign merge``: the Topology Manager merge over JSON lines.

Each non-blank input line is one decision::

    {"policy": "best-effort", "options": {"prefer-closest-numa-nodes": "true"},
     "numaNodes": [0, 1], "distances": {"0": [10, 21], "1": [21, 10]} | null,
     "providers": [null, {}, {"cpu": null | [] | [{"numaNodes": [0] | null,
                                                  "preferred": true}, ...]}]}

and gives one output line, ``{"hint": {"numaNodes": [...] | null, "preferred": bool},
"admit": bool}``, or ``{"error": "FIELD: what is wrong"}`` for a bad line (processing goes
on; the exit status is 1 at the end if any line was bad).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from typing import IO, Any

from numalign.topology.errors import TopologyError
from numalign.topology.hints import ProviderHints, TopologyHint
from numalign.topology.merge import merge
from numalign.topology.policies import get_policy
from numalign.topology.policies.loader import PolicyPluginError
from numalign.topology.policyconfig import PolicyOptions, parse_policy_options

USAGE = """usage: numalign merge < LINES.jsonl

Reads one JSON object per line and writes one JSON line per input line:
  in:  {"policy": P, "options": {"prefer-closest-numa-nodes": "true", ...},
        "numaNodes": [ids], "distances": {"ID": [row in numaNodes order]} | null,
        "providers": [null | {} | {"RES": null | [] | [{"numaNodes": [ids] | null,
                                                        "preferred": bool}, ...]}]}
  out: {"hint": {"numaNodes": [ids] | null, "preferred": bool}, "admit": bool}
       or {"error": "what is wrong"} (the exit status is then 1).
Policies: none, best-effort, restricted, single-numa-node.
Options: prefer-closest-numa-nodes (bool), max-allowable-numa-nodes (int >= 8, default 64).
"""

MAX_NUMA_ID = 255
MAX_DISTANCE = (1 << 32) - 1
# A line at 64 NUMA nodes with every 1- and 2-node mask for 4 resources is ~350 KB.
MAX_LINE_BYTES = 4 << 20


class LineTooLong:
    """Stands for an input line longer than :data:`MAX_LINE_BYTES` (skipped unread)."""

    def __init__(self, size: int) -> None:
        self.size = size


def bounded_lines(stream: IO[bytes], limit: int = MAX_LINE_BYTES
                  ) -> Iterator[bytes | LineTooLong]:
    """The lines of ``stream``; one longer than ``limit`` bytes comes as a LineTooLong
    and is skipped in chunks, so memory stays bounded whatever the input."""
    while True:
        line = stream.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith(b"\n"):
            yield line
            continue
        size = len(line)
        while not line.endswith(b"\n"):
            line = stream.readline(1 << 20)
            if not line:
                break
            size += len(line)
        yield LineTooLong(size)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, int | float):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _numa_nodes(value: Any) -> list[int]:
    if not isinstance(value, list):
        raise TopologyError(
            "numaNodes", f"must be a list of NUMA node ids, not {_type_name(value)}"
        )
    if not value:
        raise TopologyError("numaNodes", "must name at least one NUMA node")
    seen: set[int] = set()
    for i, v in enumerate(value):
        if not _is_int(v) or not 0 <= v <= MAX_NUMA_ID:
            raise TopologyError(
                f"numaNodes[{i}]", f"must be an integer from 0 to {MAX_NUMA_ID}, not {v!r}"
            )
        if v in seen:
            raise TopologyError(f"numaNodes[{i}]", f"NUMA node {v} is listed twice")
        seen.add(v)
    return list(value)


def _options(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TopologyError("options", f"must be an object of strings, not {_type_name(value)}")
    for k, v in value.items():
        if not isinstance(v, str):
            raise TopologyError(
                f"options.{k}",
                f"must be a string (as in the kubelet's configuration), not {_type_name(v)}",
            )
    return value


def _distances(value: Any, ids: list[int]) -> dict[int, dict[int, int]] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise TopologyError("distances", f"must be an object or null, not {_type_name(value)}")
    out: dict[int, dict[int, int]] = {}
    known = set(ids)
    for key, row in value.items():
        try:
            node = int(key)
        except ValueError:
            raise TopologyError("distances", f"key {key!r} is not a NUMA node id") from None
        if node not in known or str(node) != key:
            raise TopologyError("distances", f"NUMA node {key} is not in numaNodes {ids}")
        if not isinstance(row, list) or len(row) != len(ids):
            raise TopologyError(
                f"distances.{key}", f"must be a list of {len(ids)} distances in numaNodes order"
            )
        for j, d in enumerate(row):
            if not _is_int(d) or not 0 <= d <= MAX_DISTANCE:
                raise TopologyError(
                    f"distances.{key}[{j}]", f"must be an integer from 0 to {MAX_DISTANCE}"
                )
        out[node] = {b: row[j] for j, b in enumerate(ids)}
    missing = [i for i in ids if i not in out]
    if missing:
        raise TopologyError("distances", f"no row for NUMA node {missing[0]}")
    return out


def _hint(value: Any, where: str, ids: list[int], known: set[int]) -> TopologyHint:
    if not isinstance(value, dict):
        raise TopologyError(where, f"must be an object, not {_type_name(value)}")
    if "numaNodes" not in value:
        raise TopologyError(f"{where}.numaNodes", "is missing (use null for any NUMA node)")
    nodes = value["numaNodes"]
    preferred = value.get("preferred")
    if not isinstance(preferred, bool):
        raise TopologyError(
            f"{where}.preferred", f"must be true or false, not {_type_name(preferred)}"
        )
    if nodes is None:
        return TopologyHint(None, preferred)
    if not isinstance(nodes, list):
        raise TopologyError(
            f"{where}.numaNodes", f"must be a list or null, not {_type_name(nodes)}"
        )
    mask = 0
    for v in nodes:
        if not _is_int(v):
            raise TopologyError(f"{where}.numaNodes", f"{v!r} is not a NUMA node id")
        if v not in known:
            raise TopologyError(f"{where}.numaNodes", f"NUMA node {v} is not in numaNodes {ids}")
        mask |= 1 << v
    return TopologyHint(mask, preferred)


def _providers(value: Any, ids: list[int]) -> list[ProviderHints]:
    if not isinstance(value, list):
        raise TopologyError("providers", f"must be a list, not {_type_name(value)}")
    known = set(ids)
    out: list[ProviderHints] = []
    for p, prov in enumerate(value):
        if prov is None:
            out.append(None)
            continue
        if not isinstance(prov, dict):
            raise TopologyError(
                f"providers[{p}]", f"must be an object or null, not {_type_name(prov)}"
            )
        res: dict[str, list[TopologyHint] | None] = {}
        for name, hints in prov.items():
            where = f"providers[{p}].{name}"
            if hints is None:
                res[name] = None
            elif isinstance(hints, list):
                res[name] = [_hint(h, f"{where}[{k}]", ids, known) for k, h in enumerate(hints)]
            else:
                raise TopologyError(
                    where, f"must be a list of hints or null, not {_type_name(hints)}"
                )
        out.append(res)
    return out


def decide(doc: Any) -> dict[str, Any]:
    """One input object -> one output object (raises TopologyError on bad input)."""
    if not isinstance(doc, dict):
        raise TopologyError("", f"each line must be a JSON object, not {_type_name(doc)}")
    for required in ("policy", "numaNodes", "providers"):
        if required not in doc:
            raise TopologyError(required, "is missing")
    policy = doc["policy"]
    if not isinstance(policy, str):
        raise TopologyError("policy", f"must be a string, not {_type_name(policy)}")
    aligns = get_policy(policy).aligns
    ids = _numa_nodes(doc["numaNodes"])
    raw_options = _options(doc.get("options"))
    distances = _distances(doc.get("distances"), ids)
    providers = _providers(doc["providers"], ids)
    # The kubelet's none policy short-circuits before parsing the options.
    options = parse_policy_options(raw_options) if aligns else PolicyOptions()
    result = merge(policy, providers, ids, distances, options)
    return result.to_json()


def run(lines: Iterable[str | bytes | LineTooLong], out: IO[str]) -> int:
    status = 0
    for raw in lines:
        reply: dict[str, Any]
        if isinstance(raw, LineTooLong):
            out.write(json.dumps({"error": f"line of {raw.size} bytes is longer than "
                                           f"{MAX_LINE_BYTES} bytes; refused"}) + "\n")
            out.flush()
            status = 1
            continue
        if isinstance(raw, bytes):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                out.write(json.dumps({"error": "not valid UTF-8"}) + "\n")
                out.flush()
                status = 1
                continue
        else:
            line = raw
        if not line.strip():
            continue
        try:
            reply = decide(json.loads(line))
        except json.JSONDecodeError as e:
            reply = {"error": f"not valid JSON: {e.msg} at column {e.colno}"}
        except RecursionError:
            reply = {"error": "not valid JSON: nested too deeply"}
        except TopologyError as e:
            reply = {"error": str(e)}
        except PolicyPluginError:
            raise  # not this line's fault: numalign's main says it and stops
        except Exception as e:  # never a traceback
            reply = {"error": f"internal error: {type(e).__name__}: {e}"}
        if "error" in reply:
            status = 1
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return status


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        sys.stdout.write(USAGE)
        return 0
    if argv:
        sys.stderr.write(f"numalign merge: unexpected argument {argv[0]!r}\n\n{USAGE}")
        return 2
    try:
        return run(bounded_lines(sys.stdin.buffer), sys.stdout)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
