"""The store interface every backend implements, and its convenience methods.

A backend implements four things: :meth:`Store.open`/:meth:`Store.close`,
:meth:`Store._run` (run a write command in a durable transaction, which
:meth:`Store.execute` times and reports) and the read queries.  The named write methods
below (``claim``, ``append_checkpoint``, ...) are thin and shared, so callers never build
commands by hand.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sidecar.domain.model import (
    JSON,
    AgentExit,
    Attempt,
    Checkpoint,
    Claim,
    Effect,
    EffectEvent,
    EffectState,
    FenceRefusal,
    RecordedResponse,
    TaskState,
    TaskView,
)
from sidecar.errors import SidecarError, StaleGeneration
from sidecar.runtime.clock import Clock, SystemClock
from sidecar.store.commands import (
    AppendCheckpoint,
    ClaimTask,
    Command,
    Context,
    Heartbeat,
    MarkDone,
    NoteEffect,
    NoteRefusal,
    Pruned,
    PruneTask,
    RecordPending,
    Release,
    Reopen,
    TransitionEffect,
)


@dataclass(frozen=True, slots=True)
class StoreInfo:
    """What a store says about itself on /readyz and at start-up."""

    url: str
    backend: str
    schema_version: int
    durable: bool


class WriteObserver:
    """Hook told the outcome of every write command; this base does nothing."""

    def done(self, command: Command[Any], result: Any, seconds: float) -> None:
        return None

    def refused(self, command: Command[Any], error: SidecarError, seconds: float) -> None:
        return None


class CompositeObserver(WriteObserver):
    """Tells several observers, in order."""

    def __init__(self, *observers: WriteObserver) -> None:
        self.observers = observers

    def done(self, command: Command[Any], result: Any, seconds: float) -> None:
        for observer in self.observers:
            observer.done(command, result, seconds)

    def refused(self, command: Command[Any], error: SidecarError, seconds: float) -> None:
        for observer in self.observers:
            observer.refused(command, error, seconds)


TASK_STATES = ("leased", "free", "waiting", "done")


@dataclass(frozen=True, slots=True)
class TaskFilter:
    """Which tasks a listing wants: ``state`` is one of :data:`TASK_STATES` - leased (a
    live lease), free (no live lease and not done), waiting (an effect waits for a human,
    whatever else holds), done (marked done and not reopened; never leased)."""

    state: str | None = None
    worker: str | None = None


@dataclass(frozen=True, slots=True)
class EffectFilter:
    """Which effects a listing across tasks wants (``state`` an EffectState value)."""

    state: str | None = None
    task: str | None = None
    rule: str | None = None


@dataclass(frozen=True, slots=True)
class StageRow:
    """One checkpoint as ``sidecar review`` reads it: when it was written, and what its
    attempt and task say about the lease (the attempt's claim, how and until when its
    lease held, the ``ttl_s`` the task's latest claim or heartbeat asked for)."""

    task: str
    seq: int
    stage: str
    attempt_id: str
    at: datetime
    claimed_at: datetime
    end_reason: str | None
    lease_until: datetime | None
    ttl_s: float | None


class Store(ABC):
    """Leases, checkpoints and the effect log, behind one seam chosen by URL."""

    #: told about every write; the server installs one that feeds metrics and the log.
    observer: WriteObserver = WriteObserver()

    def __init__(self, url: str, *, clock: Clock | None, new_attempt_id: Callable[[], str]) -> None:
        #: the store's URL as it may be shown (no password).
        self.url = url
        self._clock = clock or SystemClock()
        self._new_attempt_id = new_attempt_id

    def _context(self) -> Context:
        """What a command may take from outside, read now (see :class:`Context`)."""
        return Context(self._clock.now(), self._new_attempt_id)

    async def __aenter__(self) -> Store:
        await self.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @abstractmethod
    async def open(self) -> None:
        """Connect and migrate; raise StoreUnavailable if that is not possible."""

    @abstractmethod
    async def close(self) -> None:
        """Finish writes already accepted, then disconnect."""

    @abstractmethod
    async def info(self) -> StoreInfo: ...

    async def execute[T](self, command: Command[T]) -> T:
        """Run one write command in a durable transaction; return when it is committed."""
        started = time.perf_counter()
        try:
            result = await self._run(command)
        except SidecarError as error:
            self.observer.refused(command, error, time.perf_counter() - started)
            raise
        self.observer.done(command, result, time.perf_counter() - started)
        return result

    @abstractmethod
    def _run[T](self, command: Command[T]) -> Awaitable[T]:
        """The backend's transaction around ``command.apply``: a coroutine, or (a group
        commit store) the future of the queued command; :meth:`execute` awaits it, and
        an error raised before it is awaited is handled the same way."""

    @abstractmethod
    async def check_writable(self) -> None:
        """Prove the store accepts a durable write (a test write + delete)."""

    # ---- reads -------------------------------------------------------------------

    @abstractmethod
    async def task_view(self, task: str) -> TaskView | None: ...

    @abstractmethod
    async def list_tasks(self) -> list[TaskView]:
        """Every task with its lease, last checkpoint and effect counts (no attempts)."""

    @abstractmethod
    async def attempt(self, attempt_id: str) -> Attempt | None: ...

    @abstractmethod
    async def checkpoints(self, task: str) -> list[Checkpoint]: ...

    @abstractmethod
    async def effects(self, task: str) -> list[Effect]: ...

    @abstractmethod
    async def effects_page(
        self, task: str, after: tuple[datetime, str] | None, limit: int
    ) -> list[Effect]:
        """At most ``limit`` of the task's effects in :meth:`effects` order, those after
        ``after`` (the ``(created_at, key)`` of the previous page's last effect)."""

    @abstractmethod
    async def checkpoints_page(self, task: str, after_seq: int, limit: int) -> list[Checkpoint]:
        """At most ``limit`` of the task's checkpoints with a ``seq`` above ``after_seq``."""

    @abstractmethod
    async def effect_events_of(self, keys: Sequence[tuple[str, str]]) -> list[EffectEvent]:
        """The audit trail of just these ``(task, key)`` effects, oldest first."""

    @abstractmethod
    async def gauges(self, now: datetime) -> tuple[int, int]:
        """(effects whose outcome is unknown, tasks whose lease is live at ``now``)."""

    @abstractmethod
    async def tasks_page(
        self, where: TaskFilter, after: tuple[datetime, str] | None, limit: int, now: datetime
    ) -> list[TaskView]:
        """At most ``limit`` tasks (no attempts), newest first, after ``after`` (the
        ``(created_at, task)`` of the previous page's last one)."""

    @abstractmethod
    async def effects_across(
        self, where: EffectFilter, after: tuple[datetime, str, str] | None, limit: int
    ) -> list[Effect]:
        """At most ``limit`` effects of any task, newest first, after ``after`` (the
        ``(created_at, task, key)`` of the previous page's last one)."""

    @abstractmethod
    async def stale_tasks(self, before: datetime, after: str | None, limit: int) -> list[str]:
        """At most ``limit`` task names, in name order after ``after``, last updated before
        ``before``: the candidates of prune (:class:`PruneTask` decides for each)."""

    @abstractmethod
    async def effect(self, task: str, key: str) -> Effect | None: ...

    @abstractmethod
    async def effect_events(self, task: str) -> list[EffectEvent]: ...

    @abstractmethod
    async def refusals(self, task: str) -> list[FenceRefusal]: ...

    # ---- windowed reads for `sidecar review`: a page at a time, by cursor ----------

    @abstractmethod
    async def events_since(
        self, since: datetime, events: Sequence[str], after_id: int, limit: int
    ) -> list[tuple[int, EffectEvent]]:
        """At most ``limit`` audit lines named one of ``events``, at or after ``since``,
        with their position, in position order after ``after_id`` (0 for the first page)."""

    @abstractmethod
    async def refusals_since(
        self, since: datetime, after_id: int, limit: int
    ) -> list[tuple[int, FenceRefusal]]:
        """At most ``limit`` fence refusals at or after ``since``, with their position, in
        position order after ``after_id`` (0 for the first page)."""

    @abstractmethod
    async def stages_since(
        self, since: datetime, after: tuple[str, int] | None, limit: int
    ) -> list[StageRow]:
        """At most ``limit`` checkpoints of attempts claimed at or after ``since``, in
        ``(task, seq)`` order after ``after``: an attempt's checkpoints come together."""

    # ---- named writes ------------------------------------------------------------

    async def claim(self, task: str, worker: str, ttl_s: float) -> Claim:
        return await self.execute(ClaimTask(task, worker, ttl_s))

    async def heartbeat(
        self, task: str, attempt_id: str, generation: int, ttl_s: float | None = None
    ) -> TaskState:
        return await self.execute(Heartbeat(task, attempt_id, generation, ttl_s))

    async def release(
        self, task: str, attempt_id: str, generation: int, end: AgentExit | None = None
    ) -> TaskState:
        """Give the lease up; ``end`` (how the agent ended) is kept with the attempt, even
        when the release is refused because the lease was already lost."""
        return await self.execute(Release(task, attempt_id, generation, end))

    async def append_checkpoint(
        self, task: str, attempt_id: str, generation: int, stage: str, outputs: JSON
    ) -> Checkpoint:
        return await self.execute(AppendCheckpoint(task, attempt_id, generation, stage, outputs))

    async def record_pending(
        self,
        task: str,
        key: str,
        attempt_id: str,
        generation: int,
        *,
        kind: str,
        rule: str,
        fingerprint: str,
        idempotency_key: str | None,
        request: JSON,
    ) -> Effect:
        return await self.execute(
            RecordPending(
                task,
                key,
                attempt_id,
                generation,
                kind,
                rule,
                fingerprint,
                idempotency_key,
                request,
            )
        )

    async def transition_effect(
        self,
        task: str,
        key: str,
        attempt_id: str,
        generation: int,
        to: EffectState,
        *,
        response: RecordedResponse | None = None,
        detail: str | None = None,
    ) -> Effect:
        return await self.execute(
            TransitionEffect(task, key, attempt_id, generation, to, response, detail)
        )

    async def note_effect(
        self,
        task: str,
        key: str,
        attempt_id: str,
        generation: int,
        event: str,
        detail: str | None = None,
    ) -> EffectEvent:
        return await self.execute(NoteEffect(task, key, attempt_id, generation, event, detail))

    async def mark_done(
        self,
        task: str,
        by: str,
        note: str | None = None,
        token: tuple[str, int] | None = None,
    ) -> TaskState:
        """Mark the task done: by its holder (``token`` = its attempt id and generation)
        or by an operator while no lease is live."""
        attempt_id, generation = token if token is not None else (None, None)
        return await self.execute(MarkDone(task, by, note, attempt_id, generation))

    async def reopen(self, task: str, by: str, note: str) -> TaskState:
        return await self.execute(Reopen(task, by, note))

    async def prune_task(self, task: str, cutoff: datetime, *, dry_run: bool = False) -> Pruned:
        return await self.execute(PruneTask(task, cutoff, dry_run))

    async def note_refusal(self, refused: StaleGeneration, reason: str) -> FenceRefusal:
        """Keep a write the proxy refused (fenced) before it reached the store."""
        return await self.execute(
            NoteRefusal(
                refused.task,
                refused.attempt_id,
                refused.generation,
                refused.current_generation,
                reason,
            )
        )
