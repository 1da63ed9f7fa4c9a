"""The SQLite writer keeps the task states it read between batches (KnownTasks): a write
by another connection to the same file must still be seen, or fencing would fail."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from sidecar.domain.model import EffectState
from sidecar.errors import StaleGeneration
from sidecar.runtime.clock import ManualClock
from sidecar.store.sqlite import SQLiteStore

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
