"""parse_json returns exactly what json.loads returns (value, types and key order), and
refuses what it refuses, whichever parser did the work."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.rules.json_text import parse_json


def same_as_json(text: bytes) -> None:
    """parse_json(text) is json.loads(text): the same value, spelled the same by repr
    (so 1 and 1.0, or key order, differ), or the same kind of refusal."""
    try:
        expected = json.loads(text)
    except (ValueError, RecursionError) as refused:
        with pytest.raises(type(refused)):
            parse_json(text)
        return
    value, _ = parse_json(text)
    assert repr(value) == repr(expected)


@pytest.mark.parametrize(
    "text",
    [
        b"[18446744073709551616]",  # 2**64: orjson reads it as a float
        b"[18446744073709551615]",  # 2**64 - 1: an int for both
        b"[-9223372036854775809]",  # -2**63 - 1
        b"[-9223372036854775808]",
        b'{"id": 123456789012345678901234567890, "n": 1}',
        b"[1.8446744073709552e19]",  # a float literal that large is still a float
        b"[12345678901234567890e0]",
        b'{"a": NaN, "b": Infinity, "c": -Infinity}',  # json only
        b"[1e400]",  # json reads infinity, orjson refuses
        b"\xef\xbb\xbf[1]",  # a byte-order mark
        '{"a": "é"}'.encode("utf-16"),
        '{"a": "é"}'.encode("utf-32-le"),
        b'["\\ud800"]',  # a lone surrogate
        b'["\\ud83d\\ude00", "\\u0000", "\\/"]',
        b'{"a": 1, "b": 2, "a": 3}',  # the last wins, where the first stood
        b"[" * 1025 + b"]" * 1025,  # deeper than orjson goes
        b"[" * 200_000 + b"]" * 200_000,  # deeper than json goes
        b" \t\n[1, -0, -0.0, 1E+2, 5e-324, 1e-400]\r\n",
        b'"\xff"',  # not UTF-8
        b'"a\tb"',  # a raw control character in a string
        b"[1,]",
        b"01",
        b"NaNa",
        b"",
        b"[1]\x00",
    ],
)
def test_a_text_parses_as_json_loads_parses_it(text):
    same_as_json(text)


@pytest.mark.parametrize(
    ("text", "finite"),
    [
        (b'{"a": [1, 2.5, null]}', True),
        (b"[18446744073709551616]", True),  # parsed again by json, NaN-free all the same
        (b'{"a": NaN}', False),
        (b"[1e400]", False),
        (b"\xef\xbb\xbf[1]", False),  # json read it: it could have held NaN
    ],
)
def test_it_says_when_the_value_cannot_hold_nan_or_infinity(text, finite):
    assert parse_json(text)[1] is finite


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats()
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=25,
)


@given(_values, st.booleans(), st.booleans())
def test_any_json_text_parses_as_json_loads_parses_it(value, ascii_only, compact):
    separators = (",", ":") if compact else (", ", ": ")
    text = json.dumps(value, ensure_ascii=ascii_only, separators=separators)
    same_as_json(text.encode("utf-8", "surrogatepass"))


@given(st.binary(max_size=64))
def test_any_bytes_are_parsed_or_refused_as_json_loads_does(text):
    same_as_json(text)


@given(st.from_regex(rb"\A-?(0|[1-9][0-9]{0,30})(\.[0-9]{1,30})?([eE][+-]?[0-9]{1,3})?\Z"))
def test_any_number_reads_as_json_loads_reads_it(text):
    same_as_json(text)
