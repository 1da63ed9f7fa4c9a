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
import time
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


async def serve(path: Path, host: str, port: int) -> None:
    commits = GroupCommitter(open_db(path, SCHEMA))
    app = web.Application()
    app[COMMITS] = commits
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
    args = parser.parse_args()
    host, _, port = args.listen.rpartition(":")
    asyncio.run(serve(args.db, host, int(port)))


if __name__ == "__main__":
    main()
