"""Kubernetes label selectors: validation, matching (the API server's semantics),
specificity and a disjointness check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def selector_problems(selector: Any, where: str) -> list[str]:
    """What is wrong with a LabelSelector (empty list: well-formed). None is fine."""
    if selector is None:
        return []
    if not isinstance(selector, Mapping):
        return [f"{where}: must be an object with matchLabels / matchExpressions"]
    out: list[str] = []
    unknown = sorted(set(selector) - {"matchLabels", "matchExpressions"})
    if unknown:
        out.append(f"{where}: unknown field(s) {', '.join(unknown)}")
    ml = selector.get("matchLabels")
    if ml is not None and not (
        isinstance(ml, Mapping) and all(isinstance(v, str) for v in ml.values())
    ):
        out.append(f"{where}.matchLabels: must map label keys to string values")
    exprs = selector.get("matchExpressions")
    if exprs is not None:
        if not isinstance(exprs, list):
            out.append(f"{where}.matchExpressions: must be a list")
        else:
            for i, e in enumerate(exprs):
                w = f"{where}.matchExpressions[{i}]"
                if not isinstance(e, Mapping) or not isinstance(e.get("key"), str):
                    out.append(f"{w}: needs a string key")
                    continue
                op = e.get("operator")
                if op not in SELECTOR_OPERATORS:
                    out.append(f"{w}.operator: {op!r} is not one of "
                               f"{', '.join(SELECTOR_OPERATORS)}")
                    continue
                vals = e.get("values")
                if op in ("In", "NotIn"):
                    if not isinstance(vals, list) or not vals or not all(
                        isinstance(v, str) for v in vals
                    ):
                        out.append(f"{w}.values: {op} needs a non-empty list of strings")
                elif vals:
                    out.append(f"{w}.values: must be empty for {op}")
    return out


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes LabelSelector semantics; None or {} selects everything.

    A malformed selector selects nothing (callers validate first)."""
    if selector is None:
        return True
    if selector_problems(selector, "selector"):
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, vals = e["key"], e["operator"], e.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in vals):
            return False
        if op == "NotIn" and present and labels[key] in vals:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def selector_size(selector: Any) -> int:
    """How many requirements a selector has (its specificity)."""
    if not isinstance(selector, Mapping):
        return 0
    ml = selector.get("matchLabels")
    me = selector.get("matchExpressions")
    return (len(ml) if isinstance(ml, Mapping) else 0) + (len(me) if isinstance(me, list) else 0)


def _requirements(selector: Any) -> list[tuple[str, str, frozenset[str]]]:
    """A selector as (key, operator, values) requirements."""
    if not isinstance(selector, Mapping):
        return []
    out = [(str(k), "In", frozenset([str(v)]))
           for k, v in (selector.get("matchLabels") or {}).items()]
    for e in selector.get("matchExpressions") or []:
        if isinstance(e, Mapping):
            out.append((str(e.get("key")), str(e.get("operator")),
                        frozenset(str(v) for v in e.get("values") or [])))
    return out


def selectors_disjoint(a: Any, b: Any) -> bool:
    """True when no label set can match both selectors (a sound, incomplete check)."""
    reqs = _requirements(a) + _requirements(b)
    keys = {k for k, _, _ in reqs}
    for key in keys:
        mine = [(op, vals) for k, op, vals in reqs if k == key]
        must_exist = any(op in ("In", "Exists") for op, _ in mine)
        must_not = any(op == "DoesNotExist" for op, _ in mine)
        if must_exist and must_not:
            return True
        allowed: frozenset[str] | None = None
        for op, vals in mine:
            if op == "In":
                allowed = vals if allowed is None else allowed & vals
        if allowed is not None:
            for op, vals in mine:
                if op == "NotIn":
                    allowed = allowed - vals
            if not allowed:
                return True
    return False
