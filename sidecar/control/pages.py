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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from sidecar.errors import InvalidRequest
from sidecar.store.rows import from_us

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


def position(asked: PageRequest, texts: int) -> tuple[Any, ...] | None:
    """A time-ordered list's cursor: [microseconds, then ``texts`` strings] decoded as the
    store's ``after`` (its datetime, then the strings), or None on the first page; 400 for
    anything else."""
    after = asked.after
    if after is None:
        return None
    match after:
        case [int(us), *rest] if (
            not isinstance(us, bool)
            and len(rest) == texts
            and all(isinstance(part, str) for part in rest)
        ):
            return from_us(us), *(str(part) for part in rest)
    raise InvalidRequest("the cursor does not hold a position of this list")


def json_body(body: bytes) -> web.Response:
    """A page already serialised (off the event loop) as the answer."""
    return web.Response(body=body, content_type="application/json")


def cut[T](
    found: list[T], limit: int, kind: str, where: Callable[[T], Any]
) -> tuple[list[T], str | None]:
    """The page out of ``found`` (read one more than ``limit``, to know whether another
    page follows) and its ``next_cursor``: ``where`` its last item is, or None."""
    page = found[:limit]
    more = len(found) > limit and bool(page)
    return page, next_cursor(kind, where(page[-1])) if more else None


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
