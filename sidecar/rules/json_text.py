"""Request bodies parsed as JSON: exactly what ``json.loads`` returns, at orjson's speed.

Effect keys, fingerprints and the excerpt the effect log keeps are all made from a body's
parsed value, so that value must not depend on the parser.  orjson parses three to five
times faster than ``json`` (a 1 MiB body: ~0.7 ms against ~3.4 on a slow 2-core VM) and,
for every text both accept, returns the same value, but for one kind of number: an
integer beyond 64 bits, which orjson reads as a float where ``json`` keeps the int.  So a
value orjson may have widened (it holds a float that large) is parsed again by ``json``,
and so is every text orjson refuses, some of which ``json`` accepts: NaN and infinities
(also an exponent too large for a double), a byte-order mark, UTF-16 and UTF-32, lone
surrogates, nesting deeper than 1024.  tests/unit/rules/test_json_text.py holds both
parsers to that, on those texts and on generated ones.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

#: orjson reads an integer literal outside [-2**63, 2**64 - 1] as a float, which then is
#: at least 2**64, or at most -2**63, in value.
_WIDE_ABOVE = 2.0**64
_WIDE_BELOW = -(2.0**63)


def parse_json(text: bytes) -> tuple[Any, bool]:
    """``json.loads(text)``, and whether the value is known to hold no NaN or infinity
    (it does not when orjson parsed it; ``json`` may have read them).  Raises what
    ``json.loads`` raises: ValueError for what is not JSON (or not UTF-8), RecursionError
    for nesting too deep even for ``json``."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text), False
    if _may_be_widened(value):
        # orjson took the text, so it holds no NaN or infinity: json reads none either.
        return json.loads(text), True
    return value, True


def _may_be_widened(value: Any) -> bool:
    """Whether ``value`` holds a float that may have been an integer beyond 64 bits: one
    at least 2**64 or at most -2**63 (a float literal that large is also parsed again,
    to the same value).  One pass over the values, level by level, with no recursion."""
    level = [value]
    while level:
        below: list[Any] = []
        for item in level:
            kind = type(item)
            if kind is dict:
                below.extend(item.values())
            elif kind is list:
                below.extend(item)
            elif kind is float and (item >= _WIDE_ABOVE or item <= _WIDE_BELOW):
                return True
        level = below
    return False
