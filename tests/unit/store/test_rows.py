"""Rows to records and back: the faster conversions give what the plain ones give."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from sidecar.domain.model import Lease, Mark, TaskState
from sidecar.store import rows
from sidecar.store.sqlite_writer import json_string_pairs, json_strings

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    "us", [0, 1, -1, 1_764_666_390_123_456, 253_402_300_799_999_999, -62_135_596_800_000_000]
)
def test_times_convert_as_timedelta_microseconds_does(us):
    at = rows.from_us(us)
    assert at == EPOCH + timedelta(microseconds=us)
    assert at.tzinfo is UTC
    assert rows.to_us(at) == us


def _task_state_as_before(row: rows.Row) -> TaskState:
    """rows.task_state as it was written before (keywords, helpers): the reference."""
    (task, generation, seq, created, updated, attempt_id, lease_gen, worker, acq, exp, ttl, rel) = (
        row[:12]
    )
    done_at, done_by, done_note, reopened_at, reopened_by, reopened_note = row[12:18]

    def t(us: int | None) -> datetime | None:
        return None if us is None else EPOCH + timedelta(microseconds=us)

    def mark(at: int | None, by: str | None, note: str | None) -> Mark | None:
        return None if at is None else Mark(EPOCH + timedelta(microseconds=at), by or "", note)

    lease = (
        None
        if attempt_id is None
        else Lease(
            attempt_id=attempt_id,
            generation=lease_gen,
            worker=worker,
            acquired_at=EPOCH + timedelta(microseconds=acq),
            expires_at=EPOCH + timedelta(microseconds=exp),
            ttl_s=ttl,
            released_at=t(rel),
        )
    )
    return TaskState(
        task,
        generation,
        seq,
        EPOCH + timedelta(microseconds=created),
        EPOCH + timedelta(microseconds=updated),
        lease,
        mark(done_at, done_by, done_note),
        mark(reopened_at, reopened_by, reopened_note),
    )


T0 = 1_764_666_386_000_000
NO_MARKS = (None,) * 6


@pytest.mark.parametrize(
    "row",
    [
        ("t", 0, 0, T0, T0, *(None,) * 7, *NO_MARKS),
        ("t", 3, 17, T0, T0 + 5, "att", 3, "w", T0, T0 + 60, 60.0, None, *NO_MARKS),
        ("t", 3, 17, T0, T0 + 5, "att", 3, "w", T0, T0 + 60, 60.0, T0 + 9, *NO_MARKS),
        ("t", 3, 17, T0, T0 + 5, "att", 3, "w", T0, T0 + 60, 60.0, T0 + 9, T0 + 9, "op", "why",
         T0 + 10, None, "again"),
        ("t", 1, 0, T0, T0, *(None,) * 7, T0, "", None, None, None, None),
    ],
)  # fmt: skip
def test_a_loaded_task_is_what_the_plain_conversion_makes(row):
    assert rows.task_state(row) == _task_state_as_before(row)


@pytest.mark.parametrize(
    "values", [[], ["a"], ["bench", "task-2", "x.y:z@w"], ["é", "\ud800", 'q"uote\\', "\n"]]
)
def test_json_strings_are_what_json_dumps_writes(values):
    assert json_strings(values) == json.dumps(values)
    pairs = list(zip(values, reversed(values), strict=True))
    assert json_string_pairs(pairs) == json.dumps([list(p) for p in pairs])
