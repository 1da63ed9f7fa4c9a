"""Write commands: the only way state changes, identical for every store.

A store runs a command inside one transaction: it loads what the command touches into a
:class:`WorkingSet`, calls :meth:`Command.apply` (which calls the pure domain rules and
puts the results back), and persists what changed.  Because the decision and the write
happen in that same transaction, a fenced write can never slip past a newer claim; and
because every store shares these commands, they cannot disagree on the rules.

A fenced command refused for a stale generation still leaves a trace: a
:class:`FenceRefusal` is written in the same transaction, for the audit trail and
``sidecar review``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar, Protocol

from sidecar.domain import checkpoints, effects, leases, lifecycle, settling
from sidecar.domain.model import (
    JSON,
    AgentExit,
    Attempt,
    AttemptEnd,
    Checkpoint,
    Claim,
    Effect,
    EffectEvent,
    EffectState,
    FenceRefusal,
    Mark,
    RecordedResponse,
    TaskState,
)
from sidecar.errors import StaleGeneration


class WorkingSet(Protocol):
    """The slice of a store's state one transaction reads and writes."""

    def task(self, task: str) -> TaskState | None: ...
    def put_task(self, state: TaskState) -> None: ...
    def add_attempt(self, attempt: Attempt) -> None: ...
    def end_attempt(
        self, attempt_id: str, at: datetime, reason: AttemptEnd, lease_until: datetime
    ) -> None: ...
    def note_exit(self, task: str, attempt_id: str, generation: int, exit: AgentExit) -> None:
        """Keep how the attempt's agent ended - only on the attempt ``(task, attempt_id,
        generation)`` names, and only its first report."""
        ...

    def last_checkpoint(self, task: str) -> Checkpoint | None: ...
    def add_checkpoint(self, checkpoint: Checkpoint) -> None: ...
    def effect(self, task: str, key: str) -> Effect | None: ...
    def put_effect(self, effect: Effect) -> None: ...
    def add_event(self, event: EffectEvent) -> None: ...
    def add_refusal(self, refusal: FenceRefusal) -> None: ...
    def task_rows(self, task: str) -> dict[str, int]:
        """How many rows the task has in each table (:data:`ROW_KINDS`), and its effects
        ``unknown`` and ``pending`` (``effects_unknown``, ``effects_pending``)."""
        ...

    def delete_task(self, task: str) -> None:
        """Delete the task and everything recorded under it."""
        ...


#: the tables a task's history is kept in, children first (the order prune deletes in).
ROW_KINDS = ("effect_events", "effects", "checkpoints", "fence_refusals", "attempts")


@dataclass(frozen=True, slots=True)
class Context:
    """What a command may take from outside: the transaction's time and fresh ids."""

    now: datetime
    new_attempt_id: Callable[[], str]


# The bases below are dataclasses without slots: FencedEffectCommand joins two of them,
# which two slotted bases could not do (their instance layouts would conflict).
@dataclass(frozen=True)
class Command[T](ABC):
    """One write against one task.  Subclasses are frozen dataclasses: their fields follow
    ``task`` (and a base's fields) in the order :class:`~sidecar.store.base.Store` passes
    them."""

    task: str
    #: whether the command answers with the task's last checkpoint.
    needs_last_checkpoint: ClassVar[bool] = False
    #: whether the command reads the task's row counts (:meth:`WorkingSet.task_rows`).
    needs_rows: ClassVar[bool] = False
    #: name used for metrics, logs and fence refusals.
    operation: ClassVar[str] = "write"

    def effect_key(self) -> tuple[str, str] | None:
        """(task, key) of the effect this command reads, so a store can load it up front."""
        return None

    @abstractmethod
    def apply(self, ws: WorkingSet, ctx: Context) -> T:
        """Decide and stage the change in ``ws``; raise a SidecarError to refuse."""

    def _keep_refusal(
        self,
        ws: WorkingSet,
        ctx: Context,
        token: tuple[str, int],
        current_generation: int,
        reason: str,
    ) -> FenceRefusal:
        """Stage the evidence of a write refused for its fencing ``token`` (attempt id,
        generation), under this command's operation."""
        attempt_id, generation = token
        refusal = FenceRefusal(
            self.task, self.operation, attempt_id, generation, current_generation, ctx.now, reason
        )
        ws.add_refusal(refusal)
        return refusal


