"""A month of synthetic history for ``sidecar review``: every kind of figure it reports.

    python -m bench.review_history --data-dir DIR [--days 30] [--tasks 60] [--seed 7]
    ./run bench review_history --data-dir DIR

Fills the SQLite store of DIR through the store's own commands (claim, checkpoints,
effects pending then completed, replays, divergent replays and rejections, unknown
effects settled by a human - completed, failed, abandoned - through the settle path,
uncovered writes, stale writes refused by fencing, proxy refusals), on a ManualClock
that walks from ``--days`` ago to now, so every record carries a time in the window.
Task ``i`` of ``N`` starts at ``i / N`` of the way; its stages take 10 % to 97 % of its
lease.  Prints what it wrote, as the figures the review should find.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
from collections import Counter
from datetime import timedelta
from pathlib import Path

from sidecar.domain import settling
from sidecar.domain.model import EffectState, RecordedResponse
from sidecar.errors import StaleGeneration
from sidecar.runtime.clock import ManualClock, SystemClock
from sidecar.store import Store, create_store
from sidecar.store.settle import landing_of, resolve_effect

STAGES = ("READ_COMPLETE", "PATCH_GENERATED", "PATCH_APPLIED", "PR_OPENED")
OUTCOMES = ("completed", "failed", "abandoned")


async def _effect(store: Store, task: str, key: str, att: str, gen: int, kind: str = "http"):  # type: ignore[no-untyped-def]
    rule = "uncovered" if kind == "uncovered" else "github.pulls.create"
    await store.record_pending(task, key, att, gen, kind=kind, rule=rule, fingerprint="fp-" + key,
                               idempotency_key=None, request={"method": "POST"})  # fmt: skip


async def one_task(
    store: Store, clock: ManualClock, rng: random.Random, i: int, seen: Counter[str]
) -> None:
    task = f"hist-{i:04d}"
    ttl = rng.choice((300.0, 600.0, 900.0))
    first = await store.claim(task, "worker-a", ttl)
    att, gen = first.attempt_id, first.generation
    # stages: near the lease on every third task, far from it otherwise
    for stage in STAGES[:2]:
        share = rng.uniform(0.82, 0.97) if i % 3 == 0 else rng.uniform(0.1, 0.5)
        clock.advance(share * ttl)
        await store.append_checkpoint(task, att, gen, stage, {})
        seen["stages"] += 1
    key = f"acme/repo#pull:agent/{task}"
    await _effect(store, task, key, att, gen)
    scenario = i % 6
    if scenario == 5:  # left unknown; then settled by a human (outcome rotates)
        await store.transition_effect(task, key, att, gen, EffectState.UNKNOWN, detail="timeout")
        await store.release(task, att, gen)
        clock.advance(3600)
        second = await store.claim(task, "worker-b", ttl)
        await store.note_effect(task, key, second.attempt_id, second.generation, "blocked")
        await store.release(task, second.attempt_id, second.generation)
        clock.advance(3600)
        outcome = settling.Outcome(OUTCOMES[(i // 6) % 3])
        response = RecordedResponse(201) if outcome is settling.Outcome.COMPLETED else None
        note = f"checked the upstream for {task}"
        resolution = settling.Resolution(outcome, "alice@ops", note, response)
        await resolve_effect(store, task, key, resolution, landing_of(None))
        seen[f"settled_{outcome.value}"] += 1
        seen["waited"] += 1
        return
    await store.transition_effect(task, key, att, gen, EffectState.COMPLETED,
                                  response=RecordedResponse(201))  # fmt: skip
    if scenario in (1, 2, 3):  # worker A evicted: its lease expires, B takes over
        clock.advance(ttl + 1)
        second = await store.claim(task, "worker-b", ttl)
        att2, gen2 = second.attempt_id, second.generation
        if scenario == 1:
            await store.note_effect(task, key, att2, gen2, "replayed")
            seen["replays"] += 1
        elif scenario == 2:
            detail = "payload differs from the recorded one"
            await store.note_effect(task, key, att2, gen2, "replayed", detail)
            seen["replays"] += 1
            seen["divergent_replays"] += 1
        else:
            await store.note_effect(task, key, att2, gen2, "divergent", "rejected: payload differs")
            seen["divergent_rejected"] += 1
        clock.advance(rng.uniform(0.1, 0.4) * ttl)
        await store.append_checkpoint(task, att2, gen2, STAGES[2], {})
        seen["stages"] += 1
        try:  # A, rescheduled, writes late: refused, and kept as evidence
            await store.append_checkpoint(task, att, gen, STAGES[2], {})
        except StaleGeneration:
            seen["refused"] += 1
        if scenario == 3:  # and its proxy refused a request of it before the store
            await store.note_refusal(
                StaleGeneration(task, att, gen, gen2, "lease lost"), "lease lost"
            )
            seen["refused"] += 1
        await store.release(task, att2, gen2)
        return
    if scenario == 4:  # a write no rule covered
        ukey = f"uncovered:POST hooks.example.com /v1/notify#{rng.getrandbits(32):08x}"
        await _effect(store, task, ukey, att, gen, kind="uncovered")
        await store.transition_effect(task, ukey, att, gen, EffectState.COMPLETED,
                                      response=RecordedResponse(204))  # fmt: skip
        seen["uncovered"] += 1
    await store.release(task, att, gen)


async def generate(data_dir: Path, days: int, tasks: int, seed: int) -> Counter[str]:
    now = SystemClock().now()
    start = now - timedelta(days=days)
    clock = ManualClock(start)
    rng = random.Random(seed)
    seen: Counter[str] = Counter()
    store = create_store(f"sqlite:///{data_dir / 'effects.db'}", clock=clock)
    async with store:
        step = timedelta(days=days) / tasks
        for i in range(tasks):
            # each task starts at its share of the window (an hour in, so none is older)
            clock._now = start + timedelta(hours=1) + step * i
            await one_task(store, clock, rng, i, seen)
            if clock.now() > now:
                raise SystemExit(f"task {i} ran past now: give fewer --tasks or more --days")
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--tasks", type=int, default=60)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    seen = asyncio.run(generate(args.data_dir, args.days, args.tasks, args.seed))
    print(json.dumps(dict(sorted(seen.items()))))


if __name__ == "__main__":
    main()
