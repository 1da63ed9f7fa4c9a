"""Background tasks through one helper that names them and keeps a reference; and the
signals that stop a long-running process.

asyncio only keeps weak references to tasks; a task nobody holds can be collected
mid-flight.  Every long-lived task of the sidecar is started here.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)
_running: set[asyncio.Task[Any]] = set()


def spawn[T](coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
    """Start ``coro`` as a named task; log it if it dies of an unexpected error."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _running.add(task)
    task.add_done_callback(_finished)
    return task


def _finished(task: asyncio.Task[Any]) -> None:
    _running.discard(task)
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("background task %s died", task.get_name(), exc_info=exc)


def stop_on_signals(stop: asyncio.Event) -> None:
    """Set ``stop`` when the process gets SIGTERM or SIGINT (a process's orderly end)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
