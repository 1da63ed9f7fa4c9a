"""A request path's *shape*: what stays the same across requests to one endpoint.

``/repos/acme/app/issues/1234/comments?page=2`` and ``.../issues/99/comments`` are one
endpoint; the inventory of writes no rule covers (``serve --uncovered-writes``) lists
endpoints, not requests.  Segments that look like identifiers - numbers, UUIDs, hex
digests, long tokens mixing letters and digits - become ``{id}``; the query is dropped.
Names (``acme``, ``app``) stay: they cannot be told from path words without a rule.
"""

from __future__ import annotations

import re

ID = "{id}"
_NUMBER = re.compile(r"[0-9]+")
_UUID = re.compile(
    r"[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}"
)
_HEX = re.compile(r"(?=[^0-9]*[0-9])[0-9a-fA-F]{8,}")  # a digest or object id, with a digit
# A long opaque token: letters and digits mixed (Stripe's ch_3N..., ULIDs, base64 ids).
_TOKEN = re.compile(r"(?=.*[0-9])(?=.*[A-Za-z])[A-Za-z0-9_-]{16,}")
MAX_SEGMENTS = 32  # a shape is a label too: deep paths are cut short


def _is_id(segment: str) -> bool:
    return any(p.fullmatch(segment) for p in (_NUMBER, _UUID, _HEX, _TOKEN))


def request_shape(target: str) -> str:
    """The shape of a request target (path, optionally with its query)."""
    path = target.partition("?")[0].partition("#")[0] or "/"
    segments = path.split("/")[1:]
    shaped = [ID if _is_id(segment) else segment for segment in segments[:MAX_SEGMENTS]]
    if len(segments) > MAX_SEGMENTS:
        shaped.append("...")
    return "/" + "/".join(shaped)


def as_template(shape: str) -> str:
    """A ``match.path`` template for a shape: each ``{id}`` a parameter of its own."""
    count = 0

    def name(segment: str) -> str:
        nonlocal count
        if segment != ID:
            return segment
        count += 1
        return "{id}" if count == 1 else f"{{id{count}}}"

    return "/".join(name(segment) for segment in shape.split("/"))