@dataclass(frozen=True)
class FencedCommand[T](Command[T]):
    """A command carrying ``(attempt_id, generation)``; refusals are logged."""

    attempt_id: str
    generation: int

    def apply(self, ws: WorkingSet, ctx: Context) -> T:
        try:
            return self.apply_fenced(ws, ctx)
        except StaleGeneration as stale:
            token = (self.attempt_id, self.generation)
            self._keep_refusal(ws, ctx, token, stale.current_generation, stale.reason)
            raise

    @abstractmethod
    def apply_fenced(self, ws: WorkingSet, ctx: Context) -> T: ...


@dataclass(frozen=True)
class EffectCommand[T](Command[T]):
    """A command about one effect, ``(task, key)``, which a store loads before it runs."""

    key: str

    def effect_key(self) -> tuple[str, str]:
        return (self.task, self.key)

    def _read(self, ws: WorkingSet) -> tuple[TaskState | None, Effect | None]:
        """The task's state and the effect as loaded: what the domain rule decides on."""
        return ws.task(self.task), ws.effect(self.task, self.key)


@dataclass(frozen=True)
class FencedEffectCommand[T](FencedCommand[T], EffectCommand[T]):
    """A fenced write about one effect: ``(task, key, attempt_id, generation)``, then its
    own fields (the bases' order makes ``key`` come before the fencing token)."""


def _logged(ws: WorkingSet, change: tuple[Effect, EffectEvent]) -> Effect:
    """Stage an effect's new state with its audit line; the effect."""
    effect, event = change
    ws.put_effect(effect)
    ws.add_event(event)
    return effect


@dataclass(frozen=True, slots=True)
class ClaimTask(Command[Claim]):
    """Grant ``worker`` a new attempt on the task (see :func:`sidecar.domain.leases.claim`)."""

    worker: str
    ttl_s: float
    needs_last_checkpoint: ClassVar[bool] = True
    operation: ClassVar[str] = "claim"

    def apply(self, ws: WorkingSet, ctx: Context) -> Claim:
        outcome = leases.claim(
            ws.task(self.task), self.task, self.worker, self.ttl_s, ctx.now, ctx.new_attempt_id()
        )
        ws.put_task(outcome.state)
        ended = outcome.ended
        if ended is not None:
            ws.end_attempt(ended.attempt_id, ctx.now, ended.reason, ended.lease_until)
        ws.add_attempt(outcome.attempt)
        lease = outcome.state.lease
        assert lease is not None
        return Claim(
            task=self.task,
            attempt_id=lease.attempt_id,
            generation=lease.generation,
            worker=lease.worker,
            lease_expires_at=lease.expires_at,
            last_checkpoint=ws.last_checkpoint(self.task),
            previous_attempt_id=ended.attempt_id if ended else None,
        )


@dataclass(frozen=True, slots=True)
class Heartbeat(FencedCommand[TaskState]):
    """Extend the holder's lease to ``now + ttl_s`` (default: the lease's own TTL)."""

    ttl_s: float | None = None
    operation: ClassVar[str] = "heartbeat"

    def apply_fenced(self, ws: WorkingSet, ctx: Context) -> TaskState:
        state = leases.heartbeat(
            ws.task(self.task), self.task, self.attempt_id, self.generation, self.ttl_s, ctx.now
        )
        ws.put_task(state)
        return state


