"""``sqlite:///path``: the embedded default store (WAL, group commit).

All writes go through one queue (:mod:`.group_commit`) and one writer thread.  The
writer takes every command waiting in the queue, runs them in ONE ``BEGIN IMMEDIATE``
transaction (load the rows they touch, apply the shared commands, flush the changes with
``executemany``) and commits once (:mod:`.sqlite_writer`): a single fsync makes the whole
batch durable, and each caller is answered only after that commit.  Group commit gives
32 concurrent writers ~20x the throughput of a transaction each, at no cost in
durability.
Reads go through aiosqlite on a second, read-only connection, which WAL lets run
beside the writer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from sidecar.domain.ids import new_attempt_id
from sidecar.errors import ConfigError, StoreUnavailable
from sidecar.runtime.clock import Clock
from sidecar.store import sqlfiles
from sidecar.store.base import StoreInfo
from sidecar.store.batch import Work
from sidecar.store.group_commit import GroupCommit, GroupCommitStore
from sidecar.store.sql_reads import SQLReads
from sidecar.store.sqlite_writer import Writer

log = logging.getLogger(__name__)

Q = sqlfiles.named_statements("sqlite")

# Set on every connection (pragmas are per connection, except journal_mode); the values in
# braces come from the constructor.
_WRITER_PRAGMAS = (
    # WAL: readers never block the writer nor the writer them, and a commit appends to
    # one file instead of rewriting pages in place.
    "PRAGMA journal_mode=WAL",
    # FULL in WAL mode fsyncs the WAL at every commit, so a write acknowledged to a caller
    # survives power loss and kernel panics, not only the death of this process (NORMAL
    # would).  Group commit pays that one fsync per batch, not per write; the cost is in
    # bench/control_api.py and docs/benchmarks.md.
    "PRAGMA synchronous={synchronous}",
    # The schema's foreign keys catch a store bug before it corrupts the audit trail.
    "PRAGMA foreign_keys=ON",
    # Another process may hold the write lock for a moment (a second sidecar on the same
    # file, a `sidecar tasks` reader checkpointing the WAL): wait for it, then fail closed.
    "PRAGMA busy_timeout={busy_ms}",
)
_READER_PRAGMAS = ("PRAGMA query_only=ON", "PRAGMA busy_timeout={busy_ms}")

MAX_BATCH = 256


def path_from_url(url: str) -> Path:
    """``sqlite:///abs/path.db`` or ``sqlite:///rel/path.db``; anything else is refused."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or len(url) == len(prefix):
        raise ConfigError(f"not a SQLite store URL (want sqlite:///path/to/file.db): {url!r}")
    rest = url[len(prefix) :]
    # sqlite:////abs/path and sqlite:///rel/path, as SQLAlchemy reads them.
    return Path(rest)


type _Call = tuple[
    asyncio.AbstractEventLoop, asyncio.Future[Any], Callable[..., Any], tuple[Any, ...]
]


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return  # its caller went away
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


class OneThread:
    """One thread that runs the calls given to it in order, each answered on the event
    loop that asked: what ``loop.run_in_executor`` on a one-thread pool does, in one hop
    each way.  The pool's hop also builds a ``concurrent.futures.Future`` (a condition
    variable and its locks), a work item and a chained asyncio future, and takes two
    locks and a semaphore per call, on both threads; a store batch pays it every commit
    (bench/control_api.py).  As with the pool, a call whose future was cancelled before
    it started does not run.  A daemon thread, so that a store never closed cannot hold
    the process open; :meth:`stop` runs what was queued, then ends it."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """``fn(*args)`` on the thread; the future of what it returns or raises."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        self._calls.put((loop, future, fn, args))
        return future

    def _serve(self) -> None:
        calls = self._calls
        while (call := calls.get()) is not None:
            loop, future, fn, args = call
            if future.cancelled():
                continue
            result: Any = None
            error: BaseException | None = None
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller, as the pool does
                error = exc
            with contextlib.suppress(RuntimeError):  # a closed loop: no one left to answer
                loop.call_soon_threadsafe(_settle, future, result, error)
            del call, future, result, error  # not kept alive until the next call

    def stop(self) -> None:
        """Run what is queued, then end the thread (returns once it has)."""
        self._calls.put(None)
        self._thread.join()


