"""The SQLite writer keeps the task states it read between batches (KnownTasks): a write
by another connection to the same file must still be seen, or fencing would fail."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sidecar.domain.model import EffectState, TaskState
from sidecar.errors import StaleGeneration
from sidecar.runtime.clock import ManualClock
from sidecar.store import rows, sqlfiles
from sidecar.store.sqlite import SQLiteStore

Q = sqlfiles.named_statements("sqlite")

REQUEST = {"database": "x", "statement": "INSERT INTO t VALUES (1)"}


async def _record(store: SQLiteStore, key: str, attempt_id: str, generation: int) -> None:
    await store.record_pending(
        "t",
        key,
        attempt_id,
        generation,
        kind="sql",
        rule="r",
        fingerprint="sha256:" + "0" * 64,
        idempotency_key=None,
        request=REQUEST,
    )


async def test_a_claim_by_another_connection_fences_the_next_batch(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/e.db"
    clock = ManualClock()
    first = SQLiteStore(url, clock=clock)
    second = SQLiteStore(url, clock=clock)
    async with first, second:
        old = await first.claim("t", "a", 10)
        await _record(first, "k1", old.attempt_id, old.generation)  # the task is known now
        clock.advance(60)  # the lease expired: another sidecar on the file takes over
        new = await second.claim("t", "b", 10)
        assert new.generation == old.generation + 1
        with pytest.raises(StaleGeneration):
            await _record(first, "k2", old.attempt_id, old.generation)
        await _record(first, "k2", new.attempt_id, new.generation)
        done = await first.transition_effect(
            "t", "k2", new.attempt_id, new.generation, EffectState.FAILED, detail="x"
        )
        assert done.state is EffectState.FAILED


async def test_a_change_made_outside_any_store_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "e.db"
    async with SQLiteStore(f"sqlite:///{path}") as store:
        claim = await store.claim("t", "a", 600)
        await _record(store, "k1", claim.attempt_id, claim.generation)
        with closing(sqlite3.connect(path)) as db:  # e.g. a repair by hand
            db.execute("UPDATE tasks SET generation = generation + 1")
            db.commit()
        with pytest.raises(StaleGeneration):
            await _record(store, "k2", claim.attempt_id, claim.generation)


async def test_a_task_changed_by_a_batch_is_read_again(tmp_path: Path) -> None:
    async with SQLiteStore(f"sqlite:///{tmp_path}/e.db") as store:
        first = await store.claim("t", "a", 600)
        await _record(store, "k1", first.attempt_id, first.generation)
        await store.release("t", first.attempt_id, first.generation)
        second = await store.claim("t", "b", 600)
        with pytest.raises(StaleGeneration):
            await _record(store, "k2", first.attempt_id, first.generation)
        await _record(store, "k2", second.attempt_id, second.generation)
        view = await store.task_view("t")
        assert view is not None


def _loaded(path: Path, task: str) -> TaskState | None:
    """The task's state as a batch reads it from the file."""
    with closing(sqlite3.connect(path)) as db:
        found = list(db.execute(Q["load_tasks"], (json.dumps([task]),)))
    return rows.task_state(found[0]) if found else None


def _kept(store: SQLiteStore) -> dict[str, TaskState | None]:
    return dict(store._writer._known._states)


async def test_the_state_kept_of_a_task_a_batch_wrote_is_the_state_loading_it_returns(
    tmp_path: Path,
) -> None:
    """The writer keeps what it wrote of a task whose lease it left alone (a checkpoint, a
    mark, a reopening) instead of reading the row back: kept, it must be what a load
    gives, down to how it prints (the clock here starts and moves off whole seconds)."""
    path = tmp_path / "e.db"
    clock = ManualClock(datetime(2026, 1, 1, 14, 0, 0, 123456, tzinfo=UTC))
    async with SQLiteStore(f"sqlite:///{path}", clock=clock) as store:
        claim = await store.claim("t", "a", 600.5)
        steps = [
            lambda: store.append_checkpoint("t", claim.attempt_id, claim.generation, "s1", {}),
            lambda: store.append_checkpoint("t", claim.attempt_id, claim.generation, "s2", [1]),
            lambda: _record(store, "k1", claim.attempt_id, claim.generation),
            lambda: store.mark_done("t", "op", "shipped", (claim.attempt_id, claim.generation)),
            lambda: store.reopen("t", "op", "again"),
        ]
        kept_after_write = 0
        for step in steps:
            clock.advance(0.0000017)
            await step()
            kept = _kept(store)
            if "t" in kept:
                loaded = _loaded(path, "t")
                assert kept["t"] == loaded
                assert repr(kept["t"]) == repr(loaded)
                kept_after_write += 1
        assert kept_after_write >= 3  # the checkpoints and the effect at least


async def test_a_checkpoint_after_a_checkpoint_does_not_read_its_task_again(
    tmp_path: Path,
) -> None:
    """The agent's hot path: each checkpoint moves its task's row, and the next one's
    batch used to read that row back."""
    async with SQLiteStore(f"sqlite:///{tmp_path}/e.db") as store:
        claim = await store.claim("t", "a", 600)
        await store.append_checkpoint("t", claim.attempt_id, claim.generation, "s1", {})
        statements: list[str] = []
        writer = store._writer._db
        assert writer is not None
        await store._on_writer(writer.set_trace_callback, statements.append)  # its own thread
        second = await store.append_checkpoint("t", claim.attempt_id, claim.generation, "s2", {})
        assert second.seq == 2
        assert not [s for s in statements if "FROM tasks" in s], statements
        await store.heartbeat("t", claim.attempt_id, claim.generation)  # moves the lease
        statements.clear()
        third = await store.append_checkpoint("t", claim.attempt_id, claim.generation, "s3", {})
        assert third.seq == 3
        assert [s for s in statements if "FROM tasks" in s]  # read again after a lease change
        with pytest.raises(StaleGeneration):
            await store.append_checkpoint("t", claim.attempt_id, claim.generation + 1, "x", {})
