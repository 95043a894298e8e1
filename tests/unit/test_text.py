"""numalign.topology.text: strings a tenant wrote, made safe for a message or a terminal."""

from __future__ import annotations

import logging
import re
import sys

import pytest

from numalign.commands.logs import PrintableFormatter
from numalign.topology.text import ECHO_CHARS, clip, printable, printable_doc, quote, quote_json

# What must never reach a terminal raw: C0 (but the line feed of a multi-line view), DEL,
# C1, the bidi embeddings, overrides and isolates, line and paragraph separators.
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069"
                 "\u2028\u2029\ufeff]")
HOSTILE = "\x1b]0;pwned\x07\x1b[2J"


@pytest.mark.parametrize(("raw", "shown"), [
    (HOSTILE, "\\x1b]0;pwned\\x07\\x1b[2J"),
    ("a\tb\nc\rd", "a\\tb\\nc\\rd"),
    ("\x00\x7f\x85\x9b", "\\x00\\x7f\\x85\\x9b"),
    ("abc\u202edcba", "abc\\u202edcba"),
    ("\u202a\u202b\u202c\u202d \u2066\u2067\u2068\u2069", "\\u202a\\u202b\\u202c\\u202d "
                                                          "\\u2066\\u2067\\u2068\\u2069"),
    ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
    ("line\u2028para\u2029", "line\\u2028para\\u2029"),
    ("\ud800", "\\ud800"),  # a lone surrogate (json.loads gives one for "\ud800")
    ("tag\U000e0041", "tag\\U000e0041"),
    ("\ue000", "\\ue000"),  # private use
])
def test_hidden_and_controlling_code_points_are_escapes(raw: str, shown: str) -> None:
    assert printable(raw) == shown
    assert not RAW.search(printable(raw).replace("\n", ""))


@pytest.mark.parametrize("text", [
    "", "nvidia.com/gpu", "0/2 nodes are available: 2 numalign: no NUMA node fits",
    "héllo wörld", "日本語のテキスト", "Ελληνικά", "עברית ועربي", "emoji 🚀",
    "no\xa0break", "back\\slash \\x1b stays as typed", "quotes ' \" `",
])
def test_ordinary_text_is_kept(text: str) -> None:
    assert printable(text) == text
    assert clip(text) == text


def test_keep_newlines_keeps_only_the_line_feeds() -> None:
    assert printable("a\nb\x1b[2J\nc", keep_newlines=True) == "a\nb\\x1b[2J\nc"
    assert printable("a\r\nb", keep_newlines=True) == "a\\r\nb"
    assert printable("a\nb") == "a\\nb"


def test_non_strings_are_their_str() -> None:
    assert printable(3) == "3"
    assert printable(ValueError("bad \x1b")) == "bad \\x1b"


def test_clip_bounds_the_value_shown() -> None:
    assert clip("x" * ECHO_CHARS) == "x" * ECHO_CHARS
    assert clip("x" * (ECHO_CHARS + 1)) == "x" * ECHO_CHARS + "…"
    assert clip("\x1b" * 200, 3) == "\\x1b\\x1b\\x1b…"
    assert len(clip("y" * 100_000)) == ECHO_CHARS + 1


def test_quote_is_repr_bounded() -> None:
    assert quote("strict") == repr("strict")
    assert quote(HOSTILE) == "'\\x1b]0;pwned\\x07\\x1b[2J'"
    assert quote("a\u202eb") == "'a\\u202eb'"
    assert quote("z" * 1000, 5) == "'zzzzz…'"
    assert quote(["\x1b"] * 100, 10) == "['\\x1b', '…"
    assert quote(None) == "None"


def test_quote_json_is_json_bounded() -> None:
    assert quote_json("nvidia.com/gpu") == '"nvidia.com/gpu"'
    assert quote_json(HOSTILE) == '"\\u001b]0;pwned\\u0007\\u001b[2J"'
    assert quote_json(list(range(100)), 10) == "[0, 1, 2, …"
    assert quote_json(float("nan")) == "NaN"
    assert not RAW.search(quote_json({"k\x1b": ["\u202e"]}))


def test_printable_doc_escapes_every_string_keys_too() -> None:
    doc = {"m\x1b": ["a\x07", {"n": "\u202e"}], "count": 2, "ok": True, "none": None}
    assert printable_doc(doc) == {"m\\x1b": ["a\\x07", {"n": "\\u202e"}], "count": 2,
                                  "ok": True, "none": None}


def test_log_lines_are_one_printable_line() -> None:
    fmt = PrintableFormatter("%(levelname)s %(message)s")
    rec = logging.LogRecord("numalign", logging.WARNING, __file__, 1,
                            "refused %s", (HOSTILE + "\nFAKE line",), None)
    line = fmt.format(rec)
    assert line == "WARNING refused \\x1b]0;pwned\\x07\\x1b[2J\\nFAKE line"
    try:
        raise ValueError("bad \x1b[2J")
    except ValueError:
        rec = logging.LogRecord("numalign", logging.ERROR, __file__, 1, "failed", (),
                                sys.exc_info())
    text = fmt.format(rec)
    assert "Traceback" in text and "\n" in text and "bad \\x1b[2J" in text
    assert not RAW.search(text)
