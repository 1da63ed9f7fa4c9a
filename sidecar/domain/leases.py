"""Claim leases and fencing: who owns a task, and whose writes are still accepted.

Decisions (documented in docs/leases.md, relied on by the proxy):

* A claim is granted when the task has no live lease, or when the live lease belongs to
  the *same worker name*.  The latter is a takeover by that worker: a worker restarted
  in place must not wait out its own lease, and its previous incarnation, if it is in
  fact still running, must be fenced.  Either way the claim mints a new attempt and
  ``generation + 1``.
* A write is accepted only from the attempt holding the task's current generation and
  only while that lease is not released.  A lease that merely *expired* without anyone
  claiming after it still accepts its holder's writes and heartbeats: the generation is
  the safety token, expiry only lets another worker take over.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sidecar.domain.model import Attempt, AttemptEnd, Lease, TaskState
from sidecar.errors import InvalidRequest, LeaseHeld, NotFound, StaleGeneration, TaskIsDone


@dataclass(frozen=True, slots=True)
class EndedAttempt:
    """The attempt a claim ended: how, and until when its lease let it act."""

    attempt_id: str
    reason: AttemptEnd
    lease_until: datetime


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    state: TaskState
    attempt: Attempt
    ended: EndedAttempt | None


def _lease_until(now: datetime, ttl_s: float) -> datetime:
    if not ttl_s > 0:
        raise InvalidRequest(f"ttl_s must be positive, got {ttl_s}")
    return now + timedelta(seconds=ttl_s)


def claim(
    state: TaskState | None,
    task: str,
    worker: str,
    ttl_s: float,
    now: datetime,
    attempt_id: str,
) -> ClaimOutcome:
    """Grant ``worker`` a new attempt on ``task`` or raise :class:`LeaseHeld` (or
    :class:`TaskIsDone` for a task marked done and not reopened)."""
    expires_at = _lease_until(now, ttl_s)
    if state is not None and state.done is not None:
        done = state.done
        raise TaskIsDone(task, done.at, done.by, done.note)
    previous = state.lease if state else None
    ended: EndedAttempt | None = None
    if previous is not None:
        if previous.is_live(now) and previous.worker != worker:
            raise LeaseHeld(task, previous.worker, previous.attempt_id, previous.expires_at)
        if previous.released_at is None:
            reason = AttemptEnd.SUPERSEDED if previous.is_live(now) else AttemptEnd.EXPIRED
            ended = EndedAttempt(previous.attempt_id, reason, previous.expires_at)
    generation = (state.generation if state else 0) + 1
    lease = Lease(
        attempt_id=attempt_id,
        generation=generation,
        worker=worker,
        acquired_at=now,
        expires_at=expires_at,
        ttl_s=ttl_s,
    )
    new_state = TaskState(
        task=task,
        generation=generation,
        checkpoint_seq=state.checkpoint_seq if state else 0,
        created_at=state.created_at if state else now,
        updated_at=now,
        lease=lease,
        reopened=state.reopened if state else None,
    )
    attempt = Attempt(
        attempt_id=attempt_id, task=task, generation=generation, worker=worker, claimed_at=now
    )
    return ClaimOutcome(new_state, attempt, ended)


def fence(
    state: TaskState | None, task: str, attempt_id: str, generation: int
) -> tuple[TaskState, Lease]:
    """Return the task's state and lease if ``(attempt_id, generation)`` may write now.

    Raises :class:`NotFound` for a task never claimed and :class:`StaleGeneration`
    (nothing may be written) for any other holder, older or forged.
    """
    if state is None or state.lease is None:
        raise NotFound(f"task {task} has never been claimed")
    lease = state.lease
    reason: str | None = None
    if generation < state.generation:
        reason = f"superseded by generation {state.generation} (attempt {lease.attempt_id})"
    elif generation > state.generation:
        reason = f"generation {generation} was never issued"
    elif attempt_id != lease.attempt_id:
        reason = f"generation {generation} belongs to attempt {lease.attempt_id}"
    elif lease.released_at is not None:
        reason = f"the lease was released at {lease.released_at.isoformat()}"
    if reason is not None:
        raise StaleGeneration(task, attempt_id, generation, state.generation, reason)
    return state, lease


def heartbeat(
    state: TaskState | None,
    task: str,
    attempt_id: str,
    generation: int,
    ttl_s: float | None,
    now: datetime,
) -> TaskState:
    """Extend the current holder's lease to ``now + ttl_s`` (default: the lease's TTL)."""
    current, lease = fence(state, task, attempt_id, generation)
    ttl = lease.ttl_s if ttl_s is None else ttl_s
    renewed = replace(lease, expires_at=_lease_until(now, ttl), ttl_s=ttl)
    return replace(current, lease=renewed, updated_at=now)


def release(
    state: TaskState | None, task: str, attempt_id: str, generation: int, now: datetime
) -> tuple[TaskState, bool]:
    """Give the lease up.  Returns the new state and whether anything changed.

    Releasing one's own already-released lease is a no-op rather than an error, so that a
    worker retrying a release whose answer it lost does not see a spurious conflict.
    """
    lease = state.lease if state else None
    if (
        state is not None
        and lease is not None
        and lease.released_at is not None
        and (lease.attempt_id, lease.generation) == (attempt_id, generation)
        and state.generation == generation
    ):
        return state, False
    current, lease = fence(state, task, attempt_id, generation)
    return replace(current, lease=replace(lease, released_at=now), updated_at=now), True
