"""``sidecar tasks`` and ``sidecar effects``: what a sidecar knows, as tables or JSON.

They read the store directly (read-only: they work while the sidecar runs and after it
died, which is when an operator needs them most) or, with ``--control URL``, a running
sidecar's control API (in Kubernetes: a port-forward, no ``kubectl exec``).  Both sources
give the control API's shapes (:mod:`sidecar.control.schemas`), so the tables and
``--json`` are the same whichever was read.  Lists are read a page at a time and stop at
``--limit``; tables fit ``COLUMNS`` (or the terminal), shortening long cells in the
middle so the distinguishing end of a path stays.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol
from urllib.parse import quote

from sidecar.cli import lifecycle, tables
from sidecar.cli.control_client import ControlClient, add_control_options
from sidecar.cli.durations import since
from sidecar.cli.options import add_store_options, settings
from sidecar.control.schemas import (
    CheckpointOut,
    EffectOut,
    EffectPage,
    TaskOut,
    TaskPage,
    TaskSummary,
    with_trails,
)
from sidecar.errors import ConfigError, NotFound
from sidecar.runtime.clock import SystemClock
from sidecar.store import Store, create_store
from sidecar.store.base import TASK_STATES, TaskFilter

PAGE = 500
DEFAULT_LIMIT = 1000


def register(verbs: Any) -> None:
    tasks = verbs.add_parser(
        "tasks",
        help="list tasks, or show one task's lease, attempts and checkpoints",
        description="Without TASK: one line per task, newest first. With TASK: its lease, "
        "every attempt and how it ended, the checkpoint history and any writes refused by "
        "fencing.",
    )
    tasks.add_argument(
        "task",
        nargs="?",
        metavar="TASK",
        help="one task (`sidecar tasks done|reopen TASK`: see their --help)",
    )
    tasks.add_argument("--state", choices=TASK_STATES, help="only tasks in this state")
    tasks.add_argument("--worker", help="only tasks whose lease is this worker's")
    _common(tasks)
    tasks.set_defaults(run=lambda a: asyncio.run(_tasks(a)))

    effects = verbs.add_parser(
        "effects",
        help="show a task's effect log and its audit trail",
        description="Every effect of TASK with its state and the attempt that caused it, "
        "then the audit trail (recorded, completed, replayed, probed, ...) in order.",
        epilog="To settle an effect that waits for a human: sidecar effects resolve TASK "
        "EFFECT_KEY --as completed|failed|abandoned [--status N --header K:V --body JSON] "
        "--note TEXT (see `sidecar effects resolve --help`; a task named resolve: "
        "`sidecar effects -- resolve`).",
    )
    effects.add_argument("task", nargs="?", metavar="TASK")
    export = effects.add_argument_group(
        "export (--jsonl): the audit trail to archive, e.g. before `sidecar prune`"
    )
    export.add_argument(
        "--jsonl",
        action="store_true",
        help="one JSON object per effect, with its audit trail, per line, newest first; "
        "every task's unless TASK or --task is given",
    )
    export.add_argument(
        "--since",
        type=since,
        metavar="AGE|TIME",
        help="only effects first recorded since then: 30d, 12h, 90m or an ISO-8601 time",
    )
    export.add_argument("--task", dest="task_filter", metavar="TASK", help="only this task's")
    _common(effects)
    effects.set_defaults(run=lambda a: asyncio.run(_effects(a)))


def _common(parser: argparse.ArgumentParser) -> None:
    add_store_options(parser)
    add_control_options(parser)
    parser.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"show at most N lines of a list (default {DEFAULT_LIMIT})",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")


class Source(Protocol):
    """Where the verbs read: a store, or a running sidecar's control API."""

    async def tasks(self, where: TaskFilter, limit: int) -> tuple[list[TaskSummary], bool]: ...

    async def task(self, task: str) -> tuple[TaskOut, list[CheckpointOut]]: ...

    async def effects(self, task: str, limit: int) -> tuple[list[EffectOut], bool]: ...


