"""Kubernetes label selectors at run time: the CRD's :class:`~numalign.api.common.LabelSelector`
model matches; here its specificity and a disjointness check."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from .common import LabelSelector


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Kubernetes LabelSelector semantics (the model's); None or {} selects everything,
    a malformed selector nothing."""
    if selector is None:
        return True
    try:
        model = LabelSelector.model_validate(selector, strict=True)
    except ValidationError:
        return False
    return model.matches(labels)


def selector_size(selector: LabelSelector | None) -> int:
    """How many requirements a selector has (its specificity)."""
    if selector is None:
        return 0
    return len(selector.match_labels or {}) + len(selector.match_expressions or [])


def _requirements(selector: Any) -> list[tuple[str, str, frozenset[str]]]:
    """A selector as (key, operator, values) requirements."""
    if isinstance(selector, LabelSelector):
        selector = selector.to_dict()
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
