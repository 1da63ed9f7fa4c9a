"""A task's end and what is kept after it: ``sidecar tasks done|reopen TASK``,
``sidecar prune --older-than 30d [--dry-run]`` and ``sidecar effects --jsonl``.

``tasks done`` marks a task done as an operator (no fencing token: refused while a lease
on it is live); claims of a done task are refused (409 ``task_done``, ``sidecar exec``
exits 1 saying so) until ``tasks reopen``.  Both act on a running sidecar
(``--control``) or straight on its store.  ``main`` hands ``tasks done ...`` and ``tasks
reopen ...`` to :func:`build_tasks_parser`, as it does ``effects resolve``.

``prune`` deletes the whole history of tasks that ended - last updated before the cutoff,
no live lease, no effect waiting for a human or still pending - one task per transaction
(:class:`~sidecar.store.commands.PruneTask`); ``--dry-run`` says what would go and
deletes nothing.  Archive first with ``sidecar effects --jsonl``: one JSON object per
effect (with its audit trail) per line, newest first, read a page at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any
from urllib.parse import quote

from sidecar.cli.control_client import ControlClient, add_control_options
from sidecar.cli.durations import duration
from sidecar.cli.options import add_store_options, existing_store, settings
from sidecar.cli.resolve import default_by
from sidecar.control.schemas import EffectOut, MarkOut
from sidecar.domain.model import EffectEvent
from sidecar.errors import ConfigError
from sidecar.runtime.clock import SystemClock
from sidecar.store import Store, create_store
from sidecar.store.base import EffectFilter
from sidecar.store.commands import Pruned

PAGE = 500


# ---- tasks done / tasks reopen ---------------------------------------------------


def build_tasks_parser(action: str) -> argparse.ArgumentParser:
    done = action == "done"
    parser = argparse.ArgumentParser(
        prog=f"sidecar tasks {action}",
        description="Mark TASK done: claims of it are refused (409 task_done; `sidecar "
        "exec` exits 1) until it is reopened. As an operator: refused while a lease on it "
        "is live (stop its worker, or wait for the lease to expire). A task done already "
        "stays as it was."
        if done
        else "Make a done TASK claimable again; who reopened it and why are kept.",
        epilog="Exit codes: 0 ok, 1 refused or failed, 2 usage, 5 store unavailable. "
        "Acts on a running sidecar with --control, else on the store (--data-dir/--store).",
    )
    parser.add_argument("task", metavar="TASK")
    parser.add_argument(
        "--note", metavar="TEXT", help="why" + ("" if done else " (default: reopened)")
    )
    parser.add_argument("--by", metavar="NAME", help="who (default: $USER@hostname)")
    add_control_options(parser.add_argument_group("where"))
    add_store_options(parser)
    parser.add_argument("--json", action="store_true", help="print the task as JSON")
    parser.set_defaults(run=lambda a: asyncio.run(_mark(a, action)))
    return parser


async def _mark(args: argparse.Namespace, action: str) -> int:
    by = (args.by if args.by is not None else default_by()).strip()
    note = args.note.strip() if args.note is not None else None
    if action == "reopen" and note is None:
        note = "reopened"
    if not by or note == "":
        raise ConfigError("--note and --by must not be blank")
    if args.control:
        body: dict[str, Any] = {"by": by} | ({"note": note} if note is not None else {})
        async with ControlClient(args.control, args.control_token_file) as control:
            found = await control.call(
                "POST", f"/v1/tasks/{quote(args.task, safe='')}/{action}", body=body
            )
        done = found.get("done")
        generation = found["generation"]
    else:
        async with existing_store(settings(args).store_url) as store:
            if action == "done":
                state = await store.mark_done(args.task, by, note)
            else:
                state = await store.reopen(args.task, by, note or "reopened")
        done = (
            None
            if state.done is None
            else MarkOut.model_validate(state.done).model_dump(mode="json")
        )
        generation = state.generation
    if args.json:
        print(json.dumps({"task": args.task, "generation": generation, "done": done}))
    elif done is not None:
        why = f" ({done['note']})" if done.get("note") else ""
        print(
            f"task {args.task} is done since {done['at']}, by {done['by']}{why}; claims "
            f"are refused until `sidecar tasks reopen {args.task}`"
        )
    else:
        print(f"task {args.task} is open: it can be claimed again")
    return 0


# ---- prune ----------------------------------------------------------------------


def register(verbs: Any) -> None:
    prune = verbs.add_parser(
        "prune",
        help="delete the history of tasks that ended (archive first: effects --jsonl)",
        description="Delete everything recorded for tasks that ended - attempts, "
        "checkpoints, effects and their audit trail, refused writes, the lease and the "
        "task - when they were last updated more than --older-than ago. Never a task "
        "whose lease is live, nor one with an effect waiting for a human (unknown) or "
        "still pending. Each task goes in one transaction. Archive first with "
        "`sidecar effects --jsonl > audit.jsonl`.",
        epilog="Exit codes: 0 ok, 1 error, 2 usage, 5 store unavailable.",
    )
    prune.add_argument(
        "--older-than",
        type=duration,
        required=True,
        metavar="AGE",
        help="last update at least this long ago: 30d, 12h, 90m",
    )
    prune.add_argument(
        "--dry-run", action="store_true", help="say what would be deleted; delete nothing"
    )
    add_store_options(prune)
    prune.add_argument("--json", action="store_true", help="one JSON object per task")
    prune.set_defaults(run=lambda a: asyncio.run(_prune(a)))


async def _candidates(store: Store, cutoff: datetime) -> AsyncIterator[str]:
    after: str | None = None
    while True:
        names = await store.stale_tasks(cutoff, after, PAGE)
        for name in names:
            yield name
        if len(names) < PAGE:
            return
        after = names[-1]


def _counts(rows: dict[str, int]) -> str:
    return " ".join(f"{kind}={n}" for kind, n in rows.items())


async def _prune(args: argparse.Namespace) -> int:
    cutoff = SystemClock().now() - args.older_than
    gone: list[Pruned] = []
    kept = 0
    async with existing_store(settings(args).store_url) as store:
        async for name in _candidates(store, cutoff):
            found = await store.prune_task(name, cutoff, dry_run=args.dry_run)
            if args.json:
                print(json.dumps({"task": found.task, "rows": found.rows, "kept": found.kept,
                                  "deleted": found.deleted}))  # fmt: skip
            elif found.kept is not None:
                print(f"kept {found.task}: {found.kept}")
            else:
                verb = "would delete" if args.dry_run else "deleted"
                print(f"{verb} {found.task}: {_counts(found.rows)}")
            if found.kept is None:
                gone.append(found)
            else:
                kept += 1
        backend = (await store.info()).backend
    if not args.json:
        verb = "would be deleted" if args.dry_run else "deleted"
        rows = sum(sum(p.rows.values()) for p in gone)
        print(
            f"{len(gone)} task(s) {verb} ({rows} rows), {kept} kept; cutoff "
            f"{cutoff.isoformat(timespec='seconds')}"
        )
        if gone and not args.dry_run and backend == "sqlite":
            print(
                "the SQLite file keeps the freed pages for new records; to give the space "
                "back to the disk, run VACUUM on it while the sidecar is stopped",
                file=sys.stderr,
            )
    return 0


# ---- effects --jsonl --------------------------------------------------------------


async def export_jsonl(args: argparse.Namespace) -> int:
    """Every effect (of ``--task``, or of all tasks), newest first, one per line."""
    task = args.task_filter or args.task
    lines = _through_control(args, task) if args.control else _from_store(args, task)
    async for effect in lines:
        if args.since is not None and effect.created_at < args.since:
            break
        sys.stdout.write(effect.model_dump_json() + "\n")
    sys.stdout.flush()
    return 0


async def _from_store(args: argparse.Namespace, task: str | None) -> AsyncIterator[EffectOut]:
    store = create_store(settings(args).store_url, read_only=True)
    await store.open()
    try:
        after: tuple[datetime, str, str] | None = None
        while True:
            found = await store.effects_across(EffectFilter(task=task), after, PAGE)
            trail: dict[tuple[str, str], list[EffectEvent]] = {}
            for event in await store.effect_events_of([(e.task, e.key) for e in found]):
                trail.setdefault((event.task, event.key), []).append(event)
            for effect in found:
                yield EffectOut.of(effect, trail.get((effect.task, effect.key), []))
            if len(found) < PAGE:
                return
            last = found[-1]
            after = (last.created_at, last.task, last.key)
    finally:
        await store.close()


async def _through_control(args: argparse.Namespace, task: str | None) -> AsyncIterator[EffectOut]:
    async with ControlClient(args.control, args.control_token_file) as control:
        cursor: str | None = None
        while True:
            query = {"limit": str(PAGE)} | ({"task": task} if task else {})
            found = await control.get("/v1/effects", query | ({"cursor": cursor} if cursor else {}))
            for item in found["effects"]:
                yield EffectOut.model_validate(item)
            cursor = found["next_cursor"]
            if cursor is None:
                return
