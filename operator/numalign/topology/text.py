"""Strings from places a tenant can write (annotations, labels, event messages, object
names) made safe to put in a message or on a terminal.

:func:`printable` shows every code point a terminal would act on or hide as a visible
escape, the way Python's ``repr`` spells it (``\\x1b``, ``\\u202e``): C0 and C1 control
characters and DEL, format characters (the bidirectional overrides and isolates U+202A-202E
and U+2066-2069, zero-width characters), line and paragraph separators, surrogates,
private-use and unassigned code points. Ordinary text in any script, spaces included, is
kept as it is. :func:`clip` bounds a value echoed in an error; :func:`quote` is ``repr``
bounded the same way."""

from __future__ import annotations

import json
import unicodedata
from typing import Any

# Shown as escapes: control (Cc), format (Cf), surrogate (Cs), private use (Co),
# unassigned (Cn), line and paragraph separators (Zl, Zp).
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}
# How much of a bad value an error message shows.
ECHO_CHARS = 80
ELLIPSIS = "…"


def _escape(ch: str) -> str:
    short = _SHORT.get(ch)
    if short is not None:
        return short
    o = ord(ch)
    if o <= 0xFF:
        return f"\\x{o:02x}"
    if o <= 0xFFFF:
        return f"\\u{o:04x}"
    return f"\\U{o:08x}"


def _shown(ch: str) -> str:
    # str.isprintable is False for the spaces other than U+0020 too: those are kept.
    if ch.isprintable() or unicodedata.category(ch) not in _HIDDEN:
        return ch
    return _escape(ch)


def printable(text: object, keep_newlines: bool = False) -> str:
    """``text`` (``str()`` of anything else) with every hidden or controlling code point
    as a visible escape; ``keep_newlines``: line feeds stay (a multi-line report)."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s
    if keep_newlines:
        return "\n".join(printable(line) for line in s.split("\n"))
    return "".join(map(_shown, s))


def printable_doc(doc: Any) -> Any:
    """A JSON-like document with every string in it (keys too) :func:`printable`."""
    if isinstance(doc, str):
        return printable(doc)
    if isinstance(doc, dict):
        return {printable_doc(k): printable_doc(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [printable_doc(v) for v in doc]
    return doc


def clip(text: object, limit: int = ECHO_CHARS) -> str:
    """:func:`printable`, at most ``limit`` characters of the value (then ``…``)."""
    s = text if isinstance(text, str) else str(text)
    return printable(s[:limit]) + (ELLIPSIS if len(s) > limit else "")


def quote(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` (escapes included), a string cut to ``limit`` characters (``…``
    inside the quotes), anything else's repr cut the same way."""
    if isinstance(value, str):
        return repr(value[:limit] + ELLIPSIS if len(value) > limit else value)
    r = repr(value)
    return r[:limit] + ELLIPSIS if len(r) > limit else r


def quote_json(value: object, limit: int = ECHO_CHARS) -> str:
    """``json.dumps(value)`` (ASCII: every other code point escaped), cut to ``limit``."""
    try:
        r = json.dumps(value)
    except (TypeError, ValueError):
        r = quote(value, limit)
    return r[:limit] + ELLIPSIS if len(r) > limit else r
