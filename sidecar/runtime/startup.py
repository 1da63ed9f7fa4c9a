"""A long-running process's start-up, made cheaper: the objects it builds to keep are not
scanned over and over by the garbage collector, and the memory it freed is handed back.

Importing the sidecar creates ~100,000 objects that live as long as the process
(modules, classes, functions, pydantic schemas).  With the collector's default
thresholds, every tenth collection of the youngest generation also scans everything
that survived the ones before, again and again while the rest is still being imported:
30-45 ms of a ~0.7 s start-up, to free next to nothing.  :func:`begin` keeps collecting
the youngest generation as usual (the start-up's short-lived garbage is freed, and its
memory reused, as before) but not the older ones; :func:`started` moves everything
alive then into the permanent generation (``gc.freeze``: never scanned again, which also
spares every later full collection those objects), restores the thresholds and gives
free heap memory back to the system (glibc's ``malloc_trim``).  Only a process that
called :func:`begin` has its collector changed: tests that start a sidecar in their own
process do not.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

#: The older generations' threshold while the start-up runs: more collections of the
#: youngest one than a start-up makes, so none of the older ones is collected.
_NOT_DURING_START_UP = 1_000_000


class _Collector:
    #: The thresholds :func:`begin` replaced, while the start-up runs.
    thresholds: tuple[int, int, int] | None = None


def begin() -> None:
    """Until :func:`started` (or :func:`abandoned`), collect the youngest generation only."""
    if _Collector.thresholds is None and gc.isenabled():
        young, older, oldest = gc.get_threshold()
        _Collector.thresholds = (young, older, oldest)
        gc.set_threshold(young, _NOT_DURING_START_UP, oldest)


def abandoned() -> None:
    """The start-up ended without the process being ready: the thresholds restored."""
    if _Collector.thresholds is not None:
        gc.set_threshold(*_Collector.thresholds)
        _Collector.thresholds = None


def started() -> None:
    """The start-up is over: freeze what it built, restore the collector's thresholds,
    give free memory back."""
    if _Collector.thresholds is not None:
        gc.freeze()
        abandoned()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``: returns the free pages at the top of each heap (and whole
    free pages inside it) to the system. None elsewhere (musl, macOS)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # noqa: PLC0415 - once, at the end of start-up

    try:
        libc = ctypes.CDLL("libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    return trim
