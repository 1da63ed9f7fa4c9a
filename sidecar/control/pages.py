"""Cursor pagination of the list routes (SPEC §5): ``?limit=`` and an opaque ``?cursor=``.

A page answers at most ``limit`` items (100 unless asked, never more than 500) and a
``next_cursor`` to ask for the items after them, or null after the last page.  A cursor
is the position of the page's last item, as base64url JSON tagged with what it lists:
opaque to clients, checked here, so a cursor from another route or a made-up one is a
400, never a wrong page.  A page is read by position, not offset: effects recorded
while an operator pages through are neither skipped nor shown twice.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sidecar.errors import InvalidRequest

DEFAULT_LIMIT = 100
MAX_LIMIT = 500

QUERY_PARAMETERS = [
    {
        "name": "limit",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
    },
    {
        "name": "cursor",
        "in": "query",
        "required": False,
        "description": "next_cursor of the previous page",
        "schema": {"type": "string"},
    },
]


@dataclass(frozen=True)
class PageRequest:
    limit: int
    after: Any  # the decoded position, or None for the first page


def page_request(request: web.Request, kind: str) -> PageRequest:
    """The page a list route was asked for; 400 for a bad limit or a foreign cursor."""
    raw_limit = request.query.get("limit", str(DEFAULT_LIMIT))
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIMIT:
        raise InvalidRequest(f"limit must be an integer from 1 to {MAX_LIMIT}, got {raw_limit!r}")
    cursor = request.query.get("cursor")
    return PageRequest(int(raw_limit), None if cursor is None else _decode(cursor, kind))


def next_cursor(kind: str, position: Any) -> str:
    text = json.dumps([kind, position], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode(cursor: str, kind: str) -> Any:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        tag, position = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, TypeError, UnicodeError, binascii.Error) as exc:
        raise InvalidRequest(f"cursor {cursor[:64]!r} is not one this API gave") from exc
    if tag != kind:
        raise InvalidRequest(f"cursor {cursor[:64]!r} belongs to another list ({tag!r})")
    return position
