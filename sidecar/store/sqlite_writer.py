"""The SQLite store's write transaction: one batch of commands, one commit.

Everything here is synchronous and runs on the store's single writer thread, so a whole
batch (BEGIN IMMEDIATE, load, apply, flush, COMMIT) costs one thread round trip instead
of one per statement.  That matters: an aiosqlite call is one round trip (~80 us on a
2-core machine) and a batch needs five statements, which capped the store at a third
of a bare group-commit loop (bench/control_api.py); as one call it stays within 2x.
"""

from __future__ import annotations

import json
import json.encoder
import logging
import os
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from sidecar.domain.model import TaskState
from sidecar.errors import ConfigError, StoreUnavailable, UnstorableValue
from sidecar.store import sqlfiles
from sidecar.store.batch import Batch, Wanted, Work, changes, decide, wanted
from sidecar.store.commands import Context

log = logging.getLogger(__name__)

Q = sqlfiles.named_statements("sqlite")

#: how many task states :class:`KnownTasks` keeps at most (the oldest kept go first).
KNOWN_TASKS = 4096


class KnownTasks:
    """The task states (lease included) this connection read or wrote, so that the next
    batch need not read them again.  A task's effects do not change its row, yet every
    batch re-read it to fence them: the costliest load of an effect's commit; and every
    checkpoint moves its task's row, which the next checkpoint's batch then read back.

    Only what loading would return is kept: a state read from the store (or its
    absence), or one a batch wrote over a lease it left as stored - the row holds what
    the state holds, its times in microseconds as the store's clock gives them (UTC; a
    test holds the two equal).  A task whose lease a batch changed (a claim, a
    heartbeat, a release) or deleted is read again.  It holds only while no
    other connection has committed: ``PRAGMA data_version``, read under the write lock,
    says whether one did (another sidecar on the same file, a repair), and then every
    kept state is dropped.  A batch that fails drops them all too."""

    def __init__(self, limit: int = KNOWN_TASKS) -> None:
        self._limit = limit
        self._states: dict[str, TaskState | None] = {}
        self._version: int | None = None

    def check(self, db: sqlite3.Connection) -> None:
        """Forget every state if another connection committed since the last check (call
        it inside the transaction, once it holds the write lock)."""
        (version,) = db.execute("PRAGMA data_version").fetchone()
        if version != self._version:
            self._states.clear()
            self._version = version

    def split(self, tasks: Iterable[str]) -> tuple[dict[str, TaskState | None], list[str]]:
        """The kept states of ``tasks``, and those of them to read."""
        states = self._states
        known: dict[str, TaskState | None] = {}
        missing: list[str] = []
        for task in tasks:
            if task in states:
                known[task] = states[task]
            else:
                missing.append(task)
        return known, missing

    def keep(self, batch: Batch, tasks: Iterable[str]) -> None:
        """After ``batch`` committed: keep the states of ``tasks`` as it left them, but
        forget those it deleted or changed the lease of."""
        states = self._states
        for task in tasks:
            if task in batch.deleted_tasks:
                states.pop(task, None)
            elif (state := batch.dirty_tasks.get(task)) is None:
                states[task] = batch.tasks.get(task)
            elif task in batch.stored_leases and state.lease == batch.stored_leases[task]:
                states[task] = state
            else:
                states.pop(task, None)
        while len(states) > self._limit:
            del states[next(iter(states))]

    def clear(self) -> None:
        self._states.clear()


