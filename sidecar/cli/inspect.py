"""``sidecar tasks`` and ``sidecar effects``: what the store holds, as tables or JSON.

They read the store directly (read-only), so they work while the sidecar runs and after
it died, which is when an operator needs them most.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import defaultdict
from typing import Any

from sidecar.cli import tables
from sidecar.cli.options import add_store_options, settings
from sidecar.clock import SystemClock
from sidecar.control.schemas import EffectOut, TaskOut
from sidecar.domain.model import Effect, EffectEvent, TaskView
from sidecar.errors import NotFound
from sidecar.store import Store, create_store


def register(verbs: Any) -> None:
    tasks = verbs.add_parser(
        "tasks",
        help="list tasks, or show one task's lease, attempts and checkpoints",
        description="Without TASK: one line per task. With TASK: its lease, every attempt, "
        "the checkpoint history and any writes refused by fencing.",
    )
    tasks.add_argument("task", nargs="?", metavar="TASK")
    add_store_options(tasks)
    tasks.add_argument("--json", action="store_true", help="print JSON instead of tables")
    tasks.set_defaults(run=lambda a: asyncio.run(_tasks(a)))

    effects = verbs.add_parser(
        "effects",
        help="show a task's effect log and its audit trail",
        description="Every effect of TASK with its state and the attempt that caused it, "
        "then the audit trail (recorded, completed, replayed, probed, ...) in order.",
    )
    effects.add_argument("task", metavar="TASK")
    add_store_options(effects)
    effects.add_argument("--json", action="store_true", help="print JSON instead of tables")
    effects.set_defaults(run=lambda a: asyncio.run(_effects(a)))


async def _open(args: argparse.Namespace) -> Store:
    store = create_store(settings(args).store_url, read_only=True)
    await store.open()
    return store


def _lease_text(view: TaskView) -> str:
    lease = view.state.lease
    if lease is None:
        return "-"
    if lease.released_at is not None:
        return f"released {tables.cell(lease.released_at)}"
    verb = "live until" if lease.is_live(SystemClock().now()) else "expired"
    return f"{verb} {tables.cell(lease.expires_at)}"


async def _tasks(args: argparse.Namespace) -> int:
    store = await _open(args)
    try:
        if args.task is None:
            views = await store.list_tasks()
            if args.json:
                now = SystemClock().now()
                print(json.dumps([TaskOut.of(v, [], now).model_dump(mode="json") for v in views]))
                return 0
            print(
                tables.render(
                    ["TASK", "GEN", "WORKER", "ATTEMPT", "LEASE", "LAST STAGE", "EFFECTS"],
                    [_task_line(v) for v in views],
                )
            )
            return 0
        view = await store.task_view(args.task)
        if view is None:
            raise NotFound(f"task {args.task} has never been claimed")
        refusals = await store.refusals(args.task)
        checkpoints = await store.checkpoints(args.task)
    finally:
        await store.close()
    if args.json:
        out = TaskOut.of(view, refusals, SystemClock().now()).model_dump(mode="json")
        out["checkpoints"] = [
            {
                "seq": c.seq,
                "stage": c.stage,
                "attempt_id": c.attempt_id,
                "generation": c.generation,
                "created_at": c.created_at.isoformat(),
                "outputs": c.outputs,
            }
            for c in checkpoints
        ]
        print(json.dumps(out))
        return 0
    lease = view.state.lease
    print(f"task {view.state.task}  generation {view.state.generation}")
    if lease is not None:
        print(
            f"lease: {lease.worker} / {lease.attempt_id} (gen {lease.generation}), "
            f"{_lease_text(view)}"
        )
    print("\nattempts")
    print(
        tables.render(
            ["GEN", "ATTEMPT", "WORKER", "CLAIMED", "ENDED", "HOW"],
            [
                (
                    a.generation,
                    a.attempt_id,
                    a.worker,
                    a.claimed_at,
                    a.ended_at,
                    a.end_reason.value
                    if a.end_reason
                    else (
                        "current"
                        if lease and lease.attempt_id == a.attempt_id and lease.released_at is None
                        else None
                    ),
                )
                for a in view.attempts
            ],
        )
    )
    print("\ncheckpoints")
    print(
        tables.render(
            ["SEQ", "STAGE", "GEN", "ATTEMPT", "AT", "OUTPUTS"],
            [
                (
                    c.seq,
                    c.stage,
                    c.generation,
                    c.attempt_id,
                    c.created_at,
                    json.dumps(c.outputs, separators=(",", ":"))[:60],
                )
                for c in checkpoints
            ],
        )
    )
    if refusals:
        print("\nrefused writes (fencing)")
        print(
            tables.render(
                ["AT", "OPERATION", "ATTEMPT", "GEN", "CURRENT", "REASON"],
                [
                    (r.at, r.operation, r.attempt_id, r.generation, r.current_generation, r.reason)
                    for r in refusals
                ],
            )
        )
    return 0


def _task_line(view: TaskView) -> tuple[object, ...]:
    lease = view.state.lease
    counts = " ".join(f"{k}={v}" for k, v in sorted(view.effect_counts.items())) or "-"
    return (
        view.state.task,
        view.state.generation,
        lease.worker if lease else None,
        lease.attempt_id if lease else None,
        _lease_text(view),
        view.last_checkpoint.stage if view.last_checkpoint else None,
        counts,
    )


async def _effects(args: argparse.Namespace) -> int:
    store = await _open(args)
    try:
        if await store.task_view(args.task) is None:
            raise NotFound(f"task {args.task} has never been claimed")
        effects = await store.effects(args.task)
        events = await store.effect_events(args.task)
    finally:
        await store.close()
    trail: dict[str, list[EffectEvent]] = defaultdict(list)
    for event in events:
        trail[event.key].append(event)
    if args.json:
        print(json.dumps([EffectOut.of(e, trail[e.key]).model_dump(mode="json") for e in effects]))
        return 0
    if not effects:
        print(f"task {args.task}: no effects recorded")
        return 0
    print(f"effects of task {args.task}")
    print(
        tables.render(
            [
                "KEY",
                "STATE",
                "RULE",
                "WHAT",
                "FIRST ATTEMPT",
                "LAST ATTEMPT",
                "GEN",
                "ANSWER",
                "UPDATED",
            ],
            [
                (
                    e.key,
                    e.state.value,
                    e.rule,
                    _what(e),
                    e.origin_attempt_id,
                    e.attempt_id,
                    e.generation,
                    _answer(e),
                    e.updated_at,
                )
                for e in effects
            ],
        )
    )
    print("\naudit trail")
    print(
        tables.render(
            ["AT", "KEY", "EVENT", "ATTEMPT", "GEN", "DETAIL"],
            [(ev.at, ev.key, ev.event, ev.attempt_id, ev.generation, ev.detail) for ev in events],
        )
    )
    return 0


def _what(effect: Effect, width: int = 44) -> str:
    """The request or statement an effect is, shortened to fit a table cell."""
    request = effect.request if isinstance(effect.request, dict) else {}
    if effect.kind == "sql":
        text = str(request.get("statement", ""))
    else:
        text = f"{request.get('method', '')} {request.get('url', '')}".strip()
    return text if len(text) <= width else text[: width - 3] + "..."


def _answer(effect: Effect) -> str | int | None:
    """HTTP status, or for SQL the command tag the statement answered."""
    if effect.response is None:
        return None
    tag = dict(effect.response.headers).get("x-command-tag")
    return tag or effect.response.status
