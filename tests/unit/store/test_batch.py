"""A SQL store's batch: which rows it loads, and which it writes back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sidecar.domain.ids import new_attempt_id
from sidecar.domain.model import Lease, TaskState
from sidecar.store.batch import Batch, Probe, Work, changes, decide, wanted
from sidecar.store.commands import (
    AppendCheckpoint,
    ClaimTask,
    Context,
    Heartbeat,
    PruneTask,
    RecordPending,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = Lease("att-1", 1, "worker-a", NOW, NOW + timedelta(seconds=60), 60.0)


def _held() -> Batch:
    """A batch that loaded task 312, held by att-1 (generation 1)."""
    return Batch(
        tasks={"312": TaskState("312", 1, 0, NOW, NOW, LEASE)},
        last_checkpoints={},
        effects={},
    )


def _written(batch: Batch, *works: Work) -> dict[str, int]:
    """How many rows each statement of the batch's write-back gets."""
    outcomes = decide(works, batch, Context(NOW + timedelta(seconds=1), new_attempt_id))
    assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
    return {name: len(params) for name, params in changes(batch)}


def test_a_checkpoint_writes_its_task_row_but_not_the_unchanged_lease():
    written = _written(_held(), AppendCheckpoint("312", "att-1", 1, "S", {"n": 1}))
    assert written == {"upsert_task": 1, "insert_checkpoint": 1}


def test_a_heartbeat_writes_the_lease_it_moved():
    written = _written(_held(), Heartbeat("312", "att-1", 1, 30.0))
    assert written["upsert_lease"] == 1


def test_a_lease_changed_by_any_command_of_the_batch_is_written_once():
    written = _written(
        _held(),
        AppendCheckpoint("312", "att-1", 1, "S", {}),
        Heartbeat("312", "att-1", 1, 30.0),
        AppendCheckpoint("312", "att-1", 1, "T", {}),
    )
    assert written["upsert_lease"] == 1
    assert written["insert_checkpoint"] == 2


def test_the_lease_of_a_task_never_loaded_is_written():
    batch = Batch(tasks={}, last_checkpoints={}, effects={})
    assert _written(batch, ClaimTask("new", "worker-a", 60.0))["upsert_lease"] == 1


def test_a_task_pruned_and_claimed_again_in_one_batch_gets_its_lease_row_back():
    batch = _held()
    batch.delete_task("312")  # as a PruneTask earlier in the batch does
    written = _written(batch, ClaimTask("312", "worker-b", 60.0))
    assert written["delete_task_leases"] == 1
    assert written["upsert_lease"] == 1


def test_wanted_collects_each_row_once_and_skips_probes():
    want = wanted(
        [
            Probe(),
            AppendCheckpoint("b", "att-1", 1, "S", {}),
            AppendCheckpoint("a", "att-1", 1, "S", {}),
            ClaimTask("a", "worker-a", 60.0),
            RecordPending("a", "k", "att-1", 1, "http", "r", "f", None, {}),
            PruneTask("c", NOW),
        ]
    )
    assert want.tasks == ["a", "b", "c"]
    assert want.last_checkpoints == ["a"]
    assert want.effects == [("a", "k")]
    assert want.task_rows == ["c"]
