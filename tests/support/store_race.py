"""N workers racing for M tasks on one store, and the checker of what they did.

The workload of ``bench/stores.py`` (its contended phases) and of
tests/integration/store/test_store_under_load.py, which runs it small on real SQLite and
PostgreSQL stores and asserts the checker finds nothing.

    phase = Phase(backend, url, workers=8, procs=2, tasks=[...], ttl=0.3, seconds=3, seed=1)
    tallies = await run_phase(phase)      # what every worker saw (timings included)
    verdict = await check(phase, tallies)  # read back from the store and checked

``procs`` > 1 splits the workers over that many OS processes (this module with
``--child``), each with its own store instance: nodes sharing a store.

A worker, in a loop until the phase ends:

* claims a random task with a short TTL.  Refused (``LeaseHeld``), it either sleeps until
  the holder's lease expires and claims the same task again (racing the other waiters at
  the moment of expiry) or backs off 5-20 ms and picks another task;
* holding the lease, writes in a closed loop: one checkpoint, then one effect record
  (``record_pending`` + ``transition_effect`` to ``completed``), heartbeating every
  ``ttl/3``.  How the hold ends is drawn at the claim:

  - release early (30%): after 0.1-0.5 ttl; release late (25%): after 1-4 ttl;
  - walk away (20%): after 0.5-2 ttl it stops without releasing; the lease expires and
    the task is taken over;
  - zombie (25%): after 0.5-2 ttl it stops heartbeating, records one effect ``pending``,
    and keeps writing with its token: past expiry these are accepted while nobody has
    claimed the task (the documented rule: expiry only lets another worker take over),
    until a newer claim makes the store refuse them.  It stops at the first refusal (or
    2 ttl past expiry) and then, knowingly stale, tries once more each of checkpoint,
    effect record, heartbeat and release: every one must be refused with
    ``StaleGeneration``.  It also completes the effect it left pending: the outcome of
    an attempt's own forward is recorded even after it lost its lease (the effect
    happened), so that one is accepted, counted as an own outcome, and not a stale write.

Checked (``Checker``), from what the workers saw and from the store:

* double ownership: per task, the granted generations are exactly 1, 2, ..., n (one grant
  each, ``previous_attempt_id`` pointing at the one before); no grant starts before the
  previous holder's window ended, when that holder was another worker.  A window is
  ``[acquired, expires]`` with ``expires`` moved by every accepted heartbeat and cut at an
  accepted release; the same check runs on the store's attempts (``claimed_at``,
  ``lease_until``, never ``superseded`` by another worker), and both must agree;
* stale writes accepted: every checkpoint, effect row and effect event in the store carries
  the generation (and attempt) current at its timestamp - the newest claim at or before
  it, and not after that attempt's release - except a completion by the attempt that
  recorded the effect pending: the outcome of its own forward, which the store records
  even after a newer claim (``is_own_outcome`` in sidecar/domain/effects.py; the pending
  record itself is checked); no write the worker knew to be stale was accepted; and the
  counts add up: rows in the store = writes the workers saw accepted,
  fence refusals logged by the store = ``StaleGeneration`` answers seen.

Stamp order.  A store must stamp a batch with the time read once its transaction holds
the task's lock (PostgreSQL: the per-task advisory lock; SQLite: ``BEGIN IMMEDIATE``).
The stores once read it before waiting for the lock: a claim formed before the previous
holder's release but committed after it was decided right, yet stamped earlier than that
release, so the recorded windows overlapped.  Such a finding is still told apart, marked
"stamp order" (the workers' own clocks show the release had been sent before the
claimant was answered); a finding without that mark is a real double grant or stale write.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from sidecar.domain.model import Attempt, AttemptEnd, Effect, EffectState, RecordedResponse
from sidecar.errors import LeaseHeld, SidecarError, StaleGeneration
from sidecar.store import Store, create_store
from sidecar.store.rows import to_us

REPO = Path(__file__).resolve().parents[2]
RESPONSE = RecordedResponse(status=201, headers=(), body=b"")
OPS = ("claim", "checkpoint", "effect")


def wall_us() -> int:
    """Wall-clock microseconds: the clock the stores stamp rows with."""
    return time.time_ns() // 1000


# ---- what the workers do -----------------------------------------------------------


@dataclass(frozen=True)
class Phase:
    backend: str
    url: str
    workers: int
    procs: int
    tasks: list[str]
    ttl: float
    seconds: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.backend} N={self.workers} x{self.procs}"


@dataclass
class Tally:
    """What one process's workers did, as plain data (it travels between processes as JSON).

    ``grants``: one dict per granted claim.  ``writes``: one list per accepted write,
    ``[kind, task, generation, attempt, at_us, sent_us, known_stale]``.
    """

    latencies: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPS})
    counts: Counter[str] = field(default_factory=Counter)
    grants: list[dict[str, Any]] = field(default_factory=list)
    writes: list[list[Any]] = field(default_factory=list)
    began_us: int = 0
    ended_us: int = 0
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        # Not asdict(): it rebuilds a Counter from its items, counting the pairs.
        return json.dumps({**vars(self), "counts": dict(self.counts)})

    @classmethod
    def from_json(cls, text: str) -> Tally:
        data = json.loads(text)
        data["counts"] = Counter(data["counts"])
        return cls(**data)


@dataclass
class Hold:
    """One granted lease, as its worker knows it."""

    task: str
    attempt: str
    generation: int
    grant: dict[str, Any]
    last_heartbeat: float
    fenced: bool = False  # the store refused one of its writes: every later one is stale
    broken: bool = False  # an error other than a refusal: stop using it
    n: int = 0
    pending: list[str] = field(default_factory=list)


class Worker:
    def __init__(
        self,
        store: Store,
        name: str,
        phase: Phase,
        deadline: float,
        tally: Tally,
    ) -> None:
        self.store = store
        self.name = name
        self.tasks = phase.tasks
        self.ttl = phase.ttl
        self.deadline = deadline
        self.tally = tally
        self.counts = tally.counts
        self.rng = random.Random(f"{phase.seed}:{name}")

    def left(self) -> float:
        return self.deadline - time.perf_counter()

    async def run(self) -> None:
        task = self.rng.choice(self.tasks)
        while self.left() > 0:
            outcome = await self.claim(task)
            if isinstance(outcome, Hold):
                await self.work(outcome)
                task = self.rng.choice(self.tasks)
            elif isinstance(outcome, LeaseHeld) and self.rng.random() < 0.5:
                # Race the other waiters for this task at the moment its lease runs out.
                wait = (to_us(outcome.expires_at) - wall_us()) / 1e6 + self.rng.uniform(0, 0.003)
                await asyncio.sleep(max(0.0, min(wait, self.ttl, self.left())))
            else:
                await asyncio.sleep(max(0.0, min(self.rng.uniform(0.005, 0.02), self.left())))
                task = self.rng.choice(self.tasks)

    # ---- one call each, timed and recorded ---------------------------------------

    async def claim(self, task: str) -> Hold | SidecarError:
        sent, started = wall_us(), time.perf_counter()
        try:
            claim = await self.store.claim(task, self.name, self.ttl)
        except SidecarError as refused:
            self.tally.latencies["claim"].append(time.perf_counter() - started)
            if isinstance(refused, LeaseHeld):
                self.counts["lease_held"] += 1
            else:
                self.error("claim", refused)
            return refused
        self.tally.latencies["claim"].append(time.perf_counter() - started)
        self.counts["claims"] += 1
        acquired = claim.lease_expires_at - timedelta(seconds=self.ttl)
        grant = {
            "task": task,
            "generation": claim.generation,
            "worker": self.name,
            "attempt": claim.attempt_id,
            "previous": claim.previous_attempt_id,
            "acquired_us": to_us(acquired),
            "expires_us": to_us(claim.lease_expires_at),
            "released_us": None,
            "release_sent_us": None,
            "release_answered_us": None,
            "sent_us": sent,
            "answered_us": wall_us(),
        }
        self.tally.grants.append(grant)
        return Hold(task, claim.attempt_id, claim.generation, grant, time.perf_counter())

    def error(self, operation: str, error: SidecarError) -> None:
        self.counts[f"error {error.code}"] += 1
        if len(self.tally.errors) < 5:
            self.tally.errors.append(f"{self.name} {operation}: {error.code}: {error}")

    def refused(self, hold: Hold, operation: str, error: SidecarError, known_stale: bool) -> None:
        if isinstance(error, StaleGeneration):
            self.counts["refused"] += 1
            self.counts["stale_refused"] += known_stale
            hold.fenced = True
        else:
            self.error(operation, error)
            hold.broken = True

    def accepted(
        self, hold: Hold, kind: str, generation: int, at_us: int, sent: int, known_stale: bool
    ) -> None:
        self.tally.writes.append(
            [kind, hold.task, generation, hold.attempt, at_us, sent, known_stale]
        )
        if sent > hold.grant["expires_us"]:
            self.counts["late_accepted"] += 1  # past expiry, nobody had claimed: allowed

    async def checkpoint(self, hold: Hold) -> bool:
        hold.n += 1
        known_stale = hold.fenced
        self.counts["stale_attempts"] += known_stale
        sent, started = wall_us(), time.perf_counter()
        try:
            written = await self.store.append_checkpoint(
                hold.task, hold.attempt, hold.generation, "S", {"n": hold.n}
            )
        except SidecarError as refused:
            self.tally.latencies["checkpoint"].append(time.perf_counter() - started)
            self.refused(hold, "checkpoint", refused, known_stale)
            return False
        self.tally.latencies["checkpoint"].append(time.perf_counter() - started)
        self.counts["checkpoints"] += 1
        self.accepted(
            hold, "checkpoint", written.generation, to_us(written.created_at), sent, known_stale
        )
        return True

    async def effect(self, hold: Hold, *, complete: bool = True) -> bool:
        hold.n += 1
        key = f"{hold.attempt}:{hold.n}"
        known_stale = hold.fenced
        self.counts["stale_attempts"] += known_stale
        started = time.perf_counter()
        try:
            sent = wall_us()
            effect = await self.store.record_pending(
                hold.task,
                key,
                hold.attempt,
                hold.generation,
                kind="http",
                rule="bench",
                fingerprint="f",
                idempotency_key=None,
                request={},
            )
            self.accepted(
                hold, "pending", effect.generation, to_us(effect.created_at), sent, known_stale
            )
            if not complete:
                hold.pending.append(key)
                return True
            sent = wall_us()
            effect = await self.complete(hold, key)
            self.accepted(
                hold, "completed", effect.generation, to_us(effect.updated_at), sent, known_stale
            )
        except SidecarError as refused:
            self.tally.latencies["effect"].append(time.perf_counter() - started)
            self.refused(hold, "effect", refused, known_stale)
            return False
        self.tally.latencies["effect"].append(time.perf_counter() - started)
        self.counts["effects"] += 1
        return True

    async def complete(self, hold: Hold, key: str) -> Effect:
        """Record ``key``'s effect completed under ``hold``'s attempt."""
        return await self.store.transition_effect(
            hold.task, key, hold.attempt, hold.generation, EffectState.COMPLETED, response=RESPONSE
        )

    async def complete_pending(self, hold: Hold) -> None:
        """Complete an effect recorded while the lease was held (the zombie's last try).

        Not a stale write: the outcome of the attempt's own forward, of an effect still
        pending as it left it, is recorded even after the attempt lost its lease (the
        effect happened; see ``is_own_outcome`` in sidecar/domain/effects.py).
        """
        key = hold.pending.pop()
        known_stale = False
        sent = wall_us()
        try:
            effect = await self.complete(hold, key)
        except SidecarError as refused:
            self.refused(hold, "effect", refused, known_stale)
            return
        at_us = to_us(effect.updated_at)
        self.accepted(hold, "completed", effect.generation, at_us, sent, known_stale)
        self.counts["own_outcomes"] += hold.fenced

    async def heartbeat(self, hold: Hold) -> bool:
        known_stale = hold.fenced
        self.counts["stale_attempts"] += known_stale
        sent = wall_us()
        try:
            state = await self.store.heartbeat(hold.task, hold.attempt, hold.generation, self.ttl)
        except SidecarError as refused:
            self.refused(hold, "heartbeat", refused, known_stale)
            return False
        assert state.lease is not None
        hold.grant["expires_us"] = max(hold.grant["expires_us"], to_us(state.lease.expires_at))
        hold.last_heartbeat = time.perf_counter()
        self.counts["heartbeats"] += 1
        if known_stale:
            self.tally.writes.append(
                ["heartbeat", hold.task, hold.generation, hold.attempt, sent, sent, True]
            )
        return True

    async def release(self, hold: Hold) -> None:
        known_stale = hold.fenced
        self.counts["stale_attempts"] += known_stale
        sent = wall_us()
        try:
            state = await self.store.release(hold.task, hold.attempt, hold.generation)
        except SidecarError as refused:
            self.refused(hold, "release", refused, known_stale)
            return
        assert state.lease is not None
        assert state.lease.released_at is not None
        hold.grant["released_us"] = to_us(state.lease.released_at)
        hold.grant["release_sent_us"] = sent
        hold.grant["release_answered_us"] = wall_us()
        self.counts["released"] += 1
        if known_stale:
            self.tally.writes.append(
                ["release", hold.task, hold.generation, hold.attempt, sent, sent, True]
            )

    # ---- one hold ------------------------------------------------------------------

    async def work(self, hold: Hold) -> None:
        draw = self.rng.random()
        mode, span = (
            ("release", self.rng.uniform(0.1, 0.5))
            if draw < 0.30
            else ("release", self.rng.uniform(1.0, 4.0))
            if draw < 0.55
            else ("walk-away", self.rng.uniform(0.5, 2.0))
            if draw < 0.75
            else ("zombie", self.rng.uniform(0.5, 2.0))
        )
        until = time.perf_counter() + span * self.ttl
        while time.perf_counter() < until and self.left() > 0:
            if time.perf_counter() - hold.last_heartbeat >= self.ttl / 3 and not (
                await self.heartbeat(hold)
            ):
                break
            if not (await self.checkpoint(hold) and await self.effect(hold)):
                break
        if hold.fenced or hold.broken:
            # Taken over while heartbeating: an answer came later than the TTL allowed.
            self.counts["lost_unplanned"] += hold.fenced
            return
        if mode == "release" or self.left() <= 0:
            await self.release(hold)
        elif mode == "walk-away":
            self.counts["walked_away"] += 1
        else:
            await self.zombie(hold)

    async def zombie(self, hold: Hold) -> None:
        """Stop heartbeating, keep writing with the old token until refused."""
        self.counts["zombies"] += 1
        await self.effect(hold, complete=False)
        give_up = hold.grant["expires_us"] + int(2 * self.ttl * 1e6)
        while not (hold.fenced or hold.broken) and wall_us() < give_up and self.left() > 0:
            if not await self.checkpoint(hold):
                break
            await self.effect(hold)
        if not hold.fenced:
            return  # nobody claimed the task meanwhile (always so with one worker)
        self.counts["zombies_fenced"] += 1
        # Fenced.  Every further write with this token is known stale and must be refused.
        await self.checkpoint(hold)
        await self.effect(hold)
        if hold.pending:
            await self.complete_pending(hold)
        await self.heartbeat(hold)
        await self.release(hold)


async def run_workers(store: Store, names: list[str], phase: Phase) -> Tally:
    tally = Tally()
    deadline = time.perf_counter() + phase.seconds
    tally.began_us = wall_us()
    workers = [Worker(store, name, phase, deadline, tally) for name in names]
    await asyncio.gather(*(worker.run() for worker in workers))
    tally.ended_us = wall_us()
    return tally


def worker_names(phase: Phase, proc: int) -> list[str]:
    return [f"n{proc}-w{i:02d}" for i in range(phase.workers) if i % phase.procs == proc]


async def run_in_process(phase: Phase) -> list[Tally]:
    store = create_store(phase.url)
    await store.open()
    try:
        return [await run_workers(store, worker_names(phase, 0), phase)]
    finally:
        await store.close()


async def run_split(phase: Phase) -> list[Tally]:
    """``phase.procs`` child processes (this module with --child), started together."""
    config = asdict(phase)
    children = []
    for proc in range(phase.procs):
        config["names"] = worker_names(phase, proc)
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.store_race",
            "--child",
            json.dumps(config),
            cwd=REPO,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        children.append(child)
        # One after another: two processes opening one new SQLite file at the same moment
        # can fail with "database is locked" (see docs/benchmarks.md).
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        if line != b"ready\n":
            raise RuntimeError(f"worker child {child.pid} did not start: {line!r}")
    for child in children:
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        await child.stdin.drain()
    outputs = await asyncio.gather(*(child.communicate() for child in children))
    for child in children:
        if child.returncode != 0:
            raise RuntimeError(f"worker child {child.pid} exited {child.returncode}")
    return [Tally.from_json(out.decode()) for out, _ in outputs]


async def child_main(config_json: str) -> None:
    config = json.loads(config_json)
    names = config.pop("names")
    phase = Phase(**config)
    store = create_store(phase.url)
    await store.open()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    try:
        tally = await run_workers(store, names, phase)
    finally:
        await store.close()
    sys.stdout.write(tally.to_json())


# ---- the checks --------------------------------------------------------------------


def window_end(grant: dict[str, Any]) -> int:
    """When a grant's lease stopped being live: its last expiry, or its release if sooner."""
    expires: int = grant["expires_us"]
    released: int | None = grant["released_us"]
    return expires if released is None else min(released, expires)


@dataclass
class Verdict:
    double_ownership: int = 0
    stale_accepted: int = 0
    #: of those, the ones where the store's timestamps contradict the order in which it
    #: committed (see ``stamp_order`` in Checker): counted, and told apart.
    stamp_order: Counter[str] = field(default_factory=Counter)
    disagreements: int = 0  # the store and the workers tell different stories
    rows_checked: int = 0
    takeovers: int = 0  # a worker claiming over its own live lease (allowed)
    own_outcomes: int = 0  # completions checked as their attempt's own outcome (allowed)
    problems: list[str] = field(default_factory=list)
    flagged: set[tuple[Any, ...]] = field(default_factory=set)

    def problem(
        self,
        kind: str,
        text: str,
        key: tuple[Any, ...] | None = None,
        *,
        stamp_order: bool = False,
    ) -> None:
        """Count one finding; a grant or write found by two checks (same key) counts once."""
        if key is not None:
            if key in self.flagged:
                return
            self.flagged.add(key)
        setattr(self, kind, getattr(self, kind) + 1)
        self.stamp_order[kind] += stamp_order
        if stamp_order:
            text += " [stamp order: see the docstring]"
        if len(self.problems) < 20:
            self.problems.append(f"{kind}: {text}")


def clock(us: int) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(us / 1e6)) + f".{us % 1_000_000:06d}"


