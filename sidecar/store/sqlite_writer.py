"""The SQLite store's write transaction: one batch of commands, one commit.

Everything here is synchronous and runs on the store's single writer thread, so a whole
batch (BEGIN IMMEDIATE, load, apply, flush, COMMIT) costs one thread round trip instead
of one per statement.  That matters: an aiosqlite call is one round trip (~80 us on a
2-core machine) and a batch needs five statements, which capped the store at a third
of a bare group-commit loop (bench/control_api.py); as one call it stays within 2x.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sidecar.domain.model import (
    Attempt,
    AttemptEnd,
    Checkpoint,
    Effect,
    EffectEvent,
    FenceRefusal,
    TaskState,
)
from sidecar.errors import ConfigError, SidecarError, StoreUnavailable
from sidecar.store import rows, sqlfiles
from sidecar.store.commands import Command, Context

log = logging.getLogger(__name__)

Q = sqlfiles.named_statements("sqlite")


class Probe:
    """Batch marker: prove the store writable (insert + delete inside the transaction)."""


type Work = Command[Any] | Probe


@dataclass
class Batch:
    """The WorkingSet of one write transaction: rows loaded up front, changes staged."""

    tasks: dict[str, TaskState | None]
    last_checkpoints: dict[str, Checkpoint | None]
    effects: dict[tuple[str, str], Effect | None]
    dirty_tasks: dict[str, TaskState] = field(default_factory=dict)
    new_attempts: list[Attempt] = field(default_factory=list)
    ended_attempts: list[tuple[str, datetime, AttemptEnd, datetime]] = field(default_factory=list)
    new_checkpoints: list[Checkpoint] = field(default_factory=list)
    dirty_effects: dict[tuple[str, str], Effect] = field(default_factory=dict)
    new_events: list[EffectEvent] = field(default_factory=list)
    new_refusals: list[FenceRefusal] = field(default_factory=list)

    def task(self, task: str) -> TaskState | None:
        return self.tasks.get(task)

    def put_task(self, state: TaskState) -> None:
        self.tasks[state.task] = state
        self.dirty_tasks[state.task] = state

    def add_attempt(self, attempt: Attempt) -> None:
        self.new_attempts.append(attempt)

    def end_attempt(
        self, attempt_id: str, at: datetime, reason: AttemptEnd, lease_until: datetime
    ) -> None:
        self.ended_attempts.append((attempt_id, at, reason, lease_until))

    def last_checkpoint(self, task: str) -> Checkpoint | None:
        return self.last_checkpoints.get(task)

    def add_checkpoint(self, checkpoint: Checkpoint) -> None:
        self.last_checkpoints[checkpoint.task] = checkpoint
        self.new_checkpoints.append(checkpoint)

    def effect(self, task: str, key: str) -> Effect | None:
        return self.effects.get((task, key))

    def put_effect(self, effect: Effect) -> None:
        self.effects[(effect.task, effect.key)] = effect
        self.dirty_effects[(effect.task, effect.key)] = effect

    def add_event(self, event: EffectEvent) -> None:
        self.new_events.append(event)

    def add_refusal(self, refusal: FenceRefusal) -> None:
        self.new_refusals.append(refusal)


class Writer:
    """The writer connection.  Create, use and close it on one thread only."""

    def __init__(self, path: Path, pragmas: Sequence[str]) -> None:
        self.path = path
        self._pragmas = pragmas
        self._db: sqlite3.Connection | None = None

    def open(self) -> int:
        """Connect, set the pragmas, migrate; return the schema version."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we issue BEGIN IMMEDIATE ourselves, so the loads and
            # the writes of a batch share one transaction that holds the write lock.
            self._db = sqlite3.connect(self.path, isolation_level=None)
            for pragma in self._pragmas:
                self._db.execute(pragma)
            return migrate(self._db)
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {exc}") from exc
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def commit(self, works: Sequence[Work], ctx: Context) -> list[Any]:
        """Run the batch in one transaction; each work's result or SidecarError, in order.

        If the transaction itself fails, nothing of it is committed and the whole call
        raises :class:`StoreUnavailable` (a bug in a command raises as itself).
        """
        db = self._db
        if db is None:
            raise StoreUnavailable("the SQLite store is closed")
        commands = [w for w in works if isinstance(w, Command)]
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                batch = _load(db, commands)
                outcomes: list[Any] = []
                for work in works:
                    if isinstance(work, Probe):
                        db.execute(Q["probe_insert"], (rows.to_us(ctx.now),))
                        db.execute(Q["probe_delete"])
                        outcomes.append(None)
                        continue
                    try:
                        outcomes.append(work.apply(batch, ctx))
                    except SidecarError as refused:
                        outcomes.append(refused)
                _flush(db, batch)
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.IntegrityError:
            raise  # a broken invariant is a bug, not an outage
        except (sqlite3.Error, OSError) as exc:
            log.warning("sqlite write failed: %s", exc)
            raise StoreUnavailable(f"SQLite store {self.path} cannot record: {exc}") from exc
        return outcomes


def _load(db: sqlite3.Connection, commands: list[Command[Any]]) -> Batch:
    """Read every row the batch's commands will look at, in three queries at most."""
    task_names = sorted({c.task for c in commands})
    claimed = sorted({c.task for c in commands if c.needs_last_checkpoint})
    effect_keys = sorted({k for c in commands if (k := c.effect_key()) is not None})
    tasks: dict[str, TaskState | None] = {}
    if task_names:
        for row in db.execute(Q["load_tasks"], (json.dumps(task_names),)):
            state = rows.task_state(row)
            tasks[state.task] = state
    last: dict[str, Checkpoint | None] = {}
    if claimed:
        for row in db.execute(Q["load_last_checkpoints"], (json.dumps(claimed),)):
            checkpoint = rows.checkpoint(row)
            last[checkpoint.task] = checkpoint
    effects: dict[tuple[str, str], Effect | None] = {}
    if effect_keys:
        for row in db.execute(Q["load_effects"], (json.dumps([list(k) for k in effect_keys]),)):
            effect = rows.effect(row)
            effects[(effect.task, effect.key)] = effect
    return Batch(tasks=tasks, last_checkpoints=last, effects=effects)


def _flush(db: sqlite3.Connection, batch: Batch) -> None:
    """Write what the batch changed, one executemany per table, parents first."""
    steps: list[tuple[str, list[tuple[Any, ...]]]] = [
        ("upsert_task", [rows.task_params(s) for s in batch.dirty_tasks.values()]),
        ("insert_attempt", [rows.attempt_params(a) for a in batch.new_attempts]),
        (
            "end_attempt",
            [
                (rows.to_us(at), reason.value, rows.to_us(until), aid)
                for aid, at, reason, until in batch.ended_attempts
            ],
        ),
        (
            "upsert_lease",
            [
                rows.lease_params(s.task, s.lease)
                for s in batch.dirty_tasks.values()
                if s.lease is not None
            ],
        ),
        ("insert_checkpoint", [rows.checkpoint_params(c) for c in batch.new_checkpoints]),
        ("upsert_effect", [rows.effect_params(e) for e in batch.dirty_effects.values()]),
        ("insert_event", [rows.event_params(e) for e in batch.new_events]),
        ("insert_refusal", [rows.refusal_params(r) for r in batch.new_refusals]),
    ]
    for name, params in steps:
        if params:
            db.executemany(Q[name], params)


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