class Writer:
    """The writer connection.  Create, use and close it on one thread only."""

    def __init__(self, path: Path, pragmas: Sequence[str]) -> None:
        self.path = path
        self._pragmas = pragmas
        self._db: sqlite3.Connection | None = None
        self._known = KnownTasks()

    @property
    def marker(self) -> Path:
        """Written next to the store once it was first created: if the store is ever
        missing or empty while its marker is there, it was lost, not never made."""
        return self.path.with_name(self.path.name + ".in-use")

    def open(self) -> int:
        """Refuse a store that was lost or is damaged; connect, set the pragmas, migrate;
        return the schema version."""
        try:
            return self._open()
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {exc}") from exc
        except BaseException:
            self.close()
            raise

    def _open(self) -> int:
        if not self.path.parent.exists():
            # Made here, so it is ours to close: the effect log is for this user only.
            self.path.parent.mkdir(mode=0o700, parents=True)
        had_store = self.path.is_file() and self.path.stat().st_size > 0
        if not had_store and self.marker.exists():
            raise StoreUnavailable(
                f"the SQLite store {self.path} was in use (see {self.marker}) and is now "
                "missing or empty: refusing to start with an empty effect log, which would "
                "send every recorded effect again. Restore the file, or delete the marker "
                "to start afresh on purpose."
            )
        # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so the loads and
        # the writes of a batch share one transaction that holds the write lock.
        self._db = sqlite3.connect(self.path, isolation_level=None)
        _owner_only(self.path)
        for pragma in self._pragmas:
            self._db.execute(pragma)
        if had_store:
            check_integrity(self.path)
        version = migrate(self._db)
        if not self.marker.exists():
            self.marker.write_text(f"{self.path}\n", encoding="utf-8")
            self.marker.chmod(0o600)
        return version

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def commit(self, works: Sequence[Work], context: Callable[[], Context]) -> list[Any]:
        """Run the batch in one transaction; each work's result or SidecarError, in order.

        If the transaction itself fails, nothing of it is committed and the whole call
        raises :class:`StoreUnavailable`, or :class:`UnstorableValue` when a value could
        not be bound (a bug in a command raises as itself).
        """
        db = self._db
        if db is None:
            raise StoreUnavailable("the SQLite store is closed")
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                # The batch's time is read once it holds the write lock, which it may have
                # waited for: a claim stamped earlier than the release it waited behind
                # would be recorded before it, and its lease would start in the past.
                ctx = context()
                self._known.check(db)
                want = wanted(works)
                batch = _load(db, want, self._known)
                outcomes = decide(works, batch, ctx)
                for name, params in changes(batch):
                    db.executemany(Q[name], params)
                db.execute("COMMIT")
            except BaseException:
                self._known.clear()
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            self._known.keep(batch, want.tasks)
        except sqlite3.IntegrityError:
            raise  # a broken invariant is a bug, not an outage
        except (OverflowError, UnicodeError) as exc:
            # Binding failed: an integer beyond 64 bits, a string UTF-8 cannot encode.
            raise UnstorableValue(f"the store cannot hold a value of this write: {exc}") from exc
        except (sqlite3.Error, OSError) as exc:
            log.warning("sqlite write failed: %s", exc)
            raise StoreUnavailable(f"SQLite store {self.path} cannot record: {exc}") from exc
        return outcomes


def _owner_only(path: Path) -> None:
    """The store and its WAL and shared-memory files readable by this user only (SQLite
    gives the files it creates later the main file's mode)."""
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if file.exists():
            file.chmod(0o600)


def check_integrity(path: Path) -> None:
    """``PRAGMA quick_check`` (every page and index, not the row contents): a store
    damaged on disk is refused at start, not discovered by the first write to fail.

    The check has a connection of its own, which reads the file memory-mapped: quick_check
    then reads pages in place instead of copying each one out of the page cache (0.36
    against 0.60 s for a 501 MiB store in the page cache, ``bench/store_open.py``).
    Mapped, a read error would kill the process (SIGBUS) instead of raising; the file
    has just been read through, so a disk that cannot read it has said so already, as
    an OSError.
    """
    _read_through(path)
    with closing(sqlite3.connect(path)) as db:
        db.execute(f"PRAGMA mmap_size={path.stat().st_size}")  # SQLite caps it (2 GiB)
        found = [row[0] for row in db.execute("PRAGMA quick_check(5)")]
    if found != ["ok"]:
        raise StoreUnavailable(
            f"the SQLite store {path} is damaged (PRAGMA quick_check: {'; '.join(found)}): "
            "refusing to start; restore it from a backup"
        )


#: how much of the file :func:`_read_through` asks for at a time.
READ_THROUGH_CHUNK = 1 << 20


