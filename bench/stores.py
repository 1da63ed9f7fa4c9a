"""Benchmark: the store under contention - N workers racing for M tasks, SQLite vs PostgreSQL.

    ./run bench stores [--seconds 3] [--tasks 16] [--ttl 0.3] [--backend sqlite|postgresql]
                       [--mode contended|uncontended|both] [--rounds 3] [--json PATH]

Needs a PostgreSQL server that trusts user ``postgres`` (default
``postgresql://postgres@127.0.0.1:5432/test``).  The PostgreSQL store's tables go in a
scratch schema ``es_bench_<random>`` that is dropped at the end (``DROP SCHEMA ...
CASCADE``); the SQLite store is ``sqlite:///<tmpdir>/<phase>/effects.db``, a fresh file
per phase.  The default run (10 phases of 3 s) takes 35-40 s.

Each phase runs N in {1, 8, 32} workers against one backend for ``--seconds``: in ONE
process (asyncio tasks sharing one store instance), and for N = 8 and 32 also split over
TWO OS processes, each with its own store instance - two nodes sharing a store, the case
the PostgreSQL store exists for (two processes on one SQLite file work too, through WAL
and ``busy_timeout``).  The workers compete for M = 16 tasks (new task names every
phase).  M = 16 is chosen so that 8 workers are fewer than the tasks (a claim mostly finds
a free task; leases change hands by release and expiry, with some races at expiry) and 32
are twice as many (every task is wanted by two workers on average: half the workers are
always waiting, and every lease that ends is raced for).

A worker, in a loop until the phase ends:

* claims a random task with a short TTL (``--ttl``, 0.3 s).  Refused (``LeaseHeld``), it
  either sleeps until the holder's lease expires and claims the same task again (racing
  the other waiters at the moment of expiry) or backs off 5-20 ms and picks another task;
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

Measured per phase (rate = accepted operations / wall time of the phase; latency over every
call, accepted or refused): claims/s (granted claims; the latency includes the
``lease_held`` answers), checkpoint writes/s and effect records/s (one record =
``record_pending`` + ``transition_effect`` to completed, timed as a pair).

Checked after each phase, from what the workers saw and from the store:

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
This benchmark found that the stores once read it before waiting for the lock: a claim
formed before the previous holder's release but committed after it was decided right, yet
stamped earlier than that release, so the recorded windows overlapped.  Such a finding is
still told apart, marked "stamp order" (the workers' own clocks show the release had been
sent before the claimant was answered); a finding without that mark is a real double
grant or stale write.

Uncontended (``--mode uncontended``, also part of the default ``both``): 32 workers over
32 tasks, one task each, in one process sharing one store - the throughput of the shared
store when nobody waits for anybody.  A worker claims its task (TTL 30 s), writes 9
checkpoints, releases, and again.  After a 1 s warm-up, ``--rounds`` rounds of
``--seconds`` each (fresh tasks every round), interleaving the backends, each checked
as above (double ownership, stale writes); the table shows the median and spread
(min-max) of claims+checkpoints per second.  On PostgreSQL it also counts the round
trips the driver makes (each ``execute``/``executemany`` - one pipeline - and each
``BEGIN``/``COMMIT`` of a transaction block, counted in this process) per store command
(claims + checkpoints + releases).  ``--json PATH`` writes the checks against the targets
for ``./run bench all``.

The run exits 1 when any check fails, and says which write or grant broke it.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from _common import Output
from psycopg import sql

from sidecar.domain.model import Attempt, AttemptEnd, EffectState, RecordedResponse
from sidecar.errors import LeaseHeld, SidecarError, StaleGeneration
from sidecar.store import Store, create_store
from sidecar.store.rows import to_us

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
WORKERS = (1, 8, 32)
SPLIT = (8, 32)  # worker counts also run as two processes
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
            effect = await self.store.transition_effect(
                hold.task,
                key,
                hold.attempt,
                hold.generation,
                EffectState.COMPLETED,
                response=RESPONSE,
            )
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
            effect = await self.store.transition_effect(
                hold.task,
                key,
                hold.attempt,
                hold.generation,
                EffectState.COMPLETED,
                response=RESPONSE,
            )
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
    """``phase.procs`` child processes (this file with --child), started together."""
    config = asdict(phase)
    children = []
    for proc in range(phase.procs):
        config["names"] = worker_names(phase, proc)
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--child",
            json.dumps(config),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        children.append(child)
        # One after another: two processes opening one new SQLite file at the same moment
        # can fail with "database is locked" (see docs/benchmarks.md).
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        if line != b"ready\n":
            raise RuntimeError(f"bench child {child.pid} did not start: {line!r}")
    for child in children:
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        await child.stdin.drain()
    outputs = await asyncio.gather(*(child.communicate() for child in children))
    for child in children:
        if child.returncode != 0:
            raise RuntimeError(f"bench child {child.pid} exited {child.returncode}")
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


# ---- the report --------------------------------------------------------------------

ROWS: list[list[str]] = []
DETAILS: list[list[str]] = []
STEADY_ROWS: list[list[str]] = []


def finding(verdict: Verdict, kind: str) -> str:
    found: int = getattr(verdict, kind)
    stamp = verdict.stamp_order[kind]
    return f"{found} ({stamp} stamp order)" if stamp else str(found)


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f}"


def p50_p99(latencies: list[float]) -> str:
    if not latencies:
        return "-"
    ordered = sorted(latencies)
    p50 = statistics.median(ordered) * 1000
    p99 = ordered[max(0, math.ceil(len(ordered) * 0.99) - 1)] * 1000
    return f"{p50:.1f} / {p99:.1f}"


def report(phase: Phase, tallies: list[Tally], verdict: Verdict) -> None:
    seconds = (max(t.ended_us for t in tallies) - min(t.began_us for t in tallies)) / 1e6
    counts: Counter[str] = Counter()
    latencies: dict[str, list[float]] = {op: [] for op in OPS}
    for tally in tallies:
        counts.update(tally.counts)
        for op in OPS:
            latencies[op].extend(tally.latencies[op])
    errors = sum(n for name, n in counts.items() if name.startswith("error"))
    ROWS.append(
        [
            phase.backend,
            str(phase.workers),
            str(phase.procs),
            rate(counts["claims"], seconds),
            p50_p99(latencies["claim"]),
            rate(counts["checkpoints"], seconds),
            p50_p99(latencies["checkpoint"]),
            rate(counts["effects"], seconds),
            p50_p99(latencies["effect"]),
            finding(verdict, "double_ownership"),
            finding(verdict, "stale_accepted"),
        ]
    )
    DETAILS.append(
        [
            phase.backend,
            str(phase.workers),
            str(phase.procs),
            f"{counts['claims']} / {counts['lease_held']}",
            f"{counts['released']} / {counts['walked_away']} / {counts['zombies']}",
            str(verdict.takeovers),
            str(counts["lost_unplanned"]),
            str(counts["late_accepted"]),
            f"{counts['zombies_fenced']}: {counts['stale_refused']} / {counts['stale_attempts']}"
            f" (+{counts['own_outcomes']})",
            str(counts["refused"]),
            f"{verdict.rows_checked:,}",
            str(verdict.disagreements),
            str(errors),
        ]
    )
    print(
        f"  {phase.name:<22} {seconds:4.1f}s  claims {counts['claims']:>5}  "
        f"checkpoints {counts['checkpoints']:>6}  effects {counts['effects']:>6}  "
        f"double {verdict.double_ownership}  stale accepted {verdict.stale_accepted}  "
        f"disagree {verdict.disagreements}  errors {errors}",
        file=sys.stderr,
    )
    for tally in tallies:
        for line in tally.errors:
            print(f"    error: {line}", file=sys.stderr)
    for line in verdict.problems:
        print(f"    {line}", file=sys.stderr)


def table(header: list[str], rows: list[list[str]], right_from: int) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" if i < right_from else "---:" for i in range(len(header))) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


# ---- uncontended: 32 workers over 32 tasks ---------------------------------------------

STEADY_WORKERS = 32
HOLD_CHECKPOINTS = 9
STEADY_TTL = 30.0


class Steady(Worker):
    """Uncontended: its own task; claim, ``HOLD_CHECKPOINTS`` checkpoints, release, again."""

    own = ""

    async def run(self) -> None:
        while self.left() > 0:
            hold = await self.claim(self.own)
            if not isinstance(hold, Hold):
                await asyncio.sleep(0.001)
                continue
            for _ in range(HOLD_CHECKPOINTS):
                if not await self.checkpoint(hold):
                    break
            if not (hold.fenced or hold.broken):
                await self.release(hold)


class RoundTrips:
    """Counts the PostgreSQL driver's round trips made in this process while installed:
    each cursor ``execute`` and ``executemany`` (psycopg pipelines the latter), and the
    ``BEGIN`` and ``COMMIT`` of each transaction block."""

    def __init__(self) -> None:
        self.n = 0

    def install(self) -> None:
        counter = self
        cursor, transaction = psycopg.AsyncCursor, psycopg.AsyncTransaction
        execute, many = cursor.execute, cursor.executemany
        enter, leave = transaction.__aenter__, transaction.__aexit__

        async def counted_execute(self: Any, *args: Any, **kwargs: Any) -> Any:
            counter.n += 1
            return await execute(self, *args, **kwargs)

        async def counted_many(self: Any, *args: Any, **kwargs: Any) -> Any:
            counter.n += 1
            return await many(self, *args, **kwargs)

        async def counted_enter(self: Any) -> Any:
            counter.n += 1  # BEGIN (or SAVEPOINT)
            return await enter(self)

        async def counted_leave(self: Any, *exc: Any) -> Any:
            counter.n += 1  # COMMIT / ROLLBACK (or RELEASE)
            return await leave(self, *exc)

        cursor.execute = counted_execute  # type: ignore[method-assign]
        cursor.executemany = counted_many  # type: ignore[method-assign]
        transaction.__aenter__ = counted_enter  # type: ignore[method-assign]
        transaction.__aexit__ = counted_leave  # type: ignore[method-assign]


ROUND_TRIPS = RoundTrips()


@dataclass
class SteadyResult:
    rates: list[float] = field(default_factory=list)  # claims + checkpoints per second
    claims: list[float] = field(default_factory=list)
    checkpoints: list[float] = field(default_factory=list)
    latencies: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPS})
    round_trips: int = 0
    commands: int = 0
    double_ownership: int = 0
    stale_accepted: int = 0
    disagreements: int = 0


async def steady_round(store: Store, backend: str, url: str, tag: str, seconds: float) -> tuple[
    Tally, Verdict, int
]:  # fmt: skip
    phase = Phase(
        backend=backend,
        url=url,
        workers=STEADY_WORKERS,
        procs=1,
        tasks=[f"{tag}-t{i:02d}" for i in range(STEADY_WORKERS)],
        ttl=STEADY_TTL,
        seconds=seconds,
        seed=0,
    )
    tally = Tally()
    deadline = time.perf_counter() + seconds
    workers = []
    for i, task in enumerate(phase.tasks):
        worker = Steady(store, f"w{i:02d}", phase, deadline, tally)
        worker.own = task
        workers.append(worker)
    trips = ROUND_TRIPS.n
    tally.began_us = wall_us()
    await asyncio.gather(*(w.run() for w in workers))
    tally.ended_us = wall_us()
    trips = ROUND_TRIPS.n - trips
    reader = create_store(url, read_only=True)
    await reader.open()
    try:
        verdict = await Checker(reader, phase, [tally]).run()
    finally:
        await reader.close()
    for line in verdict.problems:
        print(f"    {line}", file=sys.stderr)
    return tally, verdict, trips


async def run_steady(backends: list[str], urls: dict[str, str], args: argparse.Namespace) -> dict[
    str, SteadyResult
]:  # fmt: skip
    """Warm-up, then ``args.rounds`` rounds interleaving the backends (reversed every other)."""
    ROUND_TRIPS.install()
    stores: dict[str, Store] = {}
    results = {backend: SteadyResult() for backend in backends}
    try:
        for backend in backends:
            stores[backend] = create_store(urls[backend])
            await stores[backend].open()
            await steady_round(stores[backend], backend, urls[backend], f"{backend[:2]}-warm", 1.0)
        for round_ in range(args.rounds):
            for backend in backends if round_ % 2 == 0 else backends[::-1]:
                tag = f"{backend[:2]}-r{round_}"
                tally, verdict, trips = await steady_round(
                    stores[backend], backend, urls[backend], tag, args.seconds
                )
                seconds = (tally.ended_us - tally.began_us) / 1e6
                c = tally.counts
                r = results[backend]
                r.rates.append((c["claims"] + c["checkpoints"]) / seconds)
                r.claims.append(c["claims"] / seconds)
                r.checkpoints.append(c["checkpoints"] / seconds)
                for op in OPS:
                    r.latencies[op].extend(tally.latencies[op])
                r.round_trips += trips
                r.commands += c["claims"] + c["lease_held"] + c["checkpoints"] + c["released"]
                r.double_ownership += verdict.double_ownership
                r.stale_accepted += verdict.stale_accepted
                r.disagreements += verdict.disagreements
                print(
                    f"  uncontended {backend:<10} round {round_ + 1}  "
                    f"{r.rates[-1]:>7,.0f} claims+checkpoints/s  double "
                    f"{verdict.double_ownership}  stale accepted {verdict.stale_accepted}",
                    file=sys.stderr,
                )
    finally:
        for store in stores.values():
            await store.close()
    for backend, r in results.items():
        trips = f"{r.round_trips / r.commands:.2f}" if backend == "postgresql" else "-"
        STEADY_ROWS.append(
            [
                backend,
                f"{statistics.median(r.rates):,.0f}",
                f"{min(r.rates):,.0f}-{max(r.rates):,.0f}",
                f"{statistics.median(r.claims):,.0f}",
                p50_p99(r.latencies["claim"]),
                f"{statistics.median(r.checkpoints):,.0f}",
                p50_p99(r.latencies["checkpoint"]),
                trips,
                str(r.double_ownership),
                str(r.stale_accepted),
            ]
        )
    return results


# ---- main --------------------------------------------------------------------------


async def run_phase(phase: Phase) -> Verdict:
    tallies = await (run_in_process(phase) if phase.procs == 1 else run_split(phase))
    reader = create_store(phase.url, read_only=True)
    await reader.open()
    try:
        verdict = await Checker(reader, phase, tallies).run()
    finally:
        await reader.close()
    report(phase, tallies, verdict)
    return verdict


def drop_schema(base_url: str, schema: str) -> None:
    with psycopg.connect(base_url, autocommit=True, connect_timeout=5) as db:
        db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each phase")
    parser.add_argument("--tasks", type=int, default=16, help="M, the tasks competed for")
    parser.add_argument("--ttl", type=float, default=0.3, help="lease TTL of every claim (s)")
    parser.add_argument("--seed", type=int, default=312)
    parser.add_argument("--pg-url", default=PG_URL, help="PostgreSQL server (no ?schema=)")
    parser.add_argument(
        "--backend",
        action="append",
        choices=["sqlite", "postgresql"],
        help="run only this backend (repeatable; default both)",
    )
    parser.add_argument(
        "--mode",
        choices=["contended", "uncontended", "both"],
        default="both",
        help="the contended phases, the uncontended 32-over-32 rounds, or both (default)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="uncontended rounds (median)")
    parser.add_argument("--json", help="write the figures and checks here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        await child_main(args.child)
        return 0

    began = time.perf_counter()
    schema = f"es_bench_{secrets.token_hex(4)}"
    backends = args.backend or ["sqlite", "postgresql"]
    shapes = [(n, 1) for n in WORKERS] + [(n, 2) for n in SPLIT]
    failed = False
    steady: dict[str, SteadyResult] = {}
    with tempfile.TemporaryDirectory(prefix="bench-stores-") as tmp:
        try:
            if args.mode != "contended":
                (Path(tmp) / "steady").mkdir()
                urls = {
                    "sqlite": f"sqlite:///{tmp}/steady/effects.db",
                    "postgresql": f"{args.pg_url}?schema={schema}",
                }
                steady = await run_steady(backends, urls, args)
                failed |= any(
                    r.double_ownership or r.stale_accepted or r.disagreements
                    for r in steady.values()
                )
            for backend in backends if args.mode != "uncontended" else []:
                for number, (workers, procs) in enumerate(shapes):
                    tag = f"{backend[:2]}{number}"
                    if backend == "sqlite":
                        (Path(tmp) / tag).mkdir()
                        url = f"sqlite:///{tmp}/{tag}/effects.db"
                    else:
                        url = f"{args.pg_url}?schema={schema}"
                    phase = Phase(
                        backend=backend,
                        url=url,
                        workers=workers,
                        procs=procs,
                        tasks=[f"{tag}-t{i:02d}" for i in range(args.tasks)],
                        ttl=args.ttl,
                        seconds=args.seconds,
                        seed=args.seed,
                    )
                    verdict = await run_phase(phase)
                    failed |= bool(
                        verdict.double_ownership or verdict.stale_accepted or verdict.disagreements
                    )
        finally:
            if "postgresql" in backends:
                drop_schema(args.pg_url, schema)

    if steady:
        print(
            f"\nUncontended: {STEADY_WORKERS} workers over {STEADY_WORKERS} tasks, one process, "
            f"claim + {HOLD_CHECKPOINTS} checkpoints + release per hold; median of "
            f"{args.rounds} rounds of {args.seconds} s (after a 1 s warm-up); "
            "round trips per store command counted at the driver"
        )
        table(
            [
                "backend",
                "claims+checkpoints/s",
                "spread",
                "claims/s",
                "claim ms",
                "checkpoints/s",
                "checkpoint ms",
                "round trips / command",
                "double ownership",
                "stale writes accepted",
            ],
            STEADY_ROWS,
            right_from=1,
        )
    if ROWS:
        contended_tables(args)
    out = Output("stores")
    if pg := steady.get("postgresql"):
        rate = statistics.median(pg.rates)
        out.check(
            "shared PostgreSQL store: claims+checkpoints/s, 32 workers over 32 tasks",
            f"{rate:,.0f}/s ({min(pg.rates):,.0f}-{max(pg.rates):,.0f})",
            "≥ 3,000/s",
            rate >= 3000,
        )
        out.check(
            "shared PostgreSQL store: double owners / stale writes accepted",
            f"{pg.double_ownership} / {pg.stale_accepted}",
            "0",
            pg.double_ownership == 0 and pg.stale_accepted == 0,
        )
        out.check(
            "shared PostgreSQL store: round trips per command",
            f"{pg.round_trips / pg.commands:.2f} ({pg.round_trips:,} for {pg.commands:,})",
            "report the figure",
            None,
        )
        out.figures["postgresql_uncontended"] = asdict(pg) | {"latencies": None}
    if steady:
        out.print_checks()
    out.write(args.json)
    elapsed = time.perf_counter() - began
    verdict_line = "FAILED: see the problems above" if failed else "OK"
    print(f"\n{verdict_line} (whole run {elapsed:.0f} s)")
    return 1 if failed else 0


def contended_tables(args: argparse.Namespace) -> None:
    print(
        f"\nM = {args.tasks} tasks, ttl {args.ttl} s, {args.seconds} s per phase; "
        "rates are accepted operations per second, latencies p50 / p99 in ms over every call"
    )
    table(
        [
            "backend",
            "workers",
            "procs",
            "claims/s",
            "claim ms",
            "checkpoints/s",
            "checkpoint ms",
            "effect records/s",
            "effect ms",
            "double ownership",
            "stale writes accepted",
        ],
        ROWS,
        right_from=1,
    )
    print(
        "\nclaims: granted / lease_held; holds ended: released / walked away / zombie; "
        "takeovers: a worker over its own lease; lost: taken over while heartbeating; "
        "late: writes accepted past expiry with no newer claim (allowed); "
        "fenced zombies: deliberate stale attempts refused / made (+ own outcomes accepted); "
        "refusals: StaleGeneration answers (= the store's fence log)"
    )
    table(
        [
            "backend",
            "workers",
            "procs",
            "claims",
            "holds ended",
            "takeovers",
            "lost",
            "late",
            "fenced zombies",
            "refusals",
            "rows checked",
            "disagreements",
            "errors",
        ],
        DETAILS,
        right_from=1,
    )


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
