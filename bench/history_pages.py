"""Benchmark: the proxy's pass-through while an operator pages through a 50,000-effect log.

    ./run bench history_pages [--seconds 3] [--effects 50000]

Real processes on loopback: the counting upstream and ``sidecar serve`` on a data dir
whose store holds one task with ``--effects`` effects (tests.support.long_log).  GET
/fast through the sidecar's proxy at concurrency 8, first idle, then while a reader pages
through ``GET /v1/tasks/312/effects`` (500 per page, following ``next_cursor``) without
pause.  Then one page of 100 (time, size) and the sidecar's RSS before and after reading
the whole log.  The list routes read a page from the store and build its answer off the
event loop, so the proxy's p99 should stay within 2x of idle.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from _common import rss_mib
from proxy import drive as drive_clients

from sidecar.testing.processes import Child
from tests.support import long_log

HERE = Path(__file__).parent
ROWS: list[tuple[str, int, float, float, float]] = []  # name, clients, req/s, p50, p99 ms


async def drive(name: str, clients: int, seconds: float, op: Any) -> None:
    """One row: ``op`` from ``clients`` closed-loop clients for ``seconds``."""
    ROWS.append((name, clients, *await drive_clients(clients, seconds, op)))


async def measure(seconds: float, effects: int, root: Path) -> dict[str, str]:
    upstream = Child.python("sidecar.testing.upstream", stderr_path=root / "upstream.log")
    up = upstream.wait_for(r"upstream ready (\S+)").group(1)
    sidecar = Child.python(
        "sidecar", "serve", "--data-dir", str(root / "sidecar"),
        "--control-listen", "127.0.0.1:0", "--proxy-listen", "127.0.0.1:0",
        "--rules", str(HERE / "proxy-rules.yaml"), "--route", f"bench.test={up}",
        "--log-level", "warning",
        stderr_path=root / "sidecar.log",
    )  # fmt: skip
    figures: dict[str, str] = {}
    with upstream, sidecar:
        control, proxy = sidecar.wait_for(r"control=(\S+) proxy=(\S+)").group(1, 2)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:

            async def get(n: int) -> None:
                async with http.get("http://bench.test/fast", proxy=proxy) as r:
                    await r.read()

            async def page(cursor: str | None, limit: int) -> tuple[dict, int]:
                query = f"?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
                async with http.get(f"{control}/v1/tasks/{long_log.TASK}/effects{query}") as r:
                    raw = await r.read()
                    return await r.json(), len(raw)

            pages = 0

            async def read_the_log(stop: asyncio.Event) -> None:
                nonlocal pages
                cursor = None
                while not stop.is_set():
                    body, _ = await page(cursor, 500)
                    pages += 1
                    cursor = body["next_cursor"]

            await drive("pass-through, idle", 8, seconds, get)
            stop = asyncio.Event()
            reader = asyncio.create_task(read_the_log(stop))
            await drive(f"pass-through, paging {effects:,}", 8, seconds, get)
            stop.set()
            await reader
            figures["pages of 500 read meanwhile"] = f"{pages:,}"

            started = time.perf_counter()
            _, size = await page(None, 100)
            figures["one page of 100"] = (
                f"{(time.perf_counter() - started) * 1e3:.0f} ms, {size / 1024:.0f} KiB"
            )
            before = rss_mib(sidecar.pid)
            started = time.perf_counter()
            cursor, read = None, 0
            while True:
                body, _ = await page(cursor, 500)
                read += len(body["effects"])
                cursor = body["next_cursor"]
                if cursor is None:
                    break
            figures[f"whole log ({read:,}) in pages of 500"] = (
                f"{time.perf_counter() - started:.1f} s, RSS {before:.0f} -> "
                f"{rss_mib(sidecar.pid):.0f} MiB"
            )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--effects", type=int, default=50_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pages-") as tmp:
        long_log.seed(Path(tmp) / "sidecar", args.effects)
        figures = asyncio.run(measure(args.seconds, args.effects, Path(tmp)))
    idle_p99 = ROWS[0][4]
    print(
        "\n| GET /fast through the sidecar | clients | requests/s | p50 ms | p99 ms | p99 vs idle |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, clients, rps, p50, p99 in ROWS:
        print(
            f"| {name} | {clients} | {rps:,.0f} | {p50:.2f} | {p99:.2f} | {p99 / idle_p99:.2f}x |"
        )
    print("\n| list route | figure |")
    print("|---|---|")
    for name, value in figures.items():
        print(f"| {name} | {value} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