class SQLiteStore(SQLReads, GroupCommitStore):
    _closed = "the SQLite store is not open"

    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        new_attempt_id: Callable[[], str] = new_attempt_id,
        synchronous: str = "FULL",
        read_only: bool = False,
        busy_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(url, clock=clock, new_attempt_id=new_attempt_id)
        self.path = path_from_url(url)
        if synchronous.upper() not in {"OFF", "NORMAL", "FULL", "EXTRA"}:
            raise ConfigError(f"unknown SQLite synchronous mode {synchronous!r}")
        self._synchronous = synchronous
        self._read_only = read_only
        values = {"synchronous": synchronous, "busy_ms": int(busy_timeout_s * 1000)}
        self._writer = Writer(self.path, [p.format(**values) for p in _WRITER_PRAGMAS])
        self._reader_pragmas = [p.format(**values) for p in _READER_PRAGMAS]
        # One thread, so the writer connection is only ever used from the thread that made it.
        self._writer_thread: OneThread | None = None
        self._reader: aiosqlite.Connection | None = None
        self._schema_version = 0

    # ---- lifecycle ---------------------------------------------------------------

    async def open(self) -> None:
        if self._read_only:
            await self._open_reader(read_only=True)
            return
        self._writer_thread = OneThread("sqlite-writer")
        try:
            self._schema_version = await self._on_writer(self._writer.open)
            await self._open_reader(read_only=False)
        except BaseException:
            await self.close()
            raise
        self._writes = GroupCommit(
            self._commit,
            name=f"sqlite:{self.path}",
            max_batch=MAX_BATCH,
        )
        self._writes.start()

    async def _open_reader(self, *, read_only: bool) -> None:
        """The read connection; for inspection it never creates, migrates or writes."""
        if read_only and not self.path.is_file():
            raise StoreUnavailable(f"no store at {self.path}")
        try:
            uri = f"file:{self.path.absolute()}?mode=ro"
            self._reader = await aiosqlite.connect(uri, uri=True, isolation_level=None)
            for pragma in self._reader_pragmas:
                await self._reader.execute(pragma)
            (version,) = next(iter(await self._reader.execute_fetchall("PRAGMA user_version")))
        except (sqlite3.Error, OSError) as exc:
            await self.close()
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {exc}") from exc
        latest = sqlfiles.migrations("sqlite")[-1].version
        if version != latest:
            await self.close()
            raise StoreUnavailable(
                f"store {self.path} has schema version {version}, this sidecar reads {latest}"
            )
        self._schema_version = version

    async def close(self) -> None:
        """Commit what is queued, then close both connections."""
        if self._writes is not None:
            await self._writes.stop()
            self._writes = None
        if self._reader is not None:
            with contextlib.suppress(sqlite3.Error):
                await self._reader.close()
            self._reader = None
        if self._writer_thread is not None:
            await self._on_writer(self._writer.close)
            self._writer_thread.stop()
            self._writer_thread = None

    async def _on_writer[R](self, fn: Callable[..., R], *args: Any) -> R:
        assert self._writer_thread is not None
        result: R = await self._writer_thread.call(fn, *args)
        return result

    async def info(self) -> StoreInfo:
        return StoreInfo(
            url=self.url,
            backend="sqlite",
            schema_version=self._schema_version,
            durable=self._synchronous.upper() in {"FULL", "EXTRA"},
        )

    # ---- writes ------------------------------------------------------------------

    def _commit(self, works: list[Work]) -> asyncio.Future[list[Any]]:
        # The writer thread's future itself, which the group commit awaits: no coroutine
        # in between, on the path of every batch.
        if self._writer_thread is None:
            raise StoreUnavailable(self._closed)
        return self._writer_thread.call(self._writer.commit, works, self._context)

    # ---- reads -------------------------------------------------------------------

    async def _fetch(self, name: str, params: Iterable[Any] = ()) -> list[Any]:
        if self._reader is None:
            raise StoreUnavailable("the SQLite store is not open")
        try:
            return list(await self._reader.execute_fetchall(Q[name], tuple(params)))
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(f"SQLite store {self.path} cannot be read: {exc}") from exc

    @staticmethod
    def _tasks_param(tasks: Sequence[str]) -> tuple[Any, ...]:
        return (json.dumps(list(tasks)),)

    @staticmethod
    def _effect_keys_param(keys: Sequence[tuple[str, str]]) -> tuple[Any, ...]:
        return (json.dumps([list(k) for k in keys]),)