class StoreSource:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def tasks(self, where: TaskFilter, limit: int) -> tuple[list[TaskSummary], bool]:
        now = SystemClock().now()
        views = await self.store.tasks_page(where, None, limit + 1, now)
        return [TaskSummary.of(v, now) for v in views[:limit]], len(views) > limit

    async def task(self, task: str) -> tuple[TaskOut, list[CheckpointOut]]:
        view = await self.store.task_view(task)
        if view is None:
            raise NotFound(f"task {task} has never been claimed")
        refusals = await self.store.refusals(task)
        checkpoints = await self.store.checkpoints(task)
        out = TaskOut.of(view, refusals, SystemClock().now())
        return out, [CheckpointOut.model_validate(c) for c in checkpoints]

    async def effects(self, task: str, limit: int) -> tuple[list[EffectOut], bool]:
        if await self.store.task_view(task) is None:
            raise NotFound(f"task {task} has never been claimed")
        found = await self.store.effects_page(task, None, limit + 1)
        page = found[:limit]
        events = await self.store.effect_events_of([(task, e.key) for e in page])
        return with_trails(page, events), len(found) > limit


class ControlSource:
    def __init__(self, control: ControlClient) -> None:
        self.control = control

    async def _pages(
        self, path: str, key: str, query: dict[str, str], limit: int
    ) -> tuple[list[Any], bool]:
        """Up to ``limit`` items of list route ``path`` (answer member ``key``), following
        its cursor; and whether there were more."""
        items: list[Any] = []
        cursor = None
        while True:
            asked = query | {"limit": str(min(PAGE, limit - len(items) + 1))}
            found = await self.control.get(path, asked | ({"cursor": cursor} if cursor else {}))
            items += found[key]
            cursor = found["next_cursor"]
            if cursor is None or len(items) > limit:
                return items[:limit], len(items) > limit or cursor is not None

    async def tasks(self, where: TaskFilter, limit: int) -> tuple[list[TaskSummary], bool]:
        query = {k: v for k, v in (("state", where.state), ("worker", where.worker)) if v}
        found, more = await self._pages("/v1/tasks", "tasks", query, limit)
        return TaskPage.model_validate({"tasks": found, "next_cursor": None}).tasks, more

    async def task(self, task: str) -> tuple[TaskOut, list[CheckpointOut]]:
        path = f"/v1/tasks/{quote(task, safe='')}"
        out = TaskOut.model_validate(await self.control.get(path))
        checkpoints, _ = await self._pages(f"{path}/checkpoints", "checkpoints", {}, 1 << 30)
        return out, [CheckpointOut.model_validate(c) for c in checkpoints]

    async def effects(self, task: str, limit: int) -> tuple[list[EffectOut], bool]:
        path = f"/v1/tasks/{quote(task, safe='')}/effects"
        found, more = await self._pages(path, "effects", {}, limit)
        return EffectPage.model_validate({"effects": found, "next_cursor": None}).effects, more


@asynccontextmanager
async def _source(args: argparse.Namespace) -> AsyncIterator[Source]:
    if args.control:
        async with ControlClient(args.control, args.control_token_file) as control:
            yield ControlSource(control)
        return
    store = create_store(settings(args).store_url, read_only=True)
    await store.open()
    try:
        yield StoreSource(store)
    finally:
        await store.close()


def _dump(models: Sequence[Any]) -> str:
    return json.dumps([m.model_dump(mode="json") for m in models])


async def _tasks(args: argparse.Namespace) -> int:
    async with _source(args) as source:
        if args.task is None:
            listed, more = await source.tasks(TaskFilter(args.state, args.worker), args.limit)
        else:
            task, checkpoints = await source.task(args.task)
    if args.task is None:
        if args.json:
            print(_dump(listed))
        else:
            lines = [_task_line(t) for t in listed]
            print(tables.render(_TASK_HEADERS, lines, flexible=_TASK_FLEXIBLE))
            _more(more, args.limit)
        return 0
    if args.json:
        out = task.model_dump(mode="json")
        out["checkpoints"] = [c.model_dump(mode="json") for c in checkpoints]
        print(json.dumps(out))
        return 0
    _print_task(task, checkpoints)
    return 0


_TASK_HEADERS = ["TASK", "STATE", "GEN", "WORKER", "ATTEMPT", "LEASE", "LAST STAGE", "EFFECTS"]
_TASK_FLEXIBLE = {"TASK", "WORKER", "ATTEMPT", "LAST STAGE", "EFFECTS"}


