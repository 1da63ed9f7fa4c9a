"""Values every store can hold and every answer can carry.

Python strings may hold lone surrogates (``json.loads('"\\udc00"')``, or bytes decoded
with ``surrogateescape``); UTF-8 cannot encode them, so neither SQLite nor PostgreSQL
nor a JSON answer can carry them.  PostgreSQL text cannot hold NUL either.  Inputs are
refused at the door with :func:`unstorable`; summaries written for the audit trail and
anything read back from a store written before that check are made safe by
:func:`scrubbed` (each such character becomes U+FFFD).
"""

from __future__ import annotations

import re
from typing import Any

_UNENCODABLE = re.compile("[\ud800-\udfff]")
_UNSTORABLE = re.compile("[\ud800-\udfff\x00]")
REPLACEMENT = "\ufffd"
MAX_INT64 = (1 << 63) - 1


type Where = tuple[str | int, ...]


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be a text column of every store (NUL, a lone surrogate), or None."""
    found = _UNSTORABLE.search(text)
    if found is None:
        return None
    what = "a NUL character" if found.group() == "\x00" else "a lone surrogate"
    return f"{what} (U+{ord(found.group()):04X}) cannot be stored"


def unstorable(value: Any, where: Where = ()) -> tuple[Where, str] | None:
    """Where in ``value`` (a JSON-like value, stored as JSON text) the first thing a store
    cannot hold is, and what it is; None when all of it can be stored.  (NUL is fine in
    JSON: it is written as an escape.)"""
    if isinstance(value, str):
        found = _UNENCODABLE.search(value)
        what = f"a lone surrogate (U+{ord(found.group()):04X})" if found else None
    elif isinstance(value, int) and not isinstance(value, bool):
        too_big = not -MAX_INT64 - 1 <= value <= MAX_INT64
        what = "an integer beyond 64 bits" if too_big else None
    else:
        children: list[tuple[str | int, Any]] = []
        if isinstance(value, dict):
            for key, item in value.items():
                children += [(str(key), key), (str(key), item)]
        elif isinstance(value, list | tuple):
            children = list(enumerate(value))
        for step, child in children:
            if (problem := unstorable(child, (*where, step))) is not None:
                return problem
        return None
    return None if what is None else (where, f"{what} cannot be stored")


def scrubbed(value: Any) -> Any:
    """``value`` with every character UTF-8 cannot encode replaced by U+FFFD."""
    if isinstance(value, str):
        # An ASCII string holds no surrogate: most of a summary's strings skip the search.
        return value if value.isascii() else _UNENCODABLE.sub(REPLACEMENT, value)
    if isinstance(value, dict):
        return {scrubbed(k): scrubbed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrubbed(v) for v in value]
    return value


def scrubbed_text(text: str) -> str:
    """A string with every character UTF-8 cannot encode, and NUL, replaced by U+FFFD."""
    return _UNSTORABLE.sub(REPLACEMENT, text)
