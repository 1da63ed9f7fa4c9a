"""Durable writes the way the benchmarks' references make them (not a benchmark itself).

sqlite3 in WAL with ``synchronous=FULL``; every write is queued, and one committer takes
every write waiting and commits them in one transaction in a worker thread (group
commit), each statement's rows with one ``executemany``, then each step queued (a
function of the connection whose result its caller needs, such as a fenced append) in
order.  No domain logic, no audit, no metrics: what a durable write costs in Python and
nothing more.  Used by the control API's in-process loop (``control_api.py``) and
reference server (``group_commit_server.py``), and by the proxy's floor
(``_floor_proxy.py``).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

type Params = tuple[Any, ...]
#: Run on the connection inside a batch's transaction; what it returns is its result.
type Step = Callable[[sqlite3.Connection], Any]
#: A statement and its row, or a step; and the future its result goes to.
type Job = tuple[str | Step, Params, asyncio.Future[Any]]


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

    def write(self, sql: str, params: Params) -> asyncio.Future[Any]:
        """Queue one statement; the future set once the transaction holding it is
        committed (a plain function: no coroutine frame per write to create and resume)."""
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((sql, params, done))
        return done

    def apply(self, step: Step) -> asyncio.Future[Any]:
        """Queue ``step``; the future holds its result once its transaction is committed."""
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((step, (), done))
        return done

    def _commit(self, writes: dict[str, list[Params]], steps: list[Step]) -> list[Any]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for sql, rows in writes.items():
                self._db.executemany(sql, rows)
            results = [step(self._db) for step in steps]
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
        return results

    async def _run(self) -> None:
        while True:
            jobs = [await self._queue.get()]
            while not self._queue.empty():
                jobs.append(self._queue.get_nowait())
            writes: dict[str, list[Params]] = {}
            steps: list[Step] = []
            for what, params, _ in jobs:
                if isinstance(what, str):
                    writes.setdefault(what, []).append(params)
                else:
                    steps.append(what)
            try:
                results = iter(await asyncio.to_thread(self._commit, writes, steps))
            except Exception as failed:  # the batch's writers see it; the queue goes on
                for _, _, done in jobs:
                    done.set_exception(failed)
                continue
            for what, _, done in jobs:
                done.set_result(None if isinstance(what, str) else next(results))
