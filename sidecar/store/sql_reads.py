"""The read queries of the SQL stores, written once.

Both SQL stores name their statements alike (``queries.sql`` per dialect) and return rows
in the same column order, so every read is built here from :meth:`SQLReads._fetch`; a
store says only how it runs a named statement and how it passes a list of tasks or of
``(task, key)`` pairs (SQLite: one JSON array for ``json_each``; PostgreSQL: arrays).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sidecar.domain.model import Attempt, Checkpoint, Effect, EffectEvent, FenceRefusal, TaskView
from sidecar.store import rows
from sidecar.store.base import EffectFilter, StageRow, Store, TaskFilter

# A cursor position later than any stored time: newest-first listings start below it.
_AFTER_ALL = 1 << 62


class SQLReads(Store):
    """Reads of a store whose named statements follow ``sql/<dialect>/queries.sql``."""

    @abstractmethod
    async def _fetch(self, name: str, params: Iterable[Any] = ()) -> list[Any]:
        """The rows of named statement ``name``; StoreUnavailable if it cannot be read."""

    @staticmethod
    @abstractmethod
    def _tasks_param(tasks: Sequence[str]) -> tuple[Any, ...]:
        """The parameters that pass a list of task names to ``load_tasks`` and the like."""

    @staticmethod
    @abstractmethod
    def _effect_keys_param(keys: Sequence[tuple[str, str]]) -> tuple[Any, ...]:
        """The parameters that pass ``(task, key)`` pairs to ``load_effects``."""

    async def task_view(self, task: str) -> TaskView | None:
        found = await self._fetch("load_tasks", self._tasks_param([task]))
        if not found:
            return None
        last = await self._fetch("load_last_checkpoints", self._tasks_param([task]))
        attempts = await self._fetch("task_attempts", (task,))
        counts = await self._fetch("task_effect_counts", (task,))
        return TaskView(
            state=rows.task_state(found[0]),
            attempts=tuple(rows.attempt(r) for r in attempts),
            last_checkpoint=rows.checkpoint(last[0]) if last else None,
            effect_counts={state: n for _, state, n in counts},
        )

    async def list_tasks(self) -> list[TaskView]:
        states = await self._fetch("all_tasks")
        last = {r[0]: rows.checkpoint(r) for r in await self._fetch("all_last_checkpoints")}
        counts: dict[str, dict[str, int]] = {}
        for task, state, n in await self._fetch("all_effect_counts"):
            counts.setdefault(task, {})[state] = n
        return [
            TaskView(
                state=(s := rows.task_state(r)),
                attempts=(),
                last_checkpoint=last.get(s.task),
                effect_counts=counts.get(s.task, {}),
            )
            for r in states
        ]

    async def attempt(self, attempt_id: str) -> Attempt | None:
        found = await self._fetch("attempt", (attempt_id,))
        return rows.attempt(found[0]) if found else None

    async def checkpoints(self, task: str) -> list[Checkpoint]:
        return [rows.checkpoint(r) for r in await self._fetch("task_checkpoints", (task,))]

    async def effects(self, task: str) -> list[Effect]:
        return [rows.effect(r) for r in await self._fetch("task_effects", (task,))]

    async def effects_page(
        self, task: str, after: tuple[datetime, str] | None, limit: int
    ) -> list[Effect]:
        at, key = (rows.to_us(after[0]), after[1]) if after else (-1, "")
        found = await self._fetch("task_effects_page", (task, at, at, key, limit))
        return [rows.effect(r) for r in found]

    async def checkpoints_page(self, task: str, after_seq: int, limit: int) -> list[Checkpoint]:
        found = await self._fetch("task_checkpoints_page", (task, after_seq, limit))
        return [rows.checkpoint(r) for r in found]

    async def effect_events_of(self, keys: Sequence[tuple[str, str]]) -> list[EffectEvent]:
        found = await self._fetch("effect_events_of", self._effect_keys_param(keys))
        return [rows.event(r) for r in found]

    async def gauges(self, now: datetime) -> tuple[int, int]:
        ((unknown, leased),) = await self._fetch("gauges", (rows.to_us(now),))
        return int(unknown), int(leased)

    async def tasks_page(
        self, where: TaskFilter, after: tuple[datetime, str] | None, limit: int, now: datetime
    ) -> list[TaskView]:
        at, task = (rows.to_us(after[0]), after[1]) if after else (_AFTER_ALL, "")
        now_us = rows.to_us(now)
        params = (at, at, task, where.worker, where.worker, where.state, now_us, now_us, limit)
        states = [rows.task_state(r) for r in await self._fetch("tasks_page", params)]
        names = self._tasks_param([s.task for s in states])
        last = {r[0]: rows.checkpoint(r) for r in await self._fetch("load_last_checkpoints", names)}
        counts: dict[str, dict[str, int]] = {}
        for name, state, n in await self._fetch("effect_counts_of", names):
            counts.setdefault(name, {})[state] = n
        return [TaskView(s, (), last.get(s.task), counts.get(s.task, {})) for s in states]

    async def effects_across(
        self, where: EffectFilter, after: tuple[datetime, str, str] | None, limit: int
    ) -> list[Effect]:
        at, task, key = (
            (rows.to_us(after[0]), after[1], after[2]) if after else (_AFTER_ALL, "", "")
        )
        params: tuple[Any, ...] = (at, at, task, task, key)
        params += (where.state, where.state, where.task, where.task, where.rule, where.rule, limit)
        return [rows.effect(r) for r in await self._fetch("effects_across", params)]

    async def stale_tasks(self, before: datetime, after: str | None, limit: int) -> list[str]:
        found = await self._fetch("stale_tasks", (rows.to_us(before), after or "", limit))
        return [str(r[0]) for r in found]

    async def effect(self, task: str, key: str) -> Effect | None:
        found = await self._fetch("load_effects", self._effect_keys_param([(task, key)]))
        return rows.effect(found[0]) if found else None

    async def effect_events(self, task: str) -> list[EffectEvent]:
        return [rows.event(r) for r in await self._fetch("task_effect_events", (task,))]

    async def refusals(self, task: str) -> list[FenceRefusal]:
        return [rows.refusal(r) for r in await self._fetch("task_refusals", (task,))]

    async def events_since(
        self, since: datetime, events: Sequence[str], after_id: int, limit: int
    ) -> list[tuple[int, EffectEvent]]:
        params = (after_id, rows.to_us(since), *self._tasks_param(list(events)), limit)
        return [(int(r[0]), rows.event(r[1:])) for r in await self._fetch("events_since", params)]

    async def refusals_since(
        self, since: datetime, after_id: int, limit: int
    ) -> list[tuple[int, FenceRefusal]]:
        found = await self._fetch("refusals_since", (after_id, rows.to_us(since), limit))
        return [(int(r[0]), rows.refusal(r[1:])) for r in found]

    async def stages_since(
        self, since: datetime, after: tuple[str, int] | None, limit: int
    ) -> list[StageRow]:
        task, seq = after if after is not None else ("", 0)
        params = (rows.to_us(since), task, task, seq, limit)
        return [
            StageRow(
                task=r[0],
                seq=int(r[1]),
                stage=r[2],
                attempt_id=r[3],
                at=rows.from_us(r[4]),
                claimed_at=rows.from_us(r[5]),
                end_reason=r[6],
                lease_until=None if r[7] is None else rows.from_us(r[7]),
                ttl_s=None if r[8] is None else float(r[8]),
            )
            for r in await self._fetch("stages_since", params)
        ]
