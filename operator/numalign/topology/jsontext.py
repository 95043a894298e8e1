"""JSON from places a tenant can write (pod annotations, ConfigMaps): bounded in size and
nesting, so that a hostile value costs microseconds and raises a one-line ValueError,
never a RecursionError out of a watch handler."""

from __future__ import annotations

import json
import re
from typing import Any

# What any numalign document needs: an allocation of a pod with many containers and
# 8192 CPUs stays far below both.
DEFAULT_MAX_BYTES = 64 * 1024
MAX_DEPTH = 32

# a string, or an unclosed one to the end of the text in one match (never retried from
# each escaped quote inside it: that would be quadratic in hostile input)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\\?\Z)', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


def nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (strings skipped); linear."""
    depth = deepest = 0
    for m in _BRACKET.finditer(_STRING.sub("", text)):
        if m.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def loads(text: str, what: str, max_bytes: int = DEFAULT_MAX_BYTES,
          max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads`` with the bounds above; ValueError names ``what``."""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a string, got {type(text).__name__}")
    size = len(text.encode("utf-8", errors="replace"))
    if size > max_bytes:
        raise ValueError(f"{what} is {size} bytes, more than {max_bytes}")
    if nesting_depth(text) > max_depth:
        raise ValueError(f"{what} is nested more than {max_depth} levels deep")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} is not valid JSON: {e}") from None
