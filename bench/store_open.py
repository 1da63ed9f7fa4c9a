"""Benchmark: opening a large SQLite store, from a cold page cache and from a warm one.

    ./run bench store_open [--rounds 3] [--effects 20000] [--tasks 20]

A sidecar checks its store before it answers anything (``PRAGMA quick_check``: a store
damaged on disk is refused at start, SPEC §7). quick_check reads every page in b-tree
order; in a file grown by many tasks' effects over time that order is all over the
disk. The benchmark fills a store through the store's own API (``--tasks`` tasks, their
effects recorded and completed 64 at a time, each with a 1.5 KiB request summary and a
6 KiB answer, as a GitHub pull request's), then per round, side by side:

* quick_check alone, on a plain connection - what the store ran before;
* the store's start check (``sqlite_writer.check_integrity``): the file read front to
  back, then quick_check over the page cache on a connection that maps the file;
* ``sidecar serve`` on that data dir, from its start to ``/readyz`` 200 (imports,
  store, rules, CA, listeners), and on an empty data dir for comparison;

each with the page cache dropped first (cold: a node's first start, a sidecar moved to
another node; needs root to write /proc/sys/vm/drop_caches, otherwise only the warm rows
run) and without (warm: a sidecar restarted where it ran). Seconds, median of
``--rounds`` rounds (min-max); the order of the rows is reversed every other round.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import aiohttp
from proxy import sidecar_ready

from sidecar.domain.model import EffectState, RecordedResponse
from sidecar.store import create_store
from sidecar.store.sqlite_writer import check_integrity
from sidecar.testing.processes import Child

DROP_CACHES = Path("/proc/sys/vm/drop_caches")


async def fill(db: Path, tasks: int, effects: int) -> None:
    """``effects`` recorded and completed effects over ``tasks`` tasks, 64 in flight."""
    async with create_store(f"sqlite:///{db}") as store:

        async def one(task: str, attempt: str, generation: int, i: int) -> None:
            key = f"POST api.github.com/repos/acme/app/pulls #{i}"
            await store.record_pending(
                task, key, attempt, generation, kind="http", rule="github.pulls.create",
                fingerprint=os.urandom(32).hex(), idempotency_key=f"{attempt}:{i}",
                request={"method": "POST", "body_excerpt": os.urandom(768).hex()},
            )  # fmt: skip
            body = b'{"number": %d, "body": "%s"}' % (i, os.urandom(3072).hex().encode())
            answer = RecordedResponse(201, (("content-type", "application/json"),), body)
            await store.transition_effect(
                task, key, attempt, generation, EffectState.COMPLETED, response=answer
            )

        for t in range(tasks):
            claim = await store.claim(f"task-{t}", "bench", 3600)
            held = (claim.task, claim.attempt_id, claim.generation)
            share = range(t * effects // tasks, (t + 1) * effects // tasks)
            for start in range(share.start, share.stop, 64):
                batch = range(start, min(start + 64, share.stop))
                await asyncio.gather(*(one(*held, i) for i in batch))


def quick_check_alone(db: Path) -> None:
    with closing(sqlite3.connect(db)) as conn:
        assert [r[0] for r in conn.execute("PRAGMA quick_check(5)")] == ["ok"]


def serve_to_ready(data_dir: Path, log: Path) -> None:
    async def start() -> None:
        side = Child.python(
            "sidecar", "serve", "--data-dir", str(data_dir),
            "--control-listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0",
            "--log-level", "warning", stderr_path=log,
        )  # fmt: skip
        with side:
            async with aiohttp.ClientSession() as http:
                await sidecar_ready(side, http)

    asyncio.run(start())


def drop_page_cache() -> None:
    os.sync()
    DROP_CACHES.write_text("3\n")


def main() -> None:
    options = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    options.add_argument("--rounds", type=int, default=3)
    options.add_argument("--effects", type=int, default=20_000)
    options.add_argument("--tasks", type=int, default=20)
    args = options.parse_args()
    cold_too = os.access(DROP_CACHES, os.W_OK)
    with tempfile.TemporaryDirectory(prefix="bench-store_open-") as tmp:
        root = Path(tmp)
        full, empty = root / "full", root / "empty"
        full.mkdir()
        began = time.monotonic()
        asyncio.run(fill(full / "effects.db", args.tasks, args.effects))
        # Folded into the file, as a store a sidecar stopped with is.
        with closing(sqlite3.connect(full / "effects.db")) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = (full / "effects.db").stat().st_size / 2**20
        print(
            f"store: {args.effects:,} effects over {args.tasks} tasks, {size:,.0f} MiB, "
            f"filled in {time.monotonic() - began:.0f} s"
        )
        serve_to_ready(empty, root / "empty.log")  # the empty data dir gets its store and CA
        rows: dict[str, Callable[[], None]] = {
            "quick_check alone (before)": lambda: quick_check_alone(full / "effects.db"),
            "read through, then quick_check mapped (now)": lambda: check_integrity(
                full / "effects.db"
            ),
            "sidecar serve to /readyz, this store": lambda: serve_to_ready(full, root / "s.log"),
            "sidecar serve to /readyz, empty data dir": lambda: serve_to_ready(
                empty, root / "e.log"
            ),
        }
        caches = ["cold", "warm"] if cold_too else ["warm"]
        took: dict[tuple[str, str], list[float]] = {(r, c): [] for r in rows for c in caches}
        for round_ in range(args.rounds):
            order = list(rows) if round_ % 2 == 0 else list(rows)[::-1]
            for name in order:
                for cache in caches:
                    if cache == "cold":
                        drop_page_cache()
                    start = time.perf_counter()
                    rows[name]()
                    took[name, cache].append(time.perf_counter() - start)
    if not cold_too:
        print(f"(not root: {DROP_CACHES} cannot be written, so the cold rows do not run)")
    print(f"\nseconds, median of {args.rounds} rounds (min-max)\n")
    print("| row | " + " | ".join(caches) + " |")
    print("|---|" + "---:|" * len(caches))
    for name in rows:
        cells = [took[name, c] for c in caches]
        shown = [f"{statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f})" for t in cells]
        print(f"| {name} | " + " | ".join(shown) + " |")


if __name__ == "__main__":
    main()
