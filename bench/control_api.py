"""Benchmark: durable checkpoint writes and claims, from raw SQLite up to the HTTP API.

    ./run bench control_api [--seconds 3]

One run, one table, side by side:

* ``sqlite3 group-commit loop``: plain sqlite3 in WAL + synchronous=FULL, concurrent
  asyncio writers batched into one COMMIT - the reference the store is held to;
* ``store``: SQLiteStore.append_checkpoint, 1 and 32 concurrent callers, with
  synchronous=FULL (the default: durable against power loss) and NORMAL (durable only
  against process death) to show what the fsync costs;
* ``HTTP API``: a real ``sidecar serve`` process driven over loopback by aiohttp
  clients: POST /checkpoints and POST /claim, sequential and 32 concurrent.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from itertools import count
from pathlib import Path

import aiohttp

from sidecar.store.sqlite import SQLiteStore
from sidecar.testing.processes import Child

ROWS: list[tuple[str, str, str, float, float]] = []


def report(name: str, clients: int, latencies: list[float], seconds: float) -> None:
    ordered = sorted(latencies)
    p50 = statistics.median(ordered) * 1000
    p99 = ordered[int(len(ordered) * 0.99) - 1] * 1000 if ordered else float("nan")
    ROWS.append((name, str(clients), f"{len(ordered) / seconds:,.0f}", p50, p99))
    print(f"  {name:<44} c={clients:<3} {len(ordered) / seconds:>9,.0f}/s", file=sys.stderr)


async def drive(
    name: str, clients: int, seconds: float, op: Callable[[int], Awaitable[object]]
) -> None:
    latencies: list[float] = []
    numbers = count()
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await op(next(numbers))
            latencies.append(time.perf_counter() - started)

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    report(name, clients, latencies, time.perf_counter() - began)


def _reference_db(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, stage TEXT, outputs TEXT)")
    return db


async def sqlite_loop(path: Path, clients: int, seconds: float) -> None:
    """The reference: plain sqlite3, no domain logic, no aiosqlite.

    ``clients`` asyncio writers each submit a row and wait for it to be durable; one
    committer takes every row waiting, INSERTs them and COMMITs once in a worker thread
    (group commit).  With one client this is a transaction per row.
    """
    db = _reference_db(path)
    queue: asyncio.Queue[tuple[tuple[str, str], asyncio.Future[None]]] = asyncio.Queue()

    def commit(rows: list[tuple[str, str]]) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.executemany("INSERT INTO t (stage, outputs) VALUES (?, ?)", rows)
        db.execute("COMMIT")

    async def committer() -> None:
        while True:
            jobs = [await queue.get()]
            while not queue.empty():
                jobs.append(queue.get_nowait())
            await asyncio.to_thread(commit, [row for row, _ in jobs])
            for _, done in jobs:
                done.set_result(None)

    async def write(n: int) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.put_nowait((("S", f'{{"n": {n}}}'), done))
        await done

    task = asyncio.create_task(committer())
    await drive("sqlite3 group-commit loop (reference)", clients, seconds, write)
    task.cancel()
    db.close()


async def store_layer(path: Path, synchronous: str, clients: int, seconds: float) -> None:
    store = SQLiteStore(f"sqlite:///{path}", synchronous=synchronous)
    await store.open()
    claim = await store.claim(f"bench-{synchronous}-{clients}", "bench", 3600)

    async def write(n: int) -> object:
        return await store.append_checkpoint(
            claim.task, claim.attempt_id, claim.generation, "S", {"n": n}
        )

    await drive(f"store checkpoint, synchronous={synchronous}", clients, seconds, write)
    await store.close()


async def http_api(data_dir: Path, seconds: float) -> None:
    with Child.python(
        "sidecar",
        "serve",
        "--data-dir",
        str(data_dir),
        "--control-listen",
        "127.0.0.1:0",
        "--log-level",
        "warning",
    ) as server:
        url = server.wait_for(r"control=(\S+)").group(1)
        connector = aiohttp.TCPConnector(limit=64)
        async with aiohttp.ClientSession(url, connector=connector) as http:
            async with http.post("/v1/tasks/bench/claim", json={"worker": "b", "ttl_s": 3600}) as r:
                claim = await r.json()
            body = {"attempt_id": claim["attempt_id"], "generation": claim["generation"]}

            async def checkpoint(n: int) -> object:
                payload = body | {"stage": "S", "outputs": {"n": n}}
                async with http.post("/v1/tasks/bench/checkpoints", json=payload) as r:
                    assert r.status == 201, await r.text()
                    return None

            async def claim_new(n: int) -> object:
                task = f"claim-{re.sub('[^0-9]', '', str(time.perf_counter_ns()))}-{n}"
                async with http.post(
                    f"/v1/tasks/{task}/claim", json={"worker": "b", "ttl_s": 60}
                ) as r:
                    assert r.status == 200, await r.text()
                    return None

            for clients in (1, 32):
                await drive("HTTP API POST /checkpoints", clients, seconds, checkpoint)
            for clients in (1, 32):
                await drive("HTTP API POST /claim (new task each)", clients, seconds, claim_new)
        server.terminate()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-control-") as tmp:
        root = Path(tmp)
        for clients in (1, 32):
            await sqlite_loop(root / f"loop{clients}.db", clients, args.seconds)
        for synchronous in ("FULL", "NORMAL"):
            for clients in (1, 32):
                await store_layer(
                    root / f"store-{synchronous}.db", synchronous, clients, args.seconds
                )
        await http_api(root / "serve", args.seconds)

    print("\n| path | clients | writes/s | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    for name, clients, rate, p50, p99 in ROWS:
        print(f"| {name} | {clients} | {rate} | {p50:.2f} | {p99:.2f} |")


if __name__ == "__main__":
    asyncio.run(main())
