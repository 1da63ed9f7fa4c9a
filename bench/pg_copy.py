"""Benchmark: a bulk load by ``COPY ... FROM STDIN``, direct vs a bare relay vs the sidecar.

    ./run bench pg_copy [--rows 1000000] [--rounds 3] [--json PATH]

Needs a PostgreSQL server on 127.0.0.1:5432 that trusts user ``postgres`` and ``psql``.
A scratch database ``es_bench_<random>`` is made and dropped at the end.  psql loads a
file of ``--rows`` rows (an int and a 60-character text, about 70 bytes a row) with
``psql -c "COPY loads FROM STDIN" < rows.tsv``, each load into an empty table, through

* direct                 straight to the server;
* bare relay             bench/bare_relay.py: two copy loops, no parsing;
* sidecar, no SQL rules  ``sidecar serve --pg-upstream`` with no SQL rule: bytes copied;
* sidecar recorded       a sidecar whose rule records that COPY and that holds task
                         ``bench``'s lease (``--task bench``): every load is a new effect
                         (a ``sidecar:key`` comment per load), its rows streamed to the
                         server while the sidecar holds the statement, in one transaction
                         with its record;
* sidecar replayed       the same sidecar, the same key again: answered ``COPY n`` from
                         the record, the rows read and dropped.

Rounds interleave the paths (their order rotated each round); the table shows the
median seconds per load and its spread, the rate in MB/s, the ratio to direct as the
median of the per-round ratios, and the CPU seconds the process in between used per
load.  Every path loads once first (warm-up).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import Output, Sample, cpu_seconds, paired, parser
from pg import HOST, PORT, USER, bare_relay, machine_line, psql, sidecar, workspace

HERE = Path(__file__).parent
DIRECT, BARE, SIDECAR = "direct", "bare relay", "sidecar, no SQL rules"
RECORDED, REPLAYED = "sidecar recorded", "sidecar replayed"
RULES = """\
# bench/pg_copy.py: a load into the loads table is an effect.
version: 1
rules:
  - name: bench.load
    description: Each load into the loads table runs once per task.
    match: {sql: {kind: [COPY], regex: "\\\\bloads\\\\b"}}
    effect: non_idempotent
"""


@dataclass
class Route:
    """One way to reach the server: a port, extra environment, the process in between,
    and what each load is keyed with (``None``: no key)."""

    name: str
    port: int
    pid: int | None = None
    env: dict[str, str] = field(default_factory=dict)
    key: str | None = None
    loads: int = 0

    def statement(self) -> str:
        """The load's COPY: a new key each time, or always the same (the replay)."""
        if self.key is None:
            return "COPY loads FROM STDIN"
        self.loads += 1
        key = self.key if self.name == REPLAYED else f"{self.key}-{self.loads}"
        return f"/* sidecar:key={key} */ COPY loads FROM STDIN"


@dataclass
class Load:
    seconds: float
    cpu_s: float | None


def load(database: str, route: Route, rows: Path, expected: int) -> Load:
    """One load through ``route`` into the emptied table; its wall time and the CPU the
    process in between used."""
    psql(database, "TRUNCATE loads")
    env = {k: v for k, v in os.environ.items() if k != "PGOPTIONS"} | route.env
    argv = ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", HOST, "-p", str(route.port),
            "-U", USER, "-d", database, "-c", route.statement()]  # fmt: skip
    cpu_before = cpu_seconds(route.pid) if route.pid else 0.0
    began = time.perf_counter()
    with rows.open("rb") as stdin:
        done = subprocess.run(argv, stdin=stdin, capture_output=True, env=env, check=False)
    seconds = time.perf_counter() - began
    cpu = cpu_seconds(route.pid) - cpu_before if route.pid else None
    if done.returncode != 0:
        raise RuntimeError(f"psql through {route.name} failed: {done.stderr.decode()}")
    loaded = int(psql(database, "SELECT count(*) FROM loads"))
    if loaded != (0 if route.name == REPLAYED else expected):
        raise RuntimeError(f"{route.name}: {loaded:,} rows in the table, not {expected:,}")
    return Load(seconds, cpu)


