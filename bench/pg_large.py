"""Benchmark: one large value through the PostgreSQL relay, direct vs a bare relay vs the
sidecar framing every message.

    ./run bench pg_large [--megabytes 50] [--rounds 3] [--json PATH]

Needs a PostgreSQL server on 127.0.0.1:5432 that trusts user ``postgres``.  A scratch
database ``es_bench_<random>`` is made and dropped at the end.  psycopg writes one
``--megabytes`` bytea value (``INSERT ... VALUES (%s)``: a Bind message that large) and
reads it back (``SELECT``: a DataRow that large), through

* direct                  straight to the server;
* bare relay              bench/bare_relay.py: two copy loops, no parsing;
* sidecar, postgres pack  the shipped rules/postgres.yaml: every message framed and
                          tracked (neither statement matches a rule).

A large message arrives in many reads; a relay that framed it by copying what it held
again at every read took time growing with the square of its size (22 s to read 50 MB
back, against 0.4 s direct, before 2026-12-05).  Rounds interleave the paths (order
rotated each round); the table shows the median seconds and spread, and the ratio to
direct as the median of per-round ratios.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psycopg
from _common import Output, Sample, paired, parser
from pg import HOST, PORT, USER, bare_relay, machine_line, psql, sidecar, workspace

from sidecar.rules.packs import packs_dir

HERE = Path(__file__).parent
DIRECT, BARE, PACKED = "direct", "bare relay", "sidecar, postgres pack"


def write_and_read(database: str, port: int, value: bytes) -> tuple[float, float]:
    """Seconds to INSERT ``value`` and to SELECT it back, on one connection."""
    url = f"postgresql://{USER}@{HOST}:{port}/{database}"
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("DELETE FROM blobs")  # (TRUNCATE is DDL to the pack: recorded)
        began = time.perf_counter()
        connection.execute("INSERT INTO blobs VALUES (%s)", [value])
        written = time.perf_counter() - began
        began = time.perf_counter()
        row = connection.execute("SELECT b FROM blobs").fetchone()
        read = time.perf_counter() - began
    if row is None or len(row[0]) != len(value):
        raise RuntimeError(f"port {port}: the value did not come back whole")
    return written, read


def main() -> None:
    options = parser(__doc__, seconds=0.0, seconds_help="(not used)")
    options.add_argument("--megabytes", type=int, default=50, help="size of the value")
    args = options.parse_args()
    began, machine_load = time.monotonic(), os.getloadavg()[0]
    server = psql("postgres", "SHOW server_version")
    value = os.urandom(args.megabytes * 1024 * 1024)
    results: dict[str, list[tuple[float, float]]] = {}
    with workspace("pg-large") as (root, database, stack):
        psql(database, "CREATE TABLE blobs (b bytea)")
        bare = stack.enter_context(bare_relay(root))
        packed = stack.enter_context(sidecar(root, "sidecar", packs_dir() / "postgres.yaml"))
        routes = [
            (DIRECT, PORT),
            (BARE, int(bare.wait_for(r"ready [\d.]+:(\d+)")[1])),
            (PACKED, int(packed.wait_for(r"pg=postgresql://[\d.]+:(\d+)")[1])),
        ]
        for _, port in routes:
            write_and_read(database, port, value[: 1024 * 1024])  # warm-up
        for round_ in range(args.rounds):
            shift = round_ % len(routes)
            for name, port in routes[shift:] + routes[:shift]:
                done = write_and_read(database, port, value)
                results.setdefault(name, []).append(done)
                print(f"  round {round_ + 1}  {name:<24} write {done[0]:6.2f} s  "
                      f"read {done[1]:6.2f} s", file=sys.stderr)  # fmt: skip
    print(f"\n{machine_line(server, machine_load)}")
    print(f"command: {Path(sys.executable).name} bench/pg_large.py {' '.join(sys.argv[1:])}")
    print(f"value: one bytea of {args.megabytes} MiB; {args.rounds} rounds, paths interleaved\n")
    print(f"| path | write s | vs direct | read s | vs direct |\n|{'---|' * 5}")
    direct = results[DIRECT]
    for name, runs in results.items():
        cells = []
        for at in (0, 1):
            seconds = Sample([run[at] for run in runs])
            ratio = paired([run[at] for run in runs], [run[at] for run in direct])
            cells.append(
                f"{seconds.median:.2f} ({seconds.spread('.2f')}) | {ratio.median:.2f}x "
                f"({ratio.spread('.2f')})"
            )
        print(f"| {name} | {' | '.join(cells)} |")
    print(f"\nruntime: {time.monotonic() - began:.0f} s")
    Output("pg_large").write(args.json)


if __name__ == "__main__":
    main()
