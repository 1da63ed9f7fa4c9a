"""Benchmark: the store under contention - N workers racing for M tasks, SQLite vs PostgreSQL.

    ./run bench stores [--seconds 3] [--tasks 16] [--ttl 0.3] [--backend sqlite|postgresql]
                       [--mode contended|uncontended|both] [--rounds 3] [--json PATH]

Needs a PostgreSQL server that trusts user ``postgres`` (default
``postgresql://postgres@127.0.0.1:5432/test``).  The PostgreSQL store's tables go in a
scratch schema ``es_bench_<random>`` that is dropped at the end (``DROP SCHEMA ...
CASCADE``); the SQLite store is ``sqlite:///<tmpdir>/<phase>/effects.db``, a fresh file
per phase.  The default run (10 phases of 3 s) takes 35-40 s.

Contended (``--mode contended``): each phase runs N in {1, 8, 32} workers against one
backend for ``--seconds``: in ONE process (asyncio tasks sharing one store instance), and
for N = 8 and 32 also split over TWO OS processes, each with its own store instance - two
nodes sharing a store, the case the PostgreSQL store exists for (two processes on one
SQLite file work too, through WAL and ``busy_timeout``).  The workers compete for M = 16
tasks (new task names every phase).  M = 16 is chosen so that 8 workers are fewer than
the tasks (a claim mostly finds a free task; leases change hands by release and expiry,
with some races at expiry) and 32 are twice as many (every task is wanted by two workers
on average: half the workers are always waiting, and every lease that ends is raced for).
What a worker does (claims with a short ``--ttl``, checkpoints, effect records,
heartbeats; holds released early or late, walked away from, or kept by zombies writing
with a stale token) is ``tests/support/store_race.py``'s, as are the checks of each phase
(no double ownership, no stale write accepted, the store's rows and fence log = what the
workers saw): the bench reports their verdict beside its figures, and
tests/integration/store/test_store_under_load.py is where they are asserted.

Measured per phase (rate = accepted operations / wall time of the phase; latency over every
call, accepted or refused): claims/s (granted claims; the latency includes the
``lease_held`` answers), checkpoint writes/s and effect records/s (one record =
``record_pending`` + ``transition_effect`` to completed, timed as a pair).

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
import math
import secrets
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from _common import Output, parser
from psycopg import sql

from sidecar.store import Store, create_store
from tests.support.store_race import (
    OPS,
    Hold,
    Phase,
    Tally,
    Verdict,
    Worker,
    check,
    run_phase,
    wall_us,
)

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
WORKERS = (1, 8, 32)
SPLIT = (8, 32)  # worker counts also run as two processes


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
    verdict = await check(phase, [tally])
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


async def contended_phase(phase: Phase) -> Verdict:
    tallies = await run_phase(phase)
    verdict = await check(phase, tallies)
    report(phase, tallies, verdict)
    return verdict


def drop_schema(base_url: str, schema: str) -> None:
    with psycopg.connect(base_url, autocommit=True, connect_timeout=5) as db:
        db.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def main() -> int:
    options = parser(
        __doc__,
        seconds=3.0,
        seconds_help="length of each phase",
        rounds_help="uncontended rounds (median)",
    )
    options.add_argument("--tasks", type=int, default=16, help="M, the tasks competed for")
    options.add_argument("--ttl", type=float, default=0.3, help="lease TTL of every claim (s)")
    options.add_argument("--seed", type=int, default=312)
    options.add_argument("--pg-url", default=PG_URL, help="PostgreSQL server (no ?schema=)")
    options.add_argument(
        "--backend",
        action="append",
        choices=["sqlite", "postgresql"],
        help="run only this backend (repeatable; default both)",
    )
    options.add_argument(
        "--mode",
        choices=["contended", "uncontended", "both"],
        default="both",
        help="the contended phases, the uncontended 32-over-32 rounds, or both (default)",
    )
    args = options.parse_args()

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
                    verdict = await contended_phase(phase)
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
