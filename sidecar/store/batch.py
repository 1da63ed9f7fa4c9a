"""One write transaction's working set, shared by the SQL stores.

A SQL store runs a batch of commands in one transaction: it reads every row they will
look at (:func:`wanted`), lets the shared commands decide against a :class:`Batch`
(:func:`decide`), and writes what changed (:func:`changes`), parents first.  The dialects
differ only in the statements that load and write those rows, so the row tuples here are
the same for both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sidecar.domain.model import (
    AgentExit,
    Attempt,
    AttemptEnd,
    Checkpoint,
    Effect,
    EffectEvent,
    FenceRefusal,
    Lease,
    TaskState,
)
from sidecar.errors import SidecarError
from sidecar.store import rows
from sidecar.store.commands import ROW_KINDS, Command, Context


class Probe:
    """Batch marker: prove the store writable (insert + delete inside the transaction)."""


type Work = Command[Any] | Probe


@dataclass(frozen=True, slots=True)
class Wanted:
    """The rows a batch reads before deciding: tasks, last checkpoints, effects, and the
    row counts of tasks prune looks at."""

    tasks: list[str]
    last_checkpoints: list[str]
    effects: list[tuple[str, str]]
    task_rows: list[str] = field(default_factory=list)


def wanted(works: Sequence[Work]) -> Wanted:
    # One pass, and Probe tested rather than the abstract Command: isinstance against an
    # ABC is several times slower, and this runs on the writer thread for every batch.
    tasks: set[str] = set()
    last_checkpoints: set[str] = set()
    effects: set[tuple[str, str]] = set()
    task_rows: set[str] = set()
    for work in works:
        if isinstance(work, Probe):
            continue
        tasks.add(work.task)
        if work.needs_last_checkpoint:
            last_checkpoints.add(work.task)
        if (key := work.effect_key()) is not None:
            effects.add(key)
        if work.needs_rows:
            task_rows.add(work.task)
    return Wanted(sorted(tasks), sorted(last_checkpoints), sorted(effects), sorted(task_rows))


@dataclass
class Batch:
    """The WorkingSet of one write transaction: rows loaded up front, changes staged."""

    tasks: dict[str, TaskState | None]
    last_checkpoints: dict[str, Checkpoint | None]
    effects: dict[tuple[str, str], Effect | None]
    dirty_tasks: dict[str, TaskState] = field(default_factory=dict)
    new_attempts: list[Attempt] = field(default_factory=list)
    ended_attempts: list[tuple[str, datetime, AttemptEnd, datetime]] = field(default_factory=list)
    noted_exits: list[tuple[str, str, int, AgentExit]] = field(default_factory=list)
    new_checkpoints: list[Checkpoint] = field(default_factory=list)
    dirty_effects: dict[tuple[str, str], Effect] = field(default_factory=dict)
    new_events: list[EffectEvent] = field(default_factory=list)
    new_refusals: list[FenceRefusal] = field(default_factory=list)
    task_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    deleted_tasks: list[str] = field(default_factory=list)
    #: when a :class:`Probe` of the batch asked for the test write (None: none did).
    probed_at: datetime | None = None
    #: each loaded task's lease as stored: a lease a batch did not change is not
    #: written again (a checkpoint or a mark moves the task row, not its lease).
    stored_leases: dict[str, Lease | None] = field(init=False)

    def __post_init__(self) -> None:
        self.stored_leases = {
            task: None if state is None else state.lease for task, state in self.tasks.items()
        }

    def task(self, task: str) -> TaskState | None:
        return self.tasks.get(task)

    def put_task(self, state: TaskState) -> None:
        self.tasks[state.task] = state
        self.dirty_tasks[state.task] = state

    def add_attempt(self, attempt: Attempt) -> None:
        self.new_attempts.append(attempt)

    def end_attempt(
        self, attempt_id: str, at: datetime, reason: AttemptEnd, lease_until: datetime
    ) -> None:
        self.ended_attempts.append((attempt_id, at, reason, lease_until))

    def note_exit(self, task: str, attempt_id: str, generation: int, exit: AgentExit) -> None:
        self.noted_exits.append((task, attempt_id, generation, exit))

    def last_checkpoint(self, task: str) -> Checkpoint | None:
        return self.last_checkpoints.get(task)

    def add_checkpoint(self, checkpoint: Checkpoint) -> None:
        self.last_checkpoints[checkpoint.task] = checkpoint
        self.new_checkpoints.append(checkpoint)

    def effect(self, task: str, key: str) -> Effect | None:
        return self.effects.get((task, key))

    def put_effect(self, effect: Effect) -> None:
        self.effects[(effect.task, effect.key)] = effect
        self.dirty_effects[(effect.task, effect.key)] = effect

    def add_event(self, event: EffectEvent) -> None:
        self.new_events.append(event)

    def add_refusal(self, refusal: FenceRefusal) -> None:
        self.new_refusals.append(refusal)

    def task_rows(self, task: str) -> dict[str, int]:
        return dict(self.task_counts.get(task, {}))

    def delete_task(self, task: str) -> None:
        # Deletes run before every other change of the batch (see changes()), so what
        # earlier commands of this batch staged for the task is dropped with it.
        self.deleted_tasks.append(task)
        self.tasks[task] = None
        self.stored_leases.pop(task, None)  # its lease row goes: a new one is written
        self.last_checkpoints[task] = None
        self.task_counts.pop(task, None)
        self.dirty_tasks.pop(task, None)
        for key in [k for k in self.effects if k[0] == task]:
            self.effects[key] = None
            self.dirty_effects.pop(key, None)
        self.new_attempts = [a for a in self.new_attempts if a.task != task]
        self.noted_exits = [n for n in self.noted_exits if n[0] != task]
        self.new_checkpoints = [c for c in self.new_checkpoints if c.task != task]
        self.new_events = [e for e in self.new_events if e.task != task]
        self.new_refusals = [r for r in self.new_refusals if r.task != task]

    @classmethod
    def loaded(
        cls,
        tasks: Sequence[rows.Row],
        last_checkpoints: Sequence[rows.Row],
        effects: Sequence[rows.Row],
        task_rows: Sequence[rows.Row] = (),
        *,
        known_tasks: Mapping[str, TaskState | None] | None = None,
    ) -> Batch:
        """A batch over the rows the load statements returned (absent rows are None),
        and over ``known_tasks``: task states the store knew without reading them."""
        states: dict[str, TaskState | None] = dict(known_tasks) if known_tasks else {}
        for r in tasks:
            state = rows.task_state(r)
            states[state.task] = state
        return cls(
            tasks=states,
            last_checkpoints={(c := rows.checkpoint(r)).task: c for r in last_checkpoints},
            effects={((e := rows.effect(r)).task, e.key): e for r in effects},
            task_counts={
                r[0]: dict(
                    zip(
                        (*ROW_KINDS, "effects_unknown", "effects_pending"),
                        (int(n) for n in r[1:]),
                        strict=True,
                    )
                )
                for r in task_rows
            },
        )


def decide(works: Sequence[Work], batch: Batch, ctx: Context) -> list[Any]:
    """Let each work decide against ``batch``, in order; each one's outcome: a command's
    result or the SidecarError that refused it, None for a probe (whose test write
    :func:`changes` makes)."""
    outcomes: list[Any] = []
    for work in works:
        if isinstance(work, Probe):
            batch.probed_at = ctx.now
            outcomes.append(None)
            continue
        try:
            outcomes.append(work.apply(batch, ctx))
        except SidecarError as refused:
            outcomes.append(refused)
    return outcomes


#: the statements that delete a pruned task's rows, children first.
_DELETE_TASK = tuple(
    f"delete_task_{table}" for table in (*ROW_KINDS[:-1], "leases", "attempts", "tasks")
)


def _removals(batch: Batch) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """The first steps of :func:`changes`: the probe's row, then pruned tasks' rows."""
    steps: list[tuple[str, list[tuple[Any, ...]]]] = []
    if batch.probed_at is not None:
        steps += [("probe_insert", [(rows.to_us(batch.probed_at),)]), ("probe_delete", [()])]
    if batch.deleted_tasks:
        gone = [(task,) for task in batch.deleted_tasks]
        steps += [(name, gone) for name in _DELETE_TASK]
    return steps


def changes(batch: Batch) -> list[tuple[str, list[tuple[Any, ...]]]]:
    """``(statement name, rows)`` to write what the batch changed: the probe's test row
    written and deleted, pruned tasks' rows deleted (children first), then the writes,
    parents first; a lease only if it differs from the one stored.  Only the statements
    that have rows are listed (each step is tested first: a checkpoint batch writes two
    of the seventeen, and building the other fifteen empty lists showed up in the writer
    thread's time per batch)."""
    steps = _removals(batch)
    add = steps.append
    dirty = batch.dirty_tasks
    if dirty:
        add(("upsert_task", [rows.task_params(s) for s in dirty.values()]))
    if batch.new_attempts:
        add(("insert_attempt", [rows.attempt_params(a) for a in batch.new_attempts]))
    if batch.ended_attempts:
        ended = [
            (rows.to_us(at), reason.value, rows.to_us(until), aid)
            for aid, at, reason, until in batch.ended_attempts
        ]
        add(("end_attempt", ended))
    if batch.noted_exits:
        add(("note_attempt_exit", [rows.exit_params(*noted) for noted in batch.noted_exits]))
    if dirty:
        stored = batch.stored_leases
        leases = [
            rows.lease_params(s.task, s.lease)
            for s in dirty.values()
            if s.lease is not None and s.lease != stored.get(s.task)
        ]
        if leases:
            add(("upsert_lease", leases))
    if batch.new_checkpoints:
        add(("insert_checkpoint", [rows.checkpoint_params(c) for c in batch.new_checkpoints]))
    if batch.dirty_effects:
        add(("upsert_effect", [rows.effect_params(e) for e in batch.dirty_effects.values()]))
    if batch.new_events:
        add(("insert_event", [rows.event_params(e) for e in batch.new_events]))
    if batch.new_refusals:
        add(("insert_refusal", [rows.refusal_params(r) for r in batch.new_refusals]))
    return steps
