"""Plain-text tables for the terminal, as wide as there is room for.

The width is ``COLUMNS`` when set, else the terminal's; output that goes to a pipe or a
file is not cut (scripts should use ``--json``).  When the table is wider, the widest
flexible columns give way first, down to :data:`MIN_WIDTH`, and a cut cell keeps its
start and, longer, its end - the distinguishing part of a path or a key - around a "…".
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Collection, Sequence
from datetime import datetime

# Cells this short are never cut: names, stages and ids stay whole; long paths, keys
# and details give way.
MIN_WIDTH = 24
GAP = "  "


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    return " ".join(str(value).split())  # one line per row, whatever a value holds


def available_width() -> int | None:
    """``COLUMNS``, else the terminal's width; None (no limit) when not a terminal."""
    given = os.environ.get("COLUMNS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    if sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


def shorten(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters: its start, "…", and its (longer) end."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    head = (width - 1) // 3
    return text[:head] + "…" + text[len(text) - (width - 1 - head) :]


def _fit(widths: list[int], room: int, flexible: list[bool]) -> list[int]:
    """Narrow the widest flexible columns until the row fits ``room`` (or none can give
    more: the line is then longer, and the terminal wraps it)."""
    fitted = list(widths)
    excess = sum(fitted) + len(GAP) * (len(fitted) - 1) - room
    while excess > 0:
        candidates = [i for i, w in enumerate(fitted) if flexible[i] and w > MIN_WIDTH]
        if not candidates:
            break
        widest = max(candidates, key=lambda i: fitted[i])
        others = sorted((fitted[i] for i in candidates if i != widest), reverse=True)
        runner_up = max(others[0] if others else MIN_WIDTH, MIN_WIDTH)
        give = min(excess, max(fitted[widest] - runner_up, 1))
        fitted[widest] -= give
        excess -= give
    return fitted


def render(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    flexible: Collection[str] | None = None,
    width: int | None = -1,
) -> str:
    """The table.  Only the ``flexible`` columns (all when None) are cut to fit ``width``:
    -1 means :func:`available_width`, None means no limit."""
    room = available_width() if width == -1 else width
    texts = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in texts)]) for i, h in enumerate(headers)]
    if room is not None:
        widths = _fit(widths, room, [flexible is None or h in flexible for h in headers])
    lines = [GAP.join(shorten(h, w).ljust(w) for h, w in zip(headers, widths, strict=True))]
    lines += [
        GAP.join(shorten(c, w).ljust(w) for c, w in zip(r, widths, strict=True)) for r in texts
    ]
    return "\n".join(line.rstrip() for line in lines)
