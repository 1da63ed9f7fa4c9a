"""Durable writes the way the benchmarks' references make them (not a benchmark itself).

sqlite3 in WAL with ``synchronous=FULL``; every write is queued, and one committer takes
every write waiting and commits them in one transaction in a worker thread (group
commit), each statement's rows with one ``executemany``.  No domain logic, no audit, no
metrics: what a durable write costs in Python and nothing more.  Used by the control
API's in-process loop (``control_api.py``) and reference server
(``group_commit_server.py``), and by the proxy's floor (``_floor_proxy.py``).
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

type Params = tuple[Any, ...]
type Job = tuple[str, Params, asyncio.Future[None]]


def open_db(path: Path, *schema: str) -> sqlite3.Connection:
    """``path`` in WAL with ``synchronous=FULL``, with the ``schema`` statements run."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    for statement in schema:
        db.execute(statement)
    return db


class GroupCommitter:
    """The write queue of one database and the task that commits it."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._queue: asyncio.Queue[Job] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def write(self, sql: str, params: Params) -> asyncio.Future[None]:
        """Queue one statement; the future set once the transaction holding it is
        committed (a plain function: no coroutine frame per write to create and resume)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((sql, params, done))
        return done

    def _commit(self, writes: dict[str, list[Params]]) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        for sql, rows in writes.items():
            self._db.executemany(sql, rows)
        self._db.execute("COMMIT")

    async def _run(self) -> None:
        while True:
            jobs = [await self._queue.get()]
            while not self._queue.empty():
                jobs.append(self._queue.get_nowait())
            writes: dict[str, list[Params]] = {}
            for sql, params, _ in jobs:
                writes.setdefault(sql, []).append(params)
            await asyncio.to_thread(self._commit, writes)
            for _, _, done in jobs:
                done.set_result(None)