class Checker:
    """The checks of one phase, over what every worker saw and what the store holds."""

    def __init__(self, store: Store, phase: Phase, tallies: list[Tally]) -> None:
        self.store = store
        self.phase = phase
        self.verdict = Verdict()
        self.grants: dict[str, list[dict[str, Any]]] = {task: [] for task in phase.tasks}
        for tally in tallies:
            for grant in tally.grants:
                self.grants[grant["task"]].append(grant)
        for grants in self.grants.values():
            grants.sort(key=lambda g: g["generation"])
        self.sent_of: dict[tuple[Any, ...], int] = {}
        self.seen_rows: Counter[str] = Counter()
        self.store_rows: Counter[str] = Counter()
        self.refusals_seen = sum(t.counts["refused"] for t in tallies)
        self.refusals_logged = 0
        self.attempts: dict[int, Attempt] = {}  # of the task being checked, by generation
        # (task, generation, attempt) that recorded an effect pending: its completion is
        # that attempt's own outcome, which the store accepts even after a newer claim.
        self.recorded_pending = {
            (w[1], w[2], w[3]) for t in tallies for w in t.writes if w[0] == "pending"
        }
        for tally in tallies:
            for kind, task, generation, attempt, at_us, sent, known_stale in tally.writes:
                self.sent_of[(kind, task, generation, attempt, at_us)] = sent
                if kind in {"checkpoint", "pending", "completed"}:
                    self.seen_rows[kind] += 1
                if known_stale:
                    self.verdict.problem(
                        "stale_accepted",
                        f"{task}: {kind} by gen {generation} ({attempt}) accepted after the "
                        "store had refused that attempt",
                        (kind, task, generation, attempt, at_us),
                    )

    async def run(self) -> Verdict:
        for task in self.phase.tasks:
            await self.task(task)
        # 5. Nothing written that nobody saw accepted, nothing accepted that is not there.
        for kind in ("checkpoint", "pending", "completed"):
            if self.store_rows[kind] != self.seen_rows[kind]:
                self.verdict.problem(
                    "disagreements",
                    f"{self.store_rows[kind]} {kind} rows in the store, "
                    f"{self.seen_rows[kind]} seen accepted",
                )
        if self.refusals_logged != self.refusals_seen:
            self.verdict.problem(
                "disagreements",
                f"{self.refusals_logged} fence refusals logged, "
                f"{self.refusals_seen} StaleGeneration seen",
            )
        return self.verdict

    async def task(self, task: str) -> None:
        verdict = self.verdict
        mine = self.grants[task]
        view = await self.store.task_view(task)
        attempts = sorted(view.attempts, key=lambda a: a.generation) if view else []

        # 1. Generations: 1, 2, ..., n, each granted once, chained to the one before.
        generations = [g["generation"] for g in mine]
        if generations != list(range(1, len(mine) + 1)):
            verdict.problem(
                "double_ownership", f"{task}: generations granted {generations} are not 1..n"
            )
        stored = [(a.generation, a.attempt_id, a.worker) for a in attempts]
        if stored != [(g["generation"], g["attempt"], g["worker"]) for g in mine]:
            verdict.problem(
                "disagreements", f"{task}: the store's attempts are not the grants the workers got"
            )
        for before, after in itertools.pairwise(mine):
            if after["previous"] not in (None, before["attempt"]):
                verdict.problem(
                    "double_ownership",
                    f"{task}: gen {after['generation']} ended {after['previous']}, "
                    f"not gen {before['generation']} ({before['attempt']})",
                )
            # 2. Windows as the workers saw them: no grant inside another worker's lease.
            if before["worker"] == after["worker"]:
                verdict.takeovers += 1
                continue
            end = window_end(before)
            if after["acquired_us"] < end:
                self.overlap(task, before, after, end)

        # 3. The same, from the store's attempts, and the store agrees with the workers.
        for a, b in itertools.pairwise(attempts):
            if a.worker == b.worker:
                continue
            # A released attempt's lease_until is its release, which may come after its
            # expiry: those windows are checked above, with the expiry the worker saw.
            if a.end_reason is AttemptEnd.SUPERSEDED or (
                a.end_reason is AttemptEnd.EXPIRED
                and a.lease_until is not None
                and b.claimed_at < a.lease_until
            ):
                verdict.problem(
                    "double_ownership",
                    f"{task}: store says gen {b.generation} ({b.worker}) claimed at "
                    f"{b.claimed_at} while gen {a.generation} ({a.worker}) held until "
                    f"{a.lease_until} ({a.end_reason})",
                    ("grant", task, b.generation),
                )
        by_attempt = {g["attempt"]: g for g in mine}
        for a in attempts:
            g = by_attempt.get(a.attempt_id)
            if g is None:
                continue
            end = g["released_us"] or g["expires_us"]  # what the store keeps as lease_until
            if to_us(a.claimed_at) != g["acquired_us"] or (
                a.lease_until is not None and to_us(a.lease_until) != end
            ):
                verdict.problem(
                    "disagreements",
                    f"{task}: gen {a.generation} window in the store [{a.claimed_at}, "
                    f"{a.lease_until}] != [{clock(g['acquired_us'])}, {clock(end)}]",
                )

        # 4. Every stored write carries the generation current at its timestamp.
        self.attempts = {a.generation: a for a in attempts}
        gen_of_attempt = {a.attempt_id: a.generation for a in attempts}
        for c in await self.store.checkpoints(task):
            self.store_rows["checkpoint"] += 1
            self.write(task, "checkpoint", c.generation, c.attempt_id, to_us(c.created_at))
        for e in await self.store.effects(task):
            origin = gen_of_attempt.get(e.origin_attempt_id, -1)
            self.write(task, "pending", origin, e.origin_attempt_id, to_us(e.created_at))
            self.write(task, e.state.value, e.generation, e.attempt_id, to_us(e.updated_at))
        for ev in await self.store.effect_events(task):
            self.store_rows[ev.event] += 1
            self.write(task, ev.event, ev.generation, ev.attempt_id, to_us(ev.at))
        self.refusals_logged += len(await self.store.refusals(task))

    def overlap(self, task: str, before: dict[str, Any], after: dict[str, Any], end: int) -> None:
        """A grant stamped inside another worker's window: how it happened, in real time."""
        # The claim could only be granted on a lease that had not expired at its stamp if
        # its transaction saw the release committed.  If the releasing worker had sent the
        # release before the claimant was answered, nobody acted as owner at the same
        # time: the store stamped the claim with a time taken before the release's.
        stamp_order = (
            before["release_sent_us"] is not None
            and before["release_sent_us"] < after["answered_us"]
        )
        release = (
            f"; release sent {clock(before['release_sent_us'])}, stamped "
            f"{clock(before['released_us'])}, answered {clock(before['release_answered_us'])}"
            if before["released_us"] is not None
            else ""
        )
        self.verdict.problem(
            "double_ownership",
            f"{task}: gen {after['generation']} granted to {after['worker']} stamped "
            f"{clock(after['acquired_us'])} (sent {clock(after['sent_us'])}, answered "
            f"{clock(after['answered_us'])}) while gen {before['generation']} of "
            f"{before['worker']} was live until {clock(end)} (lease expiry "
            f"{clock(before['expires_us'])}{release})",
            ("grant", task, after["generation"]),
            stamp_order=stamp_order,
        )

    def write(self, task: str, kind: str, generation: int, attempt: str, at_us: int) -> None:
        """Was ``generation`` (of ``attempt``) the task's current one at ``at_us``?

        Current from its claim to the next claim (a tie with either is allowed: one
        batch, one timestamp) and, if it was released, until the release.
        """
        self.verdict.rows_checked += 1
        if kind == "completed" and (task, generation, attempt) in self.recorded_pending:
            self.verdict.own_outcomes += 1
            return  # an attempt's own outcome: accepted after it lost the lease (allowed)
        a = self.attempts.get(generation)
        after = self.attempts.get(generation + 1)
        live_from = to_us(a.claimed_at) if a is not None else None
        live_to = to_us(after.claimed_at) if after is not None else None
        released = (
            to_us(a.ended_at)
            if a is not None and a.ended_at is not None and a.end_reason is AttemptEnd.RELEASED
            else None
        )
        if (
            a is not None
            and a.attempt_id == attempt
            and live_from is not None
            and live_from <= at_us
            and (live_to is None or at_us <= live_to)
            and (released is None or at_us <= released)
        ):
            return
        sent = self.sent_of.get((kind, task, generation, attempt, at_us))
        newer = next((g for g in self.grants[task] if g["generation"] == generation + 1), None)
        # Sent before the newer claim was answered: it may have been committed before
        # the claim and stamped after it (the same stamp order as in ``overlap``).
        stamp_order = (
            sent is not None
            and newer is not None
            and sent < newer["answered_us"]
            and live_to is not None
            and at_us > live_to
            and (released is None or at_us <= released)
        )
        self.verdict.problem(
            "stale_accepted",
            f"{task}: {kind} stamped {clock(at_us)} (sent {sent and clock(sent)}) by gen "
            f"{generation} ({attempt}); gen {generation} current from "
            f"{live_from and clock(live_from)} to {live_to and clock(live_to)}, released "
            f"{released and clock(released)}; gen {generation + 1} claim answered "
            f"{newer and clock(newer['answered_us'])}",
            (kind, task, generation, attempt, at_us),
            stamp_order=stamp_order,
        )


async def run_phase(phase: Phase) -> list[Tally]:
    """Run the phase's workers: in this process, or split over ``phase.procs`` processes."""
    return await (run_in_process(phase) if phase.procs == 1 else run_split(phase))


async def check(phase: Phase, tallies: list[Tally]) -> Verdict:
    """The checks of a phase that has run, over the store read back (read-only)."""
    reader = create_store(phase.url, read_only=True)
    await reader.open()
    try:
        return await Checker(reader, phase, tallies).run()
    finally:
        await reader.close()


if __name__ == "__main__":
    assert sys.argv[1] == "--child", sys.argv
    asyncio.run(child_main(sys.argv[2]))
