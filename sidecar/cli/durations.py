"""Time arguments of the command line: ``--older-than 30d``, ``--since 12h`` or an
ISO-8601 time.

A module of its own, importing nothing heavy, because the control API parses the same
durations (``GET /v1/review?window=7d``): importing them from a verb's module would load
that verb (its client, the store commands, the API schemas) into every ``sidecar serve``.
"""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime, timedelta

from sidecar.runtime.clock import SystemClock

_DURATION = re.compile(r"^(\d+)([dhm])$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


def duration(text: str) -> timedelta:
    """``30d``, ``12h``, ``90m``: a positive whole number of days, hours or minutes."""
    match = _DURATION.fullmatch(text.strip())
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a duration such as 30d, 12h or 90m")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def since(text: str) -> datetime:
    """A duration back from now (``30d``) or an ISO-8601 time (UTC if it names no zone)."""
    try:
        return SystemClock().now() - duration(text)
    except argparse.ArgumentTypeError:
        pass
    try:
        at = datetime.fromisoformat(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a duration (30d, 12h, 90m) or an ISO-8601 time"
        ) from exc
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
