"""The reference for the control API's checkpoint writes: plain aiohttp + sqlite3.

    .venv/bin/python bench/group_commit_server.py DB_PATH [--listen 127.0.0.1:0]

A real HTTP server with the control API's route shape, ``POST
/v1/tasks/{task}/checkpoints`` with a JSON body ``{attempt_id, generation, stage,
outputs}``, answering ``201`` with a small JSON body once the row is durable: sqlite3 in
WAL with ``synchronous=FULL``, every request's row queued and one committer taking every
row waiting, INSERTing them and COMMITting once in a worker thread (group commit).  No
leases, no fencing, no audit: what any durable write over HTTP costs in Python, so the
control API (``bench/control_api.py``) is compared like for like.  Prints ``reference
ready http://HOST:PORT`` once listening; runs until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import time
from pathlib import Path

from aiohttp import web

Job = tuple[tuple[str, str, str, int], asyncio.Future[None]]
QUEUE = web.AppKey("queue", asyncio.Queue)


def open_db(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute(
        "CREATE TABLE IF NOT EXISTS checkpoints (id INTEGER PRIMARY KEY, task TEXT, "
        "stage TEXT, outputs TEXT, created_us INTEGER)"
    )
    return db


async def committer(db: sqlite3.Connection, queue: asyncio.Queue[Job]) -> None:
    def commit(rows: list[tuple[str, str, str, int]]) -> None:
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            "INSERT INTO checkpoints (task, stage, outputs, created_us) VALUES (?, ?, ?, ?)", rows
        )
        db.execute("COMMIT")

    while True:
        jobs = [await queue.get()]
        while not queue.empty():
            jobs.append(queue.get_nowait())
        await asyncio.to_thread(commit, [row for row, _ in jobs])
        for _, done in jobs:
            done.set_result(None)


async def checkpoint(request: web.Request) -> web.Response:
    body = await request.json()
    task, stage = request.match_info["task"], str(body["stage"])
    created = time.time_ns() // 1000
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    request.app[QUEUE].put_nowait(((task, stage, json.dumps(body["outputs"]), created), done))
    await done
    return web.json_response({"task": task, "stage": stage, "created_us": created}, status=201)


async def serve(path: Path, host: str, port: int) -> None:
    db = open_db(path)
    app = web.Application()
    queue: asyncio.Queue[Job] = asyncio.Queue()
    app[QUEUE] = queue
    app.router.add_post("/v1/tasks/{task}/checkpoints", checkpoint)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    worker = asyncio.create_task(committer(db, queue))
    assert site._server is not None
    bound = site._server.sockets[0].getsockname()  # type: ignore[attr-defined]
    print(f"reference ready http://{bound[0]}:{bound[1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        worker.cancel()
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("db", type=Path)
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0 picks one)")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    asyncio.run(serve(args.db, host, int(port)))


if __name__ == "__main__":
    main()