def rows_file(root: Path, count: int) -> Path:
    path = root / "rows.tsv"
    note = "x" * 60
    path.write_text("".join(f"{n}\t{note}\n" for n in range(count)))
    return path


def main() -> None:
    options = parser(__doc__, seconds=0.0, seconds_help="(not used: a load takes what it takes)")
    options.add_argument("--rows", type=int, default=1_000_000, help="rows per load")
    args = options.parse_args()
    began, machine_load = time.monotonic(), os.getloadavg()[0]
    server = psql("postgres", "SHOW server_version")
    results: dict[str, list[Load]] = {}
    with workspace("pg-copy") as (root, database, stack):
        psql(database, "CREATE TABLE loads (id int, note text)")
        rows = rows_file(root, args.rows)
        megabytes = rows.stat().st_size / 1e6
        (root / "rules.yaml").write_text(RULES)
        bare = stack.enter_context(bare_relay(root))
        plain = stack.enter_context(sidecar(root, "sidecar", HERE / "proxy-rules.yaml"))
        recording = stack.enter_context(
            sidecar(root, "sidecar-recorded", root / "rules.yaml", "--task", "bench",
                    "--worker", "bench")
        )  # fmt: skip
        pg_port = r"pg=postgresql://[\d.]+:(\d+)"
        bound = {"PGOPTIONS": "-c sidecar.task=bench"}
        recorded_port = int(recording.wait_for(pg_port)[1])
        routes = [
            Route(DIRECT, PORT),
            Route(BARE, int(bare.wait_for(r"ready [\d.]+:(\d+)")[1]), bare.pid),
            Route(SIDECAR, int(plain.wait_for(pg_port)[1]), plain.pid),
            Route(RECORDED, recorded_port, recording.pid, bound, key="load"),
            Route(REPLAYED, recorded_port, recording.pid, bound, key="load-replayed"),
        ]
        ready = time.monotonic() + 20  # until the recording sidecar holds its lease
        while True:
            try:
                load(database, routes[-1], rows, args.rows)  # the replay's first: recorded
                break
            except RuntimeError:
                if time.monotonic() > ready:
                    raise
                time.sleep(0.2)
        for route in routes[:-1]:
            load(database, route, rows, args.rows)  # warm-up
        for round_ in range(args.rounds):
            shift = round_ % len(routes)
            for route in routes[shift:] + routes[:shift]:
                done = load(database, route, rows, args.rows)
                results.setdefault(route.name, []).append(done)
                print(f"  round {round_ + 1}  {route.name:<22} {done.seconds:6.2f} s",
                      file=sys.stderr)  # fmt: skip
        records = int(psql(database, "SELECT count(*) FROM effect_sidecar.effects"))
    print(f"\n{machine_line(server, machine_load)}")
    print(f"command: {Path(sys.executable).name} bench/pg_copy.py {' '.join(sys.argv[1:])}")
    print(
        f'load: psql -c "COPY loads FROM STDIN" < rows.tsv ({args.rows:,} rows, '
        f"{megabytes:.1f} MB); {args.rounds} rounds, paths interleaved\n"
    )
    direct = [d.seconds for d in results[DIRECT]]
    print(f"| path | s per load | MB/s | vs direct (time) | CPU s per load |\n|{'---|' * 5}")
    for name, loads in results.items():
        seconds = Sample([d.seconds for d in loads])
        ratio = paired([d.seconds for d in loads], direct)
        cpus = [d.cpu_s for d in loads if d.cpu_s is not None]
        cpu = f"{statistics.median(cpus):.2f}" if cpus else "-"
        print(
            f"| {name} | {seconds.median:.2f} ({seconds.spread('.2f')}) | "
            f"{megabytes / seconds.median:.1f} | {ratio.median:.2f}x ({ratio.spread('.2f')}) "
            f"| {cpu} |"
        )
    print(
        f"\nrecorded: {records} records in effect_sidecar.effects (one per recorded load, "
        "warm-up included, and the replayed key's one)"
    )
    print(f"runtime: {time.monotonic() - began:.0f} s")
    Output("pg_copy").write(args.json)


if __name__ == "__main__":
    main()