def _lease_text(lease: Any) -> str:
    if lease is None:
        return "-"
    if lease.released_at is not None:
        return f"released {tables.cell(lease.released_at)}"
    verb = "live until" if lease.live else "expired"
    return f"{verb} {tables.cell(lease.expires_at)}"


def _task_line(t: TaskSummary) -> tuple[object, ...]:
    counts = " ".join(f"{k}={v}" for k, v in sorted(t.effects.items()) if v) or "-"
    state = f"{t.state}, {t.waiting_for_human} waiting" if t.waiting_for_human else t.state
    return (
        t.task,
        state,
        t.generation,
        t.lease.worker if t.lease else None,
        t.lease.attempt_id if t.lease else None,
        _lease_text(t.lease),
        t.last_checkpoint.stage if t.last_checkpoint else None,
        counts,
    )


def _print_task(task: TaskOut, checkpoints: list[CheckpointOut]) -> None:
    lease = task.lease
    print(f"task {task.task}  generation {task.generation}")
    if lease is not None:
        print(
            f"lease: {lease.worker} / {lease.attempt_id} (gen {lease.generation}), "
            f"{_lease_text(lease)}"
        )
    print("\nattempts")
    attempts = [
        (a.generation, a.attempt_id, a.worker, a.claimed_at, a.ended_at, a.how)
        for a in task.attempts
    ]
    headers = ["GEN", "ATTEMPT", "WORKER", "CLAIMED", "ENDED", "HOW"]
    print(tables.render(headers, attempts, flexible={"WORKER"}))
    print("\ncheckpoints")
    lines = [
        (c.seq, c.stage, c.generation, c.attempt_id, c.created_at, _compact(c.outputs))
        for c in checkpoints
    ]
    headers = ["SEQ", "STAGE", "GEN", "ATTEMPT", "AT", "OUTPUTS"]
    print(tables.render(headers, lines, flexible={"STAGE", "OUTPUTS"}))
    if task.refused_writes:
        print("\nrefused writes (fencing)")
        refused = [
            (r.at, r.operation, r.attempt_id, r.generation, r.current_generation, r.reason)
            for r in task.refused_writes
        ]
        print(tables.render(["AT", "OPERATION", "ATTEMPT", "GEN", "CURRENT", "REASON"], refused))


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


async def _effects(args: argparse.Namespace) -> int:
    if args.jsonl:
        return await lifecycle.export_jsonl(args)
    if args.since is not None or args.task_filter is not None:
        raise ConfigError("--since and --task go with --jsonl")
    if args.task is None:
        raise ConfigError("give TASK, or --jsonl to export every task's effects")
    async with _source(args) as source:
        effects, more = await source.effects(args.task, args.limit)
    if args.json:
        print(_dump(effects))
        return 0
    if not effects:
        print(f"task {args.task}: no effects recorded")
        return 0
    print(f"effects of task {args.task}")
    headers = ["KEY", "STATE", "RULE", "WHAT", "FIRST ATTEMPT", "LAST ATTEMPT", "GEN", "ANSWER"]
    rows = [
        (
            e.key,
            e.state,
            e.rule,
            _what(e),
            e.origin_attempt_id,
            e.attempt_id,
            e.generation,
            _answer(e),
        )
        for e in effects
    ]
    print(tables.render(headers, rows, flexible={"KEY", "RULE", "WHAT"}))
    _more(more, args.limit)
    events = sorted(((ev, e.key) for e in effects for ev in e.events), key=lambda pair: pair[0].at)
    print("\naudit trail")
    print(
        tables.render(
            ["AT", "KEY", "EVENT", "ATTEMPT", "GEN", "DETAIL"],
            [(ev.at, key, ev.event, ev.attempt_id, ev.generation, ev.detail) for ev, key in events],
            flexible={"KEY", "DETAIL"},
        )
    )
    return 0


def _what(effect: EffectOut) -> str:
    """The request or statement an effect is."""
    request = effect.request
    if effect.kind == "sql":
        return str(request.get("statement", ""))
    return f"{request.get('method', '')} {request.get('url', '')}".strip()


def _answer(effect: EffectOut) -> str | int | None:
    """HTTP status, or for SQL the command tag the statement answered."""
    if effect.response is None:
        return None
    return effect.response.command_tag or effect.response.status


def _more(more: bool, limit: int) -> None:
    if more:
        print(f"(the first {limit}; --limit N for more, --json for all fields)")