@dataclass(frozen=True, slots=True)
class Release(FencedCommand[TaskState]):
    """Give the lease up and end its attempt."""

    #: how the attempt's agent ended, as its worker reports it.
    end: AgentExit | None = None
    operation: ClassVar[str] = "release"

    def apply(self, ws: WorkingSet, ctx: Context) -> TaskState:
        if self.end is not None:
            # Kept even when the release itself is refused as stale: a worker whose lease
            # was lost still says how its agent ended.  It changes no lease, checkpoint or
            # effect, and only the attempt's own (attempt_id, generation) names it.
            ws.note_exit(self.task, self.attempt_id, self.generation, self.end)
        return FencedCommand.apply(self, ws, ctx)

    def apply_fenced(self, ws: WorkingSet, ctx: Context) -> TaskState:
        state, changed = leases.release(
            ws.task(self.task), self.task, self.attempt_id, self.generation, ctx.now
        )
        if changed:
            ws.put_task(state)
            # A released attempt stops acting at release, whatever its lease said.
            ws.end_attempt(self.attempt_id, ctx.now, AttemptEnd.RELEASED, ctx.now)
        return state


@dataclass(frozen=True, slots=True)
class AppendCheckpoint(FencedCommand[Checkpoint]):
    """Append the holder's next checkpoint: a stage it finished, with its outputs."""

    stage: str
    outputs: JSON
    operation: ClassVar[str] = "checkpoint"

    def apply_fenced(self, ws: WorkingSet, ctx: Context) -> Checkpoint:
        state, checkpoint = checkpoints.append(
            ws.task(self.task),
            self.task,
            self.attempt_id,
            self.generation,
            self.stage,
            self.outputs,
            ctx.now,
        )
        ws.put_task(state)
        ws.add_checkpoint(checkpoint)
        return checkpoint


@dataclass(frozen=True, slots=True)
class RecordPending(FencedEffectCommand[Effect]):
    """Log an effect as ``pending`` before it is forwarded (raises EffectExists if logged)."""

    kind: str
    rule: str
    fingerprint: str
    idempotency_key: str | None
    request: JSON
    operation: ClassVar[str] = "effect.record"

    def apply_fenced(self, ws: WorkingSet, ctx: Context) -> Effect:
        change = effects.record_pending(
            *self._read(ws),
            task=self.task,
            key=self.key,
            kind=self.kind,
            rule=self.rule,
            attempt_id=self.attempt_id,
            generation=self.generation,
            fingerprint=self.fingerprint,
            idempotency_key=self.idempotency_key,
            request=self.request,
            now=ctx.now,
        )
        return _logged(ws, change)


@dataclass(frozen=True, slots=True)
class TransitionEffect(FencedEffectCommand[Effect]):
    """Move a logged effect to another state (see :mod:`sidecar.domain.effects`)."""

    to: EffectState
    response: RecordedResponse | None = None
    detail: str | None = None
    operation: ClassVar[str] = "effect.transition"

    def apply_fenced(self, ws: WorkingSet, ctx: Context) -> Effect:
        change = effects.transition(
            *self._read(ws),
            task=self.task,
            key=self.key,
            to=self.to,
            attempt_id=self.attempt_id,
            generation=self.generation,
            now=ctx.now,
            response=self.response,
            detail=self.detail,
        )
        return _logged(ws, change)


@dataclass(frozen=True, slots=True)
class NoteRefusal(Command[FenceRefusal]):
    """Keep as evidence a write refused before it reached the store (the proxy fenced it
    from what it knew of the lease), the way a refused store write is kept."""

    attempt_id: str
    generation: int
    current_generation: int
    reason: str
    operation: ClassVar[str] = "proxy"

    def apply(self, ws: WorkingSet, ctx: Context) -> FenceRefusal:
        token = (self.attempt_id, self.generation)
        return self._keep_refusal(ws, ctx, token, self.current_generation, self.reason)


@dataclass(frozen=True, slots=True)
class NoteEffect(FencedEffectCommand[EffectEvent]):
    """Add a replayed/probed/divergent line to an effect's audit trail."""

    event: str
    detail: str | None = None
    operation: ClassVar[str] = "effect.note"

    def apply_fenced(self, ws: WorkingSet, ctx: Context) -> EffectEvent:
        event = effects.note(
            *self._read(ws),
            task=self.task,
            key=self.key,
            event=self.event,
            attempt_id=self.attempt_id,
            generation=self.generation,
            now=ctx.now,
            detail=self.detail,
        )
        ws.add_event(event)
        return event


