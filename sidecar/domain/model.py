"""The records effect-sidecar keeps, as immutable values (vocabulary of SPEC §2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

type JSON = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Lease:
    """Worker ``worker`` owns ``task`` with ``generation`` until ``expires_at``."""

    attempt_id: str
    generation: int
    worker: str
    acquired_at: datetime
    expires_at: datetime
    ttl_s: float
    released_at: datetime | None = None

    def is_live(self, now: datetime) -> bool:
        return self.released_at is None and now < self.expires_at


@dataclass(frozen=True, slots=True)
class Mark:
    """Who changed a task's lifecycle (marked it done, or reopened it), when and why."""

    at: datetime
    by: str
    note: str | None = None


@dataclass(frozen=True, slots=True)
class TaskState:
    """The fencing-relevant state of one task: its current generation and lease."""

    task: str
    generation: int
    checkpoint_seq: int
    created_at: datetime
    updated_at: datetime
    lease: Lease | None = None
    #: set while the task is done (claims are refused until it is reopened).
    done: Mark | None = None
    #: the last reopening of a task that was done.
    reopened: Mark | None = None

    def advanced(self, checkpoint_seq: int, now: datetime) -> TaskState:
        """This state after checkpoint ``checkpoint_seq`` was appended at ``now``."""
        # Built directly rather than with dataclasses.replace: this is the hot path of
        # every checkpoint write, and replace() costs several times more.
        return TaskState(
            self.task,
            self.generation,
            checkpoint_seq,
            self.created_at,
            now,
            self.lease,
            self.done,
            self.reopened,
        )


class AttemptEnd(StrEnum):
    RELEASED = "released"
    SUPERSEDED = "superseded"  # another claim took over while this lease was still live
    EXPIRED = "expired"  # the lease ran out before another claim


@dataclass(frozen=True, slots=True)
class AgentExit:
    """How an attempt's agent process ended, as its worker (``sidecar exec``) reported it
    when it released the lease: an exit status, or the signal that killed it; ``error``
    when the command could not be started at all (then ``exit_code`` is the shell's 127
    or 126); ``lease_lost`` when the worker stopped it because another claim took over."""

    exit_code: int | None = None
    signal: str | None = None
    error: str | None = None
    lease_lost: bool = False

    def describe(self) -> str:
        if self.lease_lost:
            return "lease lost"
        if self.error is not None:
            return f"{self.error} ({self.exit_code})"
        if self.signal is not None:
            return f"killed by {self.signal}"
        return f"exit {self.exit_code}"


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a task by one worker."""

    attempt_id: str
    task: str
    generation: int
    worker: str
    claimed_at: datetime
    ended_at: datetime | None = None
    end_reason: AttemptEnd | None = None
    #: for an ended attempt, the last moment its lease allowed it to act; no request of
    #: this attempt can be forwarded after it (self-fencing), which bounds settle time.
    lease_until: datetime | None = None
    #: how its agent ended, if its worker said so (``sidecar exec`` does when it releases).
    exit: AgentExit | None = None

    def how(self, current: bool = False) -> str | None:
        """How the attempt ended, in words (``exit 3``, ``killed by SIGKILL``, ``lease
        lost``, ``superseded``, ...); ``current`` for the lease holder still running."""
        if self.exit is not None:
            return self.exit.describe()
        if self.end_reason is not None:
            return self.end_reason.value
        return "current" if current else None


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A durable stage transition; ``seq`` counts from 1 per task."""

    task: str
    seq: int
    stage: str
    attempt_id: str
    generation: int
    outputs: JSON
    created_at: datetime


class EffectState(StrEnum):
    PENDING = "pending"  # recorded before forwarding
    COMPLETED = "completed"  # response recorded before answering
    FAILED = "failed"  # definitive failure (e.g. a non-retryable 4xx)
    UNKNOWN = "unknown"  # timeout, reset, crash while pending: outcome not known


@dataclass(frozen=True, slots=True)
class RecordedResponse:
    """What the outside world answered, as it will be replayed."""

    status: int
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Effect:
    """One external write, identified within its task by ``key``.

    ``origin_attempt_id`` minted the idempotency key; ``attempt_id``/``generation`` are
    the attempt that last drove the effect (a later attempt may retry or probe it).
    """

    task: str
    key: str
    state: EffectState
    kind: str
    rule: str
    origin_attempt_id: str
    attempt_id: str
    generation: int
    fingerprint: str
    idempotency_key: str | None
    request: JSON
    created_at: datetime
    updated_at: datetime
    response: RecordedResponse | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class EffectEvent:
    """One line of an effect's audit trail: a state change or a replay/probe/divergence."""

    task: str
    key: str
    event: str
    attempt_id: str
    generation: int
    at: datetime
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class FenceRefusal:
    """A write the store refused because its generation was not current (kept for audit)."""

    task: str
    operation: str
    attempt_id: str
    generation: int
    current_generation: int
    at: datetime
    reason: str


@dataclass(frozen=True, slots=True)
class TaskView:
    """Everything ``GET /v1/tasks/{task}`` and ``sidecar tasks TASK`` show."""

    state: TaskState
    attempts: tuple[Attempt, ...]
    last_checkpoint: Checkpoint | None
    effect_counts: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Claim:
    """The answer to a successful claim."""

    task: str
    attempt_id: str
    generation: int
    worker: str
    lease_expires_at: datetime
    last_checkpoint: Checkpoint | None
    previous_attempt_id: str | None
