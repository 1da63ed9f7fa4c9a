"""Turning stored rows into domain records and back, for the SQL stores.

Rows arrive as tuples in the column order of the named statements.  Times are integer
microseconds since the epoch on SQLite (exact, unlike REAL seconds) and are converted
here so the rest of the code only sees aware ``datetime`` values.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sidecar.domain.model import (
    AgentExit,
    Attempt,
    AttemptEnd,
    Checkpoint,
    Effect,
    EffectEvent,
    EffectState,
    FenceRefusal,
    Lease,
    Mark,
    RecordedResponse,
    TaskState,
)
from sidecar.domain.text import scrubbed

type Row = Sequence[Any]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
# One encoder for every row: json.dumps(separators=...) would build a new one per call,
# which showed up as the largest cost of a checkpoint write after the fsync.
_compact_json = json.JSONEncoder(separators=(",", ":")).encode
# A stored state by its value: EffectState(value) goes through Enum's Python-level
# __call__, several times the cost of this lookup, for every effect loaded (the
# table's CHECK constraint admits only these values).
_EFFECT_STATES = {state.value: state for state in EffectState}


def _from_json(text: str) -> Any:
    """A stored JSON value; one stored before the door refused lone surrogates comes back
    with them replaced, so that reading it can never fail an answer."""
    value = json.loads(text)
    # ensure_ascii wrote every non-ASCII character as an escape: no "\\ud", no surrogate.
    return scrubbed(value) if "\\ud" in text or "\\uD" in text else value


def to_us(at: datetime) -> int:
    return (at - _EPOCH) // _MICROSECOND


def from_us(us: int) -> datetime:
    # timedelta(0, 0, us) is timedelta(microseconds=us) without the keyword's cost: every
    # time of every loaded row comes through here.
    return _EPOCH + timedelta(0, 0, us)


def _opt_time(us: int | None) -> datetime | None:
    return None if us is None else from_us(us)


def _opt_us(at: datetime | None) -> int | None:
    return None if at is None else to_us(at)


def _mark(at: int | None, by: str | None, note: str | None) -> Mark | None:
    return None if at is None else Mark(from_us(at), by or "", note)


def _mark_params(mark: Mark | None) -> tuple[Any, ...]:
    return (None, None, None) if mark is None else (to_us(mark.at), mark.by, mark.note)


def task_state(row: Row) -> TaskState:
    (task, generation, seq, created, updated, attempt_id, lease_gen, worker, acq, exp, ttl, rel) = (
        row[:12]
    )
    done_at, done_by, done_note, reopened_at, reopened_by, reopened_note = row[12:18]
    # Lease's fields in order: attempt_id, generation, worker, acquired_at, expires_at,
    # ttl_s, released_at (positional: every batch loads its tasks through here).
    lease = (
        None
        if attempt_id is None
        else Lease(
            attempt_id,
            lease_gen,
            worker,
            from_us(acq),
            from_us(exp),
            ttl,
            None if rel is None else from_us(rel),
        )
    )
    return TaskState(
        task,
        generation,
        seq,
        from_us(created),
        from_us(updated),
        lease,
        None if done_at is None else _mark(done_at, done_by, done_note),
        None if reopened_at is None else _mark(reopened_at, reopened_by, reopened_note),
    )


def task_params(state: TaskState) -> tuple[Any, ...]:
    return (
        state.task,
        state.generation,
        state.checkpoint_seq,
        to_us(state.created_at),
        to_us(state.updated_at),
        *_mark_params(state.done),
        *_mark_params(state.reopened),
    )


def lease_params(task: str, lease: Lease) -> tuple[Any, ...]:
    return (
        task,
        lease.attempt_id,
        lease.generation,
        lease.worker,
        to_us(lease.acquired_at),
        to_us(lease.expires_at),
        lease.ttl_s,
        _opt_us(lease.released_at),
    )


def attempt(row: Row) -> Attempt:
    (
        attempt_id,
        task,
        generation,
        worker,
        claimed,
        ended,
        reason,
        until,
        exit_code,
        exit_signal,
        exit_error,
        lease_lost,
    ) = row
    reported = exit_code is not None or exit_signal is not None or bool(lease_lost)
    return Attempt(
        attempt_id,
        task,
        generation,
        worker,
        from_us(claimed),
        _opt_time(ended),
        None if reason is None else AttemptEnd(reason),
        _opt_time(until),
        AgentExit(exit_code, exit_signal, exit_error, bool(lease_lost)) if reported else None,
    )


def exit_params(task: str, attempt_id: str, generation: int, e: AgentExit) -> tuple[Any, ...]:
    """Parameters of ``note_attempt_exit``: the report, then the attempt it is about."""
    return (e.exit_code, e.signal, e.error, e.lease_lost, attempt_id, task, generation)


def attempt_params(a: Attempt) -> tuple[Any, ...]:
    return (a.attempt_id, a.task, a.generation, a.worker, to_us(a.claimed_at))


def checkpoint(row: Row) -> Checkpoint:
    task, seq, stage, attempt_id, generation, outputs, created = row
    return Checkpoint(
        task, seq, stage, attempt_id, generation, _from_json(outputs), from_us(created)
    )


def checkpoint_params(c: Checkpoint) -> tuple[Any, ...]:
    return (
        c.task,
        c.seq,
        c.stage,
        c.attempt_id,
        c.generation,
        _compact_json(c.outputs),
        to_us(c.created_at),
    )


def effect(row: Row) -> Effect:
    (
        task,
        key,
        state,
        kind,
        rule,
        origin,
        attempt_id,
        generation,
        fingerprint,
        idem,
        request,
        status,
        headers,
        body,
        detail,
        created,
        updated,
    ) = row
    response = (
        None
        if status is None
        else RecordedResponse(
            status=status,
            headers=tuple((str(n), str(v)) for n, v in json.loads(headers or "[]")),
            body=bytes(body or b""),
        )
    )
    return Effect(
        task=task,
        key=key,
        state=_EFFECT_STATES[state],
        kind=kind,
        rule=rule,
        origin_attempt_id=origin,
        attempt_id=attempt_id,
        generation=generation,
        fingerprint=fingerprint,
        idempotency_key=idem,
        request=_from_json(request),
        created_at=from_us(created),
        updated_at=from_us(updated),
        response=response,
        detail=detail,
    )


def effect_params(e: Effect) -> tuple[Any, ...]:
    r = e.response
    return (
        e.task,
        e.key,
        e.state.value,
        e.kind,
        e.rule,
        e.origin_attempt_id,
        e.attempt_id,
        e.generation,
        e.fingerprint,
        e.idempotency_key,
        _compact_json(e.request),
        None if r is None else r.status,
        None if r is None else _compact_json([list(h) for h in r.headers]),
        None if r is None else r.body,
        e.detail,
        to_us(e.created_at),
        to_us(e.updated_at),
    )


def event(row: Row) -> EffectEvent:
    task, key, name, attempt_id, generation, at, detail = row
    return EffectEvent(task, key, name, attempt_id, generation, from_us(at), detail)


def event_params(e: EffectEvent) -> tuple[Any, ...]:
    return (e.task, e.key, e.event, e.attempt_id, e.generation, to_us(e.at), e.detail)


def refusal(row: Row) -> FenceRefusal:
    task, operation, attempt_id, generation, current, at, reason = row
    return FenceRefusal(task, operation, attempt_id, generation, current, from_us(at), reason)


def refusal_params(r: FenceRefusal) -> tuple[Any, ...]:
    return (
        r.task,
        r.operation,
        r.attempt_id,
        r.generation,
        r.current_generation,
        to_us(r.at),
        r.reason,
    )