@dataclass(frozen=True, slots=True)
class ResolveEffect(EffectCommand[Effect]):
    """A human settles an effect that waits for one (SPEC §3.10), with a ``resolved`` line
    in its audit trail.  Not fenced: no attempt writes it.  ``not_before`` and ``seen_at``
    come from what the caller read (see :func:`sidecar.domain.settling.resolve`)."""

    resolution: settling.Resolution
    not_before: datetime
    seen_at: datetime
    operation: ClassVar[str] = "effect.resolve"

    def apply(self, ws: WorkingSet, ctx: Context) -> Effect:
        change = settling.resolve(
            *self._read(ws),
            self.resolution,
            task=self.task,
            key=self.key,
            now=ctx.now,
            not_before=self.not_before,
            seen_at=self.seen_at,
        )
        return _logged(ws, change)


@dataclass(frozen=True, slots=True)
class MarkDone(Command[TaskState]):
    """Mark the task done (see :mod:`sidecar.domain.lifecycle`): by its lease holder with
    its fencing token, or by an operator (no token) while no lease is live."""

    by: str
    note: str | None = None
    attempt_id: str | None = None
    generation: int | None = None
    operation: ClassVar[str] = "task.done"

    def apply(self, ws: WorkingSet, ctx: Context) -> TaskState:
        token = lifecycle.check_token(self.attempt_id, self.generation)
        mark = Mark(ctx.now, self.by, self.note)
        try:
            state, ended = lifecycle.mark_done(ws.task(self.task), self.task, token, mark)
        except StaleGeneration as stale:
            # No token (an operator) is kept as the attempt "" of generation 0.
            self._keep_refusal(ws, ctx, token or ("", 0), stale.current_generation, stale.reason)
            raise
        if state is not ws.task(self.task):
            ws.put_task(state)
        if ended is not None:
            attempt_id, how, until = ended
            ws.end_attempt(attempt_id, ctx.now, how, until)
        return state


@dataclass(frozen=True, slots=True)
class Reopen(Command[TaskState]):
    """Make a done task claimable again, keeping who reopened it and why."""

    by: str
    note: str
    operation: ClassVar[str] = "task.reopen"

    def apply(self, ws: WorkingSet, ctx: Context) -> TaskState:
        before = ws.task(self.task)
        state = lifecycle.reopen(before, self.task, Mark(ctx.now, self.by, self.note))
        if state is not before:
            ws.put_task(state)
        return state


@dataclass(frozen=True, slots=True)
class Pruned:
    """What prune found for one task: the rows it has (``tasks``/``leases`` included), why
    they were kept (None: they may go), and whether they were deleted."""

    task: str
    rows: dict[str, int]
    kept: str | None
    deleted: bool


@dataclass(frozen=True, slots=True)
class PruneTask(Command[Pruned]):
    """Delete one ended task's whole history in one transaction, unless it must stay
    (:func:`sidecar.domain.lifecycle.why_kept`); ``dry_run`` only says what would go."""

    cutoff: datetime
    dry_run: bool = False
    needs_rows: ClassVar[bool] = True
    operation: ClassVar[str] = "task.prune"

    def apply(self, ws: WorkingSet, ctx: Context) -> Pruned:
        state = ws.task(self.task)
        counts = ws.task_rows(self.task)
        effects_by_state = {
            "unknown": counts.pop("effects_unknown", 0),
            "pending": counts.pop("effects_pending", 0),
        }
        kept = lifecycle.why_kept(state, effects_by_state, self.cutoff, ctx.now)
        rows = dict(counts)
        if state is not None:
            rows["leases"] = 1 if state.lease is not None else 0
            rows["tasks"] = 1
        delete = kept is None and not self.dry_run
        if delete:
            ws.delete_task(self.task)
        return Pruned(self.task, rows, kept, delete)
