"""The floor for a Python relay: a bare asyncio byte relay that parses nothing.

    .venv/bin/python bench/bare_relay.py --listen 127.0.0.1:0 --upstream 127.0.0.1:5432

Each accepted connection is connected to the upstream and carried by two copy loops
(64 KiB reads, write, drain) until either side closes.  No protocol is understood, so
whatever a relay that does parse messages (the sidecar's PostgreSQL relay) costs on top
of this is the price of its parsing and bookkeeping.  Prints ``bare relay ready
HOST:PORT`` on stdout once listening; runs until killed.  Used by bench/pg.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

READ_SIZE = 1 << 16


def host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(READ_SIZE):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(listen: tuple[str, int], upstream: tuple[str, int]) -> None:
    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*upstream)
        except OSError:
            writer.close()
            return
        with contextlib.suppress(ConnectionError):
            await asyncio.gather(copy(reader, up_writer), copy(up_reader, writer))

    server = await asyncio.start_server(accept, *listen)
    host, port = server.sockets[0].getsockname()[:2]
    print(f"bare relay ready {host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0 picks one)")
    parser.add_argument("--upstream", default="127.0.0.1:5432", help="HOST:PORT")
    args = parser.parse_args()
    asyncio.run(serve(host_port(args.listen), host_port(args.upstream)))


if __name__ == "__main__":
    main()
