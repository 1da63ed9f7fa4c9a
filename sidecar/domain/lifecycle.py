"""A task's lifecycle: marked done (claims refused), reopened, and when its history may go.

Decisions (documented in docs/reference.md):

* **done by the holder**: the attempt holding the task's live lease passes its fencing
  token ``(attempt_id, generation)``; its lease is released and the attempt ends
  ``released``, in the same transaction.  A stale token is refused (409
  ``stale_generation``) and kept as a fence refusal, as any fenced write.
* **done by an operator**: no token, only while no lease is live (409 ``lease_held``
  otherwise: stop the worker or wait for its lease to expire).  A lease that expired
  without a release is released now and its attempt ends ``expired``, so that holder can
  write no more.
* Marking a done task done again changes nothing; reopening a task that is not done
  changes nothing either (both are safe to retry).
* **prune**: a task's history may be deleted once its last update is older than the
  cutoff, no lease on it is live and none of its effects is ``unknown`` (waits for a
  human) or ``pending`` (its outcome not known yet) - see :func:`why_kept`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from sidecar.domain.leases import fence
from sidecar.domain.model import AttemptEnd, Lease, Mark, TaskState
from sidecar.errors import InvalidRequest, LeaseHeld, NotFound


def mark_done(
    state: TaskState | None,
    task: str,
    token: tuple[str, int] | None,
    mark: Mark,
) -> tuple[TaskState, tuple[str, AttemptEnd, datetime] | None]:
    """The task marked done, and the attempt that ends with it ``(id, how, lease_until)``."""
    if state is None:
        raise NotFound(f"task {task} has never been claimed")
    if state.done is not None:
        return state, None
    now = mark.at
    lease = state.lease
    ended: tuple[str, AttemptEnd, datetime] | None = None
    if token is not None:
        _, lease = fence(state, task, token[0], token[1])
        ended = (lease.attempt_id, AttemptEnd.RELEASED, now)
        lease = replace(lease, released_at=now)
    elif lease is not None and lease.is_live(now):
        raise LeaseHeld(task, lease.worker, lease.attempt_id, lease.expires_at)
    elif lease is not None and lease.released_at is None:
        ended = (lease.attempt_id, AttemptEnd.EXPIRED, lease.expires_at)
        lease = replace(lease, released_at=now)
    return replace(state, lease=lease, done=mark, updated_at=now), ended


def reopen(state: TaskState | None, task: str, mark: Mark) -> TaskState:
    """The task claimable again; the reopening is kept (who, when, why)."""
    if state is None:
        raise NotFound(f"task {task} has never been claimed")
    if state.done is None:
        return state
    return replace(state, done=None, reopened=mark, updated_at=mark.at)


def check_token(attempt_id: str | None, generation: int | None) -> tuple[str, int] | None:
    if (attempt_id is None) != (generation is None):
        raise InvalidRequest("give attempt_id and generation together, or neither")
    return None if attempt_id is None or generation is None else (attempt_id, generation)


def why_kept(
    state: TaskState | None, counts: dict[str, int], cutoff: datetime, now: datetime
) -> str | None:
    """Why a task's history must stay (None: it may be pruned).  ``counts`` holds the
    task's effects by state (``unknown``, ``pending``)."""
    if state is None:
        return "no such task"
    lease: Lease | None = state.lease
    if lease is not None and lease.is_live(now):
        return "its lease is live"
    if counts.get("unknown", 0):
        return "an effect waits for a human"
    if counts.get("pending", 0):
        return "an effect's outcome is not known yet (pending)"
    if state.updated_at >= cutoff:
        return "updated since the cutoff"
    return None
