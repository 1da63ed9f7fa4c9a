"""``memory://``: the store kept in dictionaries, for unit tests and dry runs.

Same commands, same rules as the durable stores; nothing survives the process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from sidecar.domain.ids import new_attempt_id
from sidecar.domain.model import (
    Attempt,
    Checkpoint,
    Effect,
    EffectEvent,
    EffectState,
    FenceRefusal,
    TaskState,
    TaskView,
)
from sidecar.errors import SidecarError
from sidecar.runtime.clock import Clock
from sidecar.store.base import EffectFilter, StageRow, Store, StoreInfo, TaskFilter
from sidecar.store.batch import Batch, decide, wanted
from sidecar.store.commands import Command


class _State:
    """All tasks' records.  A command runs against a :class:`Batch` loaded from them and
    saved back, the working set the SQL stores use, so it stages exactly as it does there."""

    def __init__(self) -> None:
        self.tasks: dict[str, TaskState] = {}
        self.attempts: dict[str, Attempt] = {}
        self.checkpoints: dict[str, list[Checkpoint]] = {}
        self.effects: dict[tuple[str, str], Effect] = {}
        self.events: list[EffectEvent] = []
        self.refusals: list[FenceRefusal] = []

    def last_checkpoint(self, task: str) -> Checkpoint | None:
        history = self.checkpoints.get(task)
        return history[-1] if history else None

    def load(self, command: Command[Any]) -> Batch:
        """The rows ``command`` reads, as a SQL store loads them (:func:`wanted`)."""
        want = wanted([command])
        return Batch(
            tasks={task: self.tasks.get(task) for task in want.tasks},
            last_checkpoints={task: self.last_checkpoint(task) for task in want.last_checkpoints},
            effects={key: self.effects.get(key) for key in want.effects},
            task_counts={task: self.task_rows(task) for task in want.task_rows},
        )

    def save(self, batch: Batch) -> None:
        """Keep what ``batch`` staged, in the order :func:`changes` writes it."""
        for task in batch.deleted_tasks:
            self.delete_task(task)
        self.tasks.update(batch.dirty_tasks)
        self.attempts.update((a.attempt_id, a) for a in batch.new_attempts)
        for attempt_id, at, reason, until in batch.ended_attempts:
            attempt = self.attempts[attempt_id]
            if attempt.ended_at is None:
                self.attempts[attempt_id] = replace(
                    attempt, ended_at=at, end_reason=reason, lease_until=until
                )
        for task, attempt_id, generation, exit in batch.noted_exits:
            # Only on the attempt (task, attempt_id, generation) names, only its first report.
            noted = self.attempts.get(attempt_id)
            if noted is None or (noted.task, noted.generation) != (task, generation):
                continue
            if noted.exit is None:
                self.attempts[attempt_id] = replace(noted, exit=exit)
        for checkpoint in batch.new_checkpoints:
            self.checkpoints.setdefault(checkpoint.task, []).append(checkpoint)
        self.effects.update(batch.dirty_effects)
        self.events += batch.new_events
        self.refusals += batch.new_refusals

    def task_rows(self, task: str) -> dict[str, int]:
        effects = [e for e in self.effects.values() if e.task == task]
        return {
            "effect_events": sum(1 for e in self.events if e.task == task),
            "effects": len(effects),
            "checkpoints": len(self.checkpoints.get(task, [])),
            "fence_refusals": sum(1 for r in self.refusals if r.task == task),
            "attempts": sum(1 for a in self.attempts.values() if a.task == task),
            "effects_unknown": sum(1 for e in effects if e.state is EffectState.UNKNOWN),
            "effects_pending": sum(1 for e in effects if e.state is EffectState.PENDING),
        }

    def delete_task(self, task: str) -> None:
        self.events = [e for e in self.events if e.task != task]
        self.effects = {k: e for k, e in self.effects.items() if e.task != task}
        self.checkpoints.pop(task, None)
        self.refusals = [r for r in self.refusals if r.task != task]
        self.attempts = {k: a for k, a in self.attempts.items() if a.task != task}
        self.tasks.pop(task, None)


class MemoryStore(Store):
    def __init__(
        self,
        url: str = "memory://",
        *,
        clock: Clock | None = None,
        new_attempt_id: Callable[[], str] = new_attempt_id,
    ) -> None:
        super().__init__(url, clock=clock, new_attempt_id=new_attempt_id)
        self._state = _State()

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def info(self) -> StoreInfo:
        return StoreInfo(url=self.url, backend="memory", schema_version=0, durable=False)

    async def _run[T](self, command: Command[T]) -> T:
        # Nothing here awaits, so each command is atomic with respect to the event loop.
        batch = self._state.load(command)
        (outcome,) = decide([command], batch, self._context())
        self._state.save(batch)  # a refused command's staged evidence is kept too
        if isinstance(outcome, SidecarError):
            raise outcome
        result: T = outcome
        return result

    async def check_writable(self) -> None:
        return None

    async def task_view(self, task: str) -> TaskView | None:
        state = self._state.tasks.get(task)
        if state is None:
            return None
        attempts = sorted(
            (a for a in self._state.attempts.values() if a.task == task),
            key=lambda a: a.generation,
        )
        return TaskView(
            state=state,
            attempts=tuple(attempts),
            last_checkpoint=self._state.last_checkpoint(task),
            effect_counts=self._effect_counts(task),
        )

    async def list_tasks(self) -> list[TaskView]:
        return [
            TaskView(
                state=state,
                attempts=(),
                last_checkpoint=self._state.last_checkpoint(name),
                effect_counts=self._effect_counts(name),
            )
            for name, state in sorted(self._state.tasks.items())
        ]

    def _effect_counts(self, task: str) -> dict[str, int]:
        return dict(Counter(e.state.value for e in self._state.effects.values() if e.task == task))

    async def attempt(self, attempt_id: str) -> Attempt | None:
        return self._state.attempts.get(attempt_id)

    async def checkpoints(self, task: str) -> list[Checkpoint]:
        return list(self._state.checkpoints.get(task, []))

    async def effects(self, task: str) -> list[Effect]:
        found = [e for e in self._state.effects.values() if e.task == task]
        return sorted(found, key=lambda e: (e.created_at, e.key))

    async def effects_page(
        self, task: str, after: tuple[datetime, str] | None, limit: int
    ) -> list[Effect]:
        found = await self.effects(task)
        return [e for e in found if after is None or (e.created_at, e.key) > after][:limit]

    async def checkpoints_page(self, task: str, after_seq: int, limit: int) -> list[Checkpoint]:
        return [c for c in await self.checkpoints(task) if c.seq > after_seq][:limit]

    async def effect_events_of(self, keys: Sequence[tuple[str, str]]) -> list[EffectEvent]:
        wanted = set(keys)
        return [e for e in self._state.events if (e.task, e.key) in wanted]

    async def gauges(self, now: datetime) -> tuple[int, int]:
        effects = self._state.effects.values()
        unknown = sum(1 for e in effects if e.state is EffectState.UNKNOWN)
        tasks = self._state.tasks.values()
        leased = sum(1 for t in tasks if t.lease is not None and t.lease.is_live(now))
        return unknown, leased

    async def tasks_page(
        self, where: TaskFilter, after: tuple[datetime, str] | None, limit: int, now: datetime
    ) -> list[TaskView]:
        views = [v for v in await self.list_tasks() if self._wanted(v, where, now)]
        views.sort(key=lambda v: (v.state.created_at, v.state.task), reverse=True)
        return [v for v in views if after is None or (v.state.created_at, v.state.task) < after][
            :limit
        ]

    def _wanted(self, view: TaskView, where: TaskFilter, now: datetime) -> bool:
        lease = view.state.lease
        if where.worker is not None and (lease is None or lease.worker != where.worker):
            return False
        live = lease is not None and lease.is_live(now)
        match where.state:
            case "leased":
                return live
            case "free":
                return not live and view.state.done is None
            case "done":
                return view.state.done is not None
            case "waiting":
                return view.effect_counts.get(EffectState.UNKNOWN.value, 0) > 0
        return True

    async def effects_across(
        self, where: EffectFilter, after: tuple[datetime, str, str] | None, limit: int
    ) -> list[Effect]:
        found = [
            e
            for e in self._state.effects.values()
            if (where.state is None or e.state.value == where.state)
            and (where.task is None or e.task == where.task)
            and (where.rule is None or e.rule == where.rule)
            and (after is None or (e.created_at, e.task, e.key) < after)
        ]
        found.sort(key=lambda e: (e.created_at, e.task, e.key), reverse=True)
        return found[:limit]

    async def stale_tasks(self, before: datetime, after: str | None, limit: int) -> list[str]:
        found = sorted(
            name
            for name, state in self._state.tasks.items()
            if state.updated_at < before and (after is None or name > after)
        )
        return found[:limit]

    async def effect(self, task: str, key: str) -> Effect | None:
        return self._state.effects.get((task, key))

    async def effect_events(self, task: str) -> list[EffectEvent]:
        return [e for e in self._state.events if e.task == task]

    async def refusals(self, task: str) -> list[FenceRefusal]:
        return [r for r in self._state.refusals if r.task == task]

    # Positions are places in the in-memory lists (from 1): enough for one process.

    async def events_since(
        self, since: datetime, events: Sequence[str], after_id: int, limit: int
    ) -> list[tuple[int, EffectEvent]]:
        wanted = set(events)
        found = [
            (i, e)
            for i, e in enumerate(self._state.events, start=1)
            if i > after_id and e.at >= since and e.event in wanted
        ]
        return found[:limit]

    async def refusals_since(
        self, since: datetime, after_id: int, limit: int
    ) -> list[tuple[int, FenceRefusal]]:
        found = [
            (i, r)
            for i, r in enumerate(self._state.refusals, start=1)
            if i > after_id and r.at >= since
        ]
        return found[:limit]

    async def stages_since(
        self, since: datetime, after: tuple[str, int] | None, limit: int
    ) -> list[StageRow]:
        found: list[StageRow] = []
        for task in sorted(self._state.checkpoints):
            state = self._state.tasks.get(task)
            ttl = state.lease.ttl_s if state is not None and state.lease is not None else None
            for c in self._state.checkpoints[task]:
                attempt = self._state.attempts[c.attempt_id]
                if attempt.claimed_at < since or (after is not None and (task, c.seq) <= after):
                    continue
                reason = attempt.end_reason.value if attempt.end_reason is not None else None
                found.append(
                    StageRow(
                        task, c.seq, c.stage, c.attempt_id, c.created_at,
                        attempt.claimed_at, reason, attempt.lease_until, ttl,
                    )
                )  # fmt: skip
        return found[:limit]
