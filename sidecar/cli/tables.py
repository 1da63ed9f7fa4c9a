"""Plain-text tables for the terminal."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    return str(value)


def render(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    texts = [[cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in texts)]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in texts]
    return "\n".join(lines)
