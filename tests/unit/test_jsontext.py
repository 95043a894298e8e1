"""topology.jsontext: tenant-written JSON bounded in size and nesting, strings skipped when
nesting is measured, errors that name the value."""

from __future__ import annotations

import pytest

from numalign.topology import jsontext


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    assert jsontext.nesting_depth('[[1, "]]]", "[[[["], {"a": "{\\"}"}]') == 2


def test_an_unclosed_string_is_one_token_to_the_end_of_the_text() -> None:
    # A hostile value of escaped quotes that never closes: the lexer takes it in one match
    # (retrying from each escaped quote would cost time quadratic in its length).
    hostile = '[1, "' + '\\"' * 32000
    m = jsontext._STRING.search(hostile)
    assert m is not None and m.start() == 4 and m.end() == len(hostile)
    assert jsontext.nesting_depth(hostile) == 1
    with pytest.raises(ValueError, match=r"^the annotation is not valid JSON: Unterminated"):
        jsontext.loads(hostile, "the annotation")


@pytest.mark.parametrize(("text", "message"), [
    ("[" * 33 + "]" * 33, "the annotation is nested more than 32 levels deep"),
    ('"' + "x" * 70000 + '"', "the annotation is 70002 bytes, more than 65536"),
])
def test_bounds_are_named(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        jsontext.loads(text, "the annotation")
