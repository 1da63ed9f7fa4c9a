"""The floor for a Python relay: a bare asyncio byte relay that parses nothing.

    .venv/bin/python bench/bare_relay.py --listen 127.0.0.1:0 --upstream 127.0.0.1:5432
                                         [--durable DB_PATH]

Each accepted connection is connected to the upstream and carried by two copy loops
(64 KiB reads, write, drain) until either side closes.  No protocol is understood, so
whatever a relay that does parse messages (the sidecar's PostgreSQL relay) costs on top
of this is the price of its parsing and bookkeeping.  Prints ``bare relay ready
HOST:PORT`` on stdout once listening; runs until killed.  Used by bench/pg.py.

With ``--durable`` it is the floor of a *recorded* statement instead: what SPEC §3 asks
of every design, and nothing else.  A client's chunk that starts a simple query (type
``Q``) is forwarded only once a pending row for it is durable, and the first chunk of the
server's answer to it is passed back only once a row with it is durable: sqlite3 in WAL
with ``synchronous=FULL``, group-committed across connections (``_group_commit.py``,
the proxy's floor's code).  The record in the server's own transaction is the client's
part: bench/pg.py sends ``BEGIN \\; record \\; statement \\; COMMIT`` as one query, the
least number of round trips a record in the agent's transaction can take.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from _group_commit import GroupCommitter, open_db

READ_SIZE = 1 << 16
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS statements (id INTEGER PRIMARY KEY, query BLOB, "
    "answer BLOB, started_us INTEGER, answered_us INTEGER)"
)
PENDING = "INSERT INTO statements (id, query, started_us) VALUES (?, ?, ?)"
ANSWERED = "UPDATE statements SET answer = ?, answered_us = ? WHERE id = ?"


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


#: What a copy loop awaits before it passes a chunk on (the floor's durable write).
type Hold = Callable[[bytes], Awaitable[None]]


async def copy(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hold: Hold | None = None
) -> None:
    try:
        while data := await reader.read(READ_SIZE):
            if hold is not None:
                await hold(data)
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class Recorded:
    """One connection's holds: a query's pending row, then its answer's, made durable."""

    ids = itertools.count(1)

    def __init__(self, commits: GroupCommitter) -> None:
        self.commits = commits
        self.waiting: int | None = None  # the statement whose answer comes next

    async def request(self, data: bytes) -> None:
        if data[:1] == b"Q":
            statement = next(self.ids)
            await self.commits.write(PENDING, (statement, data, time.time_ns() // 1000))
            self.waiting = statement

    async def answer(self, data: bytes) -> None:
        if (statement := self.waiting) is not None:
            self.waiting = None
            await self.commits.write(ANSWERED, (data, time.time_ns() // 1000, statement))


async def serve(listen: tuple[str, int], upstream: tuple[str, int], durable: Path | None) -> None:
    commits = None if durable is None else GroupCommitter(open_db(durable, SCHEMA))

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError:
            writer.close()
            return
        recorded = None if commits is None else Recorded(commits)
        with contextlib.suppress(ConnectionError):
            await asyncio.gather(
                copy(reader, up_writer, None if recorded is None else recorded.request),
                copy(up_reader, writer, None if recorded is None else recorded.answer),
            )

    server = await asyncio.start_server(accept, *listen)
    if commits is not None:
        commits.start()
    host, port = server.sockets[0].getsockname()[:2]
    print(f"bare relay ready {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0 picks one)")
    parser.add_argument("--upstream", default="127.0.0.1:5432", help="HOST:PORT")
    parser.add_argument("--durable", type=Path, help="record each query here first (the floor)")
    args = parser.parse_args()
    asyncio.run(serve(host_port(args.listen), host_port(args.upstream), args.durable))


if __name__ == "__main__":
    main()
