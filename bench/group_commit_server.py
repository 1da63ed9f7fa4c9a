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

With ``--fenced`` it is the control API's *floor* instead: the least SPEC §3 asks of a
checkpoint write, in the same plain code.  ``POST /v1/tasks/{task}/claim`` makes a new
attempt (a new id, the generation one up) and answers ``{attempt_id, generation}``; a
checkpoint's body is checked (its four fields and their types: 422 otherwise), and in
the batch's transaction the task's row is fenced and its sequence moved on (``UPDATE
... WHERE attempt_id = ? AND generation = ? RETURNING seq``: no row, 409) and the
checkpoint inserted under that sequence number; the answer carries ``seq``,
``generation`` and ``created_at``.  No leases' expiry, audit rows or metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from _group_commit import GroupCommitter, open_db
from aiohttp import web

COMMITS = web.AppKey("commits", GroupCommitter)
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS checkpoints (id INTEGER PRIMARY KEY, task TEXT, "
    "stage TEXT, outputs TEXT, created_us INTEGER)"
)
INSERT = "INSERT INTO checkpoints (task, stage, outputs, created_us) VALUES (?, ?, ?, ?)"


async def checkpoint(request: web.Request) -> web.Response:
    body = await request.json()
    task, stage = request.match_info["task"], str(body["stage"])
    created = time.time_ns() // 1000
    await request.app[COMMITS].write(INSERT, (task, stage, json.dumps(body["outputs"]), created))
    return web.json_response({"task": task, "stage": stage, "created_us": created}, status=201)


FENCED_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS tasks (task TEXT PRIMARY KEY, attempt_id TEXT, "
    "generation INTEGER, seq INTEGER)",
    "CREATE TABLE IF NOT EXISTS fenced_checkpoints (task TEXT, seq INTEGER, stage TEXT, "
    "outputs TEXT, generation INTEGER, created_us INTEGER, PRIMARY KEY (task, seq))",
)
CLAIM = (
    "INSERT INTO tasks (task, attempt_id, generation, seq) VALUES (?, ?, 1, 0) "
    "ON CONFLICT (task) DO UPDATE SET attempt_id = excluded.attempt_id, "
    "generation = generation + 1 RETURNING generation"
)
FENCE = (
    "UPDATE tasks SET seq = seq + 1 WHERE task = ? AND attempt_id = ? AND generation = ? "
    "RETURNING seq"
)
APPEND = (
    "INSERT INTO fenced_checkpoints (task, seq, stage, outputs, generation, created_us) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
FIELDS = {"attempt_id": str, "generation": int, "stage": str, "outputs": dict}


def problem(status: int, code: str, detail: str) -> web.Response:
    body = {"type": code, "title": code, "status": status, "detail": detail}
    return web.json_response(body, status=status, content_type="application/problem+json")


async def claim(request: web.Request) -> web.Response:
    task, attempt = request.match_info["task"], uuid.uuid4().hex

    def step(db: sqlite3.Connection) -> int:
        return int(db.execute(CLAIM, (task, attempt)).fetchone()[0])

    generation = await request.app[COMMITS].apply(step)
    return web.json_response({"attempt_id": attempt, "generation": generation})


async def fenced_checkpoint(request: web.Request) -> web.Response:
    try:
        body = await request.json()
    except ValueError:
        return problem(400, "invalid_request", "the body is not JSON")
    if not isinstance(body, dict) or any(
        type(body.get(name)) is not kind for name, kind in FIELDS.items()
    ):
        return problem(422, "invalid_request", "attempt_id, generation, stage, outputs")
    task, created = request.match_info["task"], time.time_ns() // 1000
    attempt, generation, stage = body["attempt_id"], body["generation"], body["stage"]
    outputs = json.dumps(body["outputs"])

    def step(db: sqlite3.Connection) -> int | None:
        fenced = db.execute(FENCE, (task, attempt, generation)).fetchone()
        if fenced is None:
            return None
        db.execute(APPEND, (task, fenced[0], stage, outputs, generation, created))
        return int(fenced[0])

    seq = await request.app[COMMITS].apply(step)
    if seq is None:
        return problem(409, "stale_generation", f"attempt {attempt} does not hold {task}")
    at = datetime.fromtimestamp(created / 1e6, UTC).isoformat()
    answer = {"task": task, "seq": seq, "stage": stage, "generation": generation}
    return web.json_response(answer | {"created_at": at}, status=201)


async def serve(path: Path, host: str, port: int, fenced: bool) -> None:
    commits = GroupCommitter(open_db(path, *FENCED_SCHEMA) if fenced else open_db(path, SCHEMA))
    app = web.Application()
    app[COMMITS] = commits
    if fenced:
        app.router.add_post("/v1/tasks/{task}/claim", claim)
        app.router.add_post("/v1/tasks/{task}/checkpoints", fenced_checkpoint)
    else:
        app.router.add_post("/v1/tasks/{task}/checkpoints", checkpoint)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    commits.start()
    assert site._server is not None
    bound = site._server.sockets[0].getsockname()  # type: ignore[attr-defined]
    print(f"reference ready http://{bound[0]}:{bound[1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        commits.stop()
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("db", type=Path)
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0 picks one)")
    parser.add_argument("--fenced", action="store_true", help="the floor: claims, fenced writes")
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    asyncio.run(serve(args.db, host, int(port), args.fenced))


if __name__ == "__main__":
    main()