def _read_through(path: Path) -> None:
    """Read the store front to back, so that quick_check then walks the page cache.

    quick_check reads every page anyway, but in b-tree order, which in a file grown by
    many tasks' effects over time is scattered over the disk: one small random read
    after another. From a page cache that has not seen the file (a node's first start, a
    sidecar rescheduled to another node), a 501 MiB store took 7.0 s to check that way
    and 1.1 s read in order first. The pages it reads are the ones quick_check would
    have brought in; for a file already in the cache, reading it costs ~0.3 ms per MiB.
    """
    chunk = memoryview(bytearray(READ_THROUGH_CHUNK))
    with path.open("rb", buffering=0) as file:
        if hasattr(os, "posix_fadvise"):  # Linux; macOS has none and reads ahead anyway
            # The kernel reads ahead further for a file said to be read in order.
            os.posix_fadvise(file.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while file.readinto(chunk):
            pass


_quote = json.encoder.encode_basestring_ascii  # json.dumps' own, for ensure_ascii=True


def json_strings(values: Iterable[str]) -> str:
    """``json.dumps(list(values))`` for strings, character for character, without setting
    up an encoder per call (a batch's load passes its keys as one JSON array)."""
    return "[" + ", ".join(map(_quote, values)) + "]"


def json_string_pairs(pairs: Iterable[tuple[str, str]]) -> str:
    """``json.dumps([list(p) for p in pairs])`` for pairs of strings, likewise."""
    return "[" + ", ".join([f"[{_quote(a)}, {_quote(b)}]" for a, b in pairs]) + "]"


def _load(db: sqlite3.Connection, want: Wanted, known_tasks: KnownTasks) -> Batch:
    """Read every row the batch's commands will look at that is not known already, in
    four queries at most."""
    known, missing = known_tasks.split(want.tasks)

    def rows_of(name: str, keys: str) -> list[Any]:
        return list(db.execute(Q[name], (keys,)))

    return Batch.loaded(
        rows_of("load_tasks", json_strings(missing)) if missing else [],
        (
            rows_of("load_last_checkpoints", json_strings(want.last_checkpoints))
            if want.last_checkpoints
            else []
        ),
        rows_of("load_effects", json_string_pairs(want.effects)) if want.effects else [],
        rows_of("load_task_rows", json_strings(want.task_rows)) if want.task_rows else [],
        known_tasks=known,
    )


def migrate(db: sqlite3.Connection) -> int:
    """Bring the database to the newest schema version and return that version.

    A fresh file gets ``schema.sql``; an older one gets the numbered migrations it lacks.
    ``PRAGMA user_version`` holds the version and is written in the same transaction.
    """
    migrations = sqlfiles.migrations("sqlite")
    latest = migrations[-1].version
    db.execute("BEGIN IMMEDIATE")
    try:
        (version,) = db.execute("PRAGMA user_version").fetchone()
        (tables,) = db.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()
        if version > latest:
            raise ConfigError(
                f"store schema version {version} is newer than this sidecar knows ({latest})"
            )
        if version == 0 and tables == 0:
            _run_script(db, sqlfiles.read("sqlite", "schema.sql"))
        else:
            for migration in migrations[version:]:
                log.info("applying store migration %s", migration.name)
                _run_script(db, migration.sql)
        db.execute(f"PRAGMA user_version={latest}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    return latest


def _run_script(db: sqlite3.Connection, script: str) -> None:
    # executescript() would COMMIT first; run statement by statement inside our BEGIN.
    for statement in statements(script):
        db.execute(statement)


def statements(script: str) -> list[str]:
    """Split a SQL script into complete statements (comments stay with the next one)."""
    out: list[str] = []
    current: list[str] = []
    for line in script.splitlines(keepends=True):
        current.append(line)
        if sqlite3.complete_statement("".join(current)):
            out.append("".join(current).strip())
            current = []
    rest = "".join(current).strip()
    if rest and not all(ln.strip().startswith("--") for ln in rest.splitlines() if ln.strip()):
        raise ValueError(f"incomplete SQL statement at end of script: {rest[:80]!r}")
    return out
