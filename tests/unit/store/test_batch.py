"""A SQL store's batch: which rows it loads, and which it writes back."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sidecar.domain.ids import new_attempt_id
from sidecar.domain.model import AgentExit, Lease, TaskState
from sidecar.store.batch import Batch, Probe, Work, changes, decide, wanted
from sidecar.store.commands import (
    AppendCheckpoint,
    ClaimTask,
    Context,
    Heartbeat,
    PruneTask,
    RecordPending,
    Release,
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


def _changes_as_before(batch: Batch) -> list[tuple[str, list[tuple[object, ...]]]]:
    """changes() as it was written before it tested each step first: the reference the
    faster one must match, statement for statement and row for row."""
    from sidecar.store import rows  # noqa: PLC0415
    from sidecar.store.commands import ROW_KINDS  # noqa: PLC0415

    gone = [(task,) for task in batch.deleted_tasks]
    probed = [] if batch.probed_at is None else [(rows.to_us(batch.probed_at),)]
    steps: list[tuple[str, list[tuple[object, ...]]]] = [
        ("probe_insert", probed),
        ("probe_delete", [() for _ in probed]),
        *((f"delete_task_{table}", gone) for table in (*ROW_KINDS[:-1], "leases", "attempts")),
        ("delete_task_tasks", gone),
        ("upsert_task", [rows.task_params(s) for s in batch.dirty_tasks.values()]),
        ("insert_attempt", [rows.attempt_params(a) for a in batch.new_attempts]),
        (
            "end_attempt",
            [
                (rows.to_us(at), reason.value, rows.to_us(until), aid)
                for aid, at, reason, until in batch.ended_attempts
            ],
        ),
        ("note_attempt_exit", [rows.exit_params(*noted) for noted in batch.noted_exits]),
        (
            "upsert_lease",
            [
                rows.lease_params(s.task, s.lease)
                for s in batch.dirty_tasks.values()
                if s.lease is not None and s.lease != batch.stored_leases.get(s.task)
            ],
        ),
        ("insert_checkpoint", [rows.checkpoint_params(c) for c in batch.new_checkpoints]),
        ("upsert_effect", [rows.effect_params(e) for e in batch.dirty_effects.values()]),
        ("insert_event", [rows.event_params(e) for e in batch.new_events]),
        ("insert_refusal", [rows.refusal_params(r) for r in batch.new_refusals]),
    ]
    return [(name, params) for name, params in steps if params]


def _two_tasks() -> Batch:
    batch = _held()
    batch.tasks["9"] = TaskState("9", 1, 0, NOW, NOW, LEASE)
    batch.stored_leases["9"] = LEASE
    return batch


@pytest.mark.parametrize(
    ("deleted", "works"),
    [
        ((), ()),
        ((), (Probe(),)),
        ((), (AppendCheckpoint("312", "att-1", 1, "S", {"n": 1}),)),
        (
            (),
            (
                AppendCheckpoint("312", "att-1", 1, "S", {"é": "\ud800"}),
                AppendCheckpoint("312", "att-1", 7, "S", {}),  # stale: a refusal row
                Heartbeat("312", "att-1", 1, 30.0),
                RecordPending("312", "k", "att-1", 1, "http", "r", "f", None, {"a": [1]}),
                Release("312", "att-1", 1, AgentExit(3, None, None, False)),
                ClaimTask("new", "worker-b", 60.0),
                Probe(),
            ),
        ),
        (("9",), (ClaimTask("9", "worker-b", 60.0), PruneTask("x", NOW))),
        (("9", "312"), (Probe(),)),
    ],
)
def test_changes_lists_the_same_statements_and_rows_as_before(deleted, works):
    batch = _two_tasks()
    for task in deleted:
        batch.delete_task(task)
    decide(works, batch, Context(NOW + timedelta(seconds=1), new_attempt_id))
    assert changes(batch) == _changes_as_before(batch)
