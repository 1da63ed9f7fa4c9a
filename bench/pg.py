"""Benchmark: the PostgreSQL data path, direct vs a bare Python relay vs the sidecar.

    ./run bench pg [--seconds 4] [--rounds 3] [--checks-only] [--json PATH]

Needs a PostgreSQL server on 127.0.0.1:5432 that trusts user ``postgres`` and the
``pgbench`` and ``psql`` clients.  A scratch database ``es_bench_<random>`` is made
(``pgbench -i -s 1``) and dropped at the end (``DROP DATABASE ... WITH (FORCE)``).
pgbench (simple query protocol, one connection per client for the whole run) drives
each path with short runs, ``-c 1 -j 1`` and ``-c 8 -j 2``:

* direct                 straight to the server;
* bare relay             bench/bare_relay.py: asyncio, two copy loops per connection,
                         no parsing - the floor for any relay written in Python;
* sidecar, no SQL rules  ``sidecar serve --pg-upstream`` with no SQL rule (only the
                         proxy benchmark's HTTP rule): bytes are copied, not parsed;
* sidecar, postgres pack the shipped rules/postgres.yaml: every message is framed and
                         tracked, every query looked at - none of pgbench's matches;
* pgbouncer (session)    when a ``pgbouncer`` binary is on PATH (else noted, skipped);

over two workloads, select-only (``-S``) and the default TPC-B-like script.  Then the
cost of a matched, recorded statement: a script of one
``INSERT INTO bench_effects (id, note) VALUES (:id, 'x')`` with a new random id each
time (so each is a new effect) run

* direct, as it is, and as ``BEGIN; INSERT ...; INSERT INTO bench_extra ... ON CONFLICT
  DO NOTHING RETURNING 1; COMMIT`` - the statement plus the extra INSERT a record costs;
* through the sidecar with no SQL rules, and through a sidecar whose one rule matches
  that INSERT (``effect: non_idempotent``) and that holds task ``bench``'s lease
  (``--task bench``; pgbench runs with ``PGOPTIONS='-c sidecar.task=bench'``): each
  statement is wrapped in a transaction with a record in ``effect_sidecar.effects``.
  The rows in that table are counted afterwards to show the recording happened.

Rounds interleave the paths (their order rotated each round) so drift hits all alike;
the table shows the median over rounds, the spread ((max - min) / median) of the TPS,
ratios as the median of the per-round ratios, and the CPU
the process in between (relay, sidecar) used: share of one core while pgbench ran, and
CPU microseconds per transaction - steadier than TPS on a busy machine.  Every path first
runs 100 transactions (warm-up).  ``--checks-only`` runs just what ``./run bench all``
checks (select-only: bare relay and both sidecars; INSERT: the sidecar with no SQL rules
and the recording one; no pgbouncer); ``--json PATH`` writes the checks.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from _common import Output, Sample, cpu_seconds, paired, parser

from sidecar.rules.packs import packs_dir
from sidecar.testing.processes import Child
from tests.support.pgcluster import unprivileged_user

HERE = Path(__file__).parent
HOST, PORT, USER = "127.0.0.1", 5432, "postgres"
CLIENTS = (1, 8)
SELECT_ONLY, TPCB, INSERT = "select-only (-S)", "TPC-B-like", "INSERT, 1 statement (-f)"
DIRECT, BARE, BOUNCER = "direct", "bare relay", "pgbouncer"
SIDECAR, PACKED = "sidecar, no SQL rules", "sidecar, postgres pack"
EXTRA, RECORDED = "direct, + extra INSERT in a tx", "sidecar recorded"
FLOOR = "floor: durable relay, record in the query"

INSERT_SQL = """\
\\set id random(1, 1000000000000)
INSERT INTO bench_effects (id, note) VALUES (:id, 'x');
"""
INSERT_EXTRA_SQL = """\
\\set id random(1, 1000000000000)
BEGIN;
INSERT INTO bench_effects (id, note) VALUES (:id, 'x');
INSERT INTO bench_extra (task, key, statement) VALUES ('bench', (:id)::text, 'INSERT') \
ON CONFLICT (task, key) DO NOTHING RETURNING 1;
COMMIT;
"""
# The floor's statement: the record and the INSERT in one transaction sent as one query
# (pgbench's "\;" joins them), through bare_relay.py --durable.
INSERT_FLOOR_SQL = """\
\\set id random(1, 1000000000000)
BEGIN \\; INSERT INTO bench_extra (task, key, statement) VALUES ('bench', (:id)::text, \
'INSERT') ON CONFLICT (task, key) DO NOTHING RETURNING 1 \\; \
INSERT INTO bench_effects (id, note) VALUES (:id, 'x') \\; COMMIT;
"""
TABLES = """
CREATE TABLE bench_effects (id bigint NOT NULL, note text NOT NULL);
CREATE TABLE bench_extra (task text NOT NULL, key text NOT NULL, statement text NOT NULL,
  recorded_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (task, key));
"""
RECORD_RULES = """\
# bench/pg.py: the one INSERT of the benchmark's script is an effect.
version: 1
rules:
  - name: bench.insert
    description: Each INSERT into bench_effects runs once per task (a new id, a new effect).
    match: {sql: {kind: [INSERT], regex: "bench_effects"}}
    effect: non_idempotent
"""


@dataclass(frozen=True)
class Route:
    """One way to reach the server: a port, extra environment, the process in between."""

    name: str
    port: int
    pid: int | None = None
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Run:
    """One pgbench run's figures."""

    tps: float
    latency_ms: float
    transactions: int
    relay_cpu: float | None  # CPU seconds used by the relay process during the run
    wall: float  # seconds the run took, connections included


RESULTS: dict[tuple[str, int, str], list[Run]] = {}
# The recording sidecar's own store writes over the whole run, from its /metrics:
# operation -> (writes, mean ms from submit to durable commit).
STORE_WRITES: dict[str, tuple[int, float]] = {}


def psql(database: str, sql: str, *, port: int = PORT, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", HOST, "-p", str(port),
         "-U", USER, "-d", database, "-c", sql],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"psql failed ({done.returncode}) on {sql[:60]!r}: {done.stderr}")
    return done.stdout.strip()


def pgbench(
    database: str, route: Route, clients: int, script: list[str], *, seconds: float | None = None,
    transactions: int | None = None,
) -> Run:  # fmt: skip
    threads = 1 if clients == 1 else 2
    length = ["-T", f"{seconds:g}"] if seconds is not None else ["-t", str(transactions)]
    argv = ["pgbench", "-n", *length, "-c", str(clients), "-j", str(threads), *script,
            "-h", HOST, "-p", str(route.port), "-U", USER, database]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PGOPTIONS"} | route.env
    cpu_before = cpu_seconds(route.pid) if route.pid else 0.0
    began = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - began
    relay_cpu = cpu_seconds(route.pid) - cpu_before if route.pid else None
    out = done.stdout
    tps = re.search(r"^tps = ([\d.]+) \(without initial connection time\)", out, re.M)
    latency = re.search(r"^latency average = ([\d.]+) ms", out, re.M)
    processed = re.search(r"^number of transactions actually processed: (\d+)", out, re.M)
    failed = re.search(r"^number of failed transactions: (\d+)", out, re.M)
    if done.returncode != 0 or not (tps and latency and processed) or (failed and failed[1] != "0"):
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{out}{done.stderr}")
    return Run(float(tps[1]), float(latency[1]), int(processed[1]), relay_cpu, wall)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, child: Child, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.proc.poll() is not None:
            raise RuntimeError(f"{child.argv[0]} exited ({child.proc.returncode})")
        with socket.socket() as s:
            if s.connect_ex((HOST, port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{child.argv[0]} is not listening on {port} after {timeout}s")


@contextmanager
def scratch_database() -> Iterator[str]:
    name = f"es_bench_{secrets.token_hex(4)}"
    psql("postgres", f"CREATE DATABASE {name}")
    try:
        init = subprocess.run(
            ["pgbench", "-i", "-s", "1", "-q", "-h", HOST, "-p", str(PORT), "-U", USER, name],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if init.returncode != 0:
            raise RuntimeError(f"pgbench -i failed:\n{init.stderr}")
        psql(name, TABLES)
        yield name
    finally:
        psql("postgres", f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextmanager
def workspace(name: str) -> Iterator[tuple[Path, str, ExitStack]]:
    """A scratch directory, a scratch database, and a stack for the processes started."""
    with (
        tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as tmp,
        scratch_database() as database,
        ExitStack() as stack,
    ):
        yield Path(tmp), database, stack


def sidecar(root: Path, name: str, rules: Path, *extra: str) -> Child:
    return Child.python(
        "sidecar", "serve", "--data-dir", str(root / name),
        "--control-listen", f"{HOST}:0", "--proxy-listen", f"{HOST}:0",
        "--pg-listen", f"{HOST}:0", "--pg-upstream", f"postgresql://{HOST}:{PORT}",
        "--rules", str(rules), "--log-level", "warning", *extra,
        stderr_path=root / f"{name}.log",
    )  # fmt: skip


def bare_relay(root: Path, *extra: str, log: str = "bare_relay") -> Child:
    """bench/bare_relay.py in front of the server (``extra``: ``--durable PATH``, say)."""
    return Child(
        [sys.executable, str(HERE / "bare_relay.py"), "--listen", f"{HOST}:0",
         "--upstream", f"{HOST}:{PORT}", *extra],
        stderr_path=root / f"{log}.log",
    )  # fmt: skip


def machine_line(server: str, load_before: float) -> str:
    """The machine a PostgreSQL benchmark ran on, as its output's first line."""
    return (
        f"machine: {os.cpu_count()} CPUs ({platform.machine()}), Python "
        f"{platform.python_version()}, PostgreSQL {server}; load average {load_before:.2f} "
        f"before, {os.getloadavg()[0]:.2f} after"
    )


def pgbouncer(root: Path, binary: str) -> tuple[Child, int]:
    """pgbouncer in session mode in front of the server; it refuses to run as root, so
    there it runs as the unprivileged user a private PostgreSQL cluster would."""
    port = free_port()
    root = root / "pgbouncer"
    root.mkdir()
    argv = [binary]
    if (owner := unprivileged_user()) is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
        os.chmod(root.parent, 0o755)
        user = owner.pw_name
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", binary]
    (root / "userlist.txt").write_text(f'"{USER}" ""\n')
    (root / "pgbouncer.ini").write_text(
        f"[databases]\n* = host={HOST} port={PORT}\n\n[pgbouncer]\n"
        f"listen_addr = {HOST}\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {root / 'userlist.txt'}\npool_mode = session\n"
        "max_client_conn = 100\ndefault_pool_size = 20\n"
        f"logfile = {root / 'pgbouncer.log'}\npidfile =\n"
    )
    for written in ("userlist.txt", "pgbouncer.ini"):
        (root / written).chmod(0o644)
    child = Child([*argv, str(root / "pgbouncer.ini")], stderr_path=root.parent / "pgbouncer.err")
    wait_listening(port, child)
    return child, port


def recorded_ready(database: str, route: Route, timeout: float = 20.0) -> None:
    """Wait for the sidecar to hold task bench's lease: one matched INSERT gets through."""
    env = {k: v for k, v in os.environ.items() if k != "PGOPTIONS"} | route.env
    deadline = time.monotonic() + timeout
    while True:
        try:
            psql(database, "INSERT INTO bench_effects (id, note) VALUES (0, 'warm-up')",
                 port=route.port, env=env)  # fmt: skip
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
        else:
            return


def store_writes(control: str) -> dict[str, tuple[int, float]]:
    """Per store operation: how many writes and their mean latency (ms), as the sidecar's
    ``sidecar_store_write_seconds`` histogram counted them."""
    with urllib.request.urlopen(f"{control}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found: dict[str, dict[str, float]] = {}
    for name, operation, value in re.findall(
        r'^sidecar_store_write_seconds_(sum|count)\{operation="([^"]+)"\} (\S+)$', text, re.M
    ):
        found.setdefault(operation, {})[name] = float(value)
    return {
        operation: (int(v["count"]), v["sum"] / v["count"] * 1e3)
        for operation, v in found.items()
        if v.get("count")
    }


def measure(args: argparse.Namespace, root: Path, database: str) -> tuple[int, int, str]:
    """Run every case; return (recorded transactions, rows in effect_sidecar.effects, note)."""
    insert, extra = root / "insert.sql", root / "insert_extra.sql"
    insert.write_text(INSERT_SQL)
    extra.write_text(INSERT_EXTRA_SQL)
    least = root / "insert_floor.sql"
    least.write_text(INSERT_FLOOR_SQL)
    (root / "rules.yaml").write_text(RECORD_RULES)
    with ExitStack() as stack:
        bare = stack.enter_context(bare_relay(root))
        durable = stack.enter_context(
            bare_relay(root, "--durable", str(root / "floor.db"), log="floor_relay")
        )
        plain = stack.enter_context(sidecar(root, "sidecar", HERE / "proxy-rules.yaml"))
        packed = stack.enter_context(sidecar(root, "sidecar-packed", packs_dir() / "postgres.yaml"))
        recording = stack.enter_context(
            sidecar(root, "sidecar-recorded", root / "rules.yaml", "--task", "bench",
                    "--worker", "bench")
        )  # fmt: skip
        pg_port = r"pg=postgresql://[\d.]+:(\d+)"
        direct = Route(DIRECT, PORT)
        main_routes = [
            direct,
            Route(BARE, int(bare.wait_for(r"ready [\d.]+:(\d+)")[1]), bare.pid),
            Route(SIDECAR, int(plain.wait_for(pg_port)[1]), plain.pid),
            Route(PACKED, int(packed.wait_for(pg_port)[1]), packed.pid),
        ]
        note = "pgbouncer: not installed (skipped)"
        if args.checks_only:
            note = "pgbouncer: skipped (--checks-only)"
        elif binary := shutil.which("pgbouncer"):
            bouncer, port = pgbouncer(root, binary)
            stack.enter_context(bouncer)
            main_routes.append(Route(BOUNCER + " (session)", port, bouncer.pid))
            note = f"pgbouncer: {binary}, session pool mode, auth_type=trust"
        recorded = Route(
            RECORDED, int(recording.wait_for(pg_port)[1]), recording.pid,
            {"PGOPTIONS": "-c sidecar.task=bench"},
        )  # fmt: skip
        recorded_ready(database, recorded)
        if args.checks_only:
            main_routes = main_routes[1:]  # the checks compare with the bare relay
        recorded_total = 1
        # (workload, its pgbench arguments per route)
        plain_route = next(r for r in main_routes if r.name == SIDECAR)
        bare_route = next(r for r in main_routes if r.name == BARE)
        floor_route = Route(FLOOR, int(durable.wait_for(r"ready [\d.]+:(\d+)")[1]), durable.pid)
        inserts = [
            (direct, ["-f", str(insert)]),
            (Route(EXTRA, PORT), ["-f", str(extra)]),
            (plain_route, ["-f", str(insert)]),
            (recorded, ["-f", str(insert)]),
            (bare_route, ["-f", str(insert)]),  # the floor's unrecorded statement
            (floor_route, ["-f", str(least)]),
        ]
        cases: list[tuple[str, list[tuple[Route, list[str]]]]] = [
            (SELECT_ONLY, [(r, ["-S"]) for r in main_routes]),
            (TPCB, [(r, []) for r in main_routes]),
            (INSERT, inserts),
        ]
        if args.checks_only:
            cases = [cases[0], (INSERT, inserts[2:])]
        for _, runs in cases:  # warm-up: connections, caches, the record table's schema
            for route, script in runs:
                warm = pgbench(database, route, 1, script, transactions=100)
                recorded_total += warm.transactions if route is recorded else 0
        for round_ in range(args.rounds):
            for workload, runs in cases:
                for clients in CLIENTS:
                    shift = round_ % len(runs)
                    for route, script in runs[shift:] + runs[:shift]:
                        run = pgbench(database, route, clients, script, seconds=args.seconds)
                        RESULTS.setdefault((workload, clients, route.name), []).append(run)
                        recorded_total += run.transactions if route is recorded else 0
                        print(
                            f"  round {round_ + 1}  {workload:<26} c={clients}  "
                            f"{route.name:<32} {run.tps:>9,.0f} tps",
                            file=sys.stderr,
                        )
        rows = int(psql(database, "SELECT count(*) FROM effect_sidecar.effects"))
        STORE_WRITES.update(store_writes(recording.wait_for(r"control=(\S+)")[1]))
    return recorded_total, rows, note


def report(out: Output) -> None:
    def median(workload: str, clients: int, name: str) -> tuple[float, float] | None:
        runs = RESULTS.get((workload, clients, name))
        if not runs:
            return None
        return (
            statistics.median(r.tps for r in runs),
            statistics.median(r.latency_ms for r in runs),
        )

    print("\n| workload | clients | path | TPS | spread | latency avg ms | relay CPU "
          "| relay CPU µs/tx | vs bare relay | vs direct |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for (workload, clients, name), runs in RESULTS.items():
        tps, latency = median(workload, clients, name) or (0.0, 0.0)
        spread = (max(r.tps for r in runs) - min(r.tps for r in runs)) / tps * 100
        timed = [(r.relay_cpu, r) for r in runs if r.relay_cpu is not None]
        busy = statistics.median(c / r.wall for c, r in timed) * 100 if timed else None
        per_tx = statistics.median(c / r.transactions for c, r in timed) * 1e6 if timed else None
        cpu = f"{busy:.0f}% | {per_tx:.0f}" if busy is not None and per_tx else "- | -"
        bare = median(workload, clients, BARE)
        direct = median(workload, clients, DIRECT)
        # Ratios: the median of the per-round ratios (both ran in the same round).
        vs_bare = (
            f"{per_round(workload, clients, name, BARE).median:.2f}x"
            if bare and name != BARE
            else ""
        )
        vs_direct = (
            f"{per_round(workload, clients, name, DIRECT).median:.2f}x"
            if direct and name != DIRECT
            else ""
        )
        print(
            f"| {workload} | {clients} | {name} | {tps:,.0f} | {spread:.0f}% | {latency:.3f} "
            f"| {cpu} | {vs_bare} | {vs_direct} |"
        )
    print()
    for clients in CLIENTS:
        direct, extra = median(INSERT, clients, DIRECT), median(INSERT, clients, EXTRA)
        plain, recorded = median(INSERT, clients, SIDECAR), median(INSERT, clients, RECORDED)
        if not (direct and extra and plain and recorded):
            continue
        cost, added = extra[1] - direct[1], recorded[1] - plain[1]
        print(
            f"c={clients}: the extra INSERT in a transaction costs {cost:+.3f} ms per statement "
            f"direct; recording through the sidecar costs {added:+.3f} ms "
            f"(recorded vs no SQL rules) = {added / cost:.2f}x the extra INSERT"
        )
    if pending := STORE_WRITES.get("effect.record"):
        writes, mean_ms = pending
        plain = median(INSERT, 1, SIDECAR)
        print(
            f"the pending write (SPEC §3: durable in the sidecar's store before the statement "
            f"is sent): {writes:,} writes, {mean_ms:.3f} ms mean from submit to commit"
            + (
                f"; with it on the path a recorded statement at c=1 can reach at most "
                f"{plain[1] / (plain[1] + mean_ms):.2f}x of an unrecorded one"
                if plain
                else ""
            )
        )
    checks(out, median)


def per_round(workload: str, clients: int, name: str, base: str) -> Sample:
    """``name``'s TPS over ``base``'s, per round (the two ran minutes apart at most)."""
    return paired(
        [r.tps for r in RESULTS[(workload, clients, name)]],
        [r.tps for r in RESULTS[(workload, clients, base)]],
    )


def checks(out: Output, median: Callable[[str, int, str], tuple[float, float] | None]) -> None:
    """Against the targets of issue 18: TPS ratios are medians of the per-round ratios."""
    for clients, target in ((8, 0.95), (1, 0.9)):
        bare = median(SELECT_ONLY, clients, BARE)
        for name, label in ((SIDECAR, "no SQL rules"), (PACKED, "postgres pack, none match")):
            path = median(SELECT_ONLY, clients, name)
            if bare and path:
                x = per_round(SELECT_ONLY, clients, name, BARE)
                out.check(
                    f"PostgreSQL relay pass-through ({label}), pgbench -S c={clients}: "
                    "TPS vs bare relay",
                    f"{path[0]:,.0f} / {bare[0]:,.0f}, {x.median:.2f}x ({x.spread('.2f')})",
                    f"≥ {target}x",
                    x.median >= target,
                    # The bare relay is the floor of any relay in Python: the reference.
                    ("the bare relay itself, 1.00x", True),
                )
    for clients in CLIENTS:
        plain, recorded = median(INSERT, clients, SIDECAR), median(INSERT, clients, RECORDED)
        least, bare = median(INSERT, clients, FLOOR), median(INSERT, clients, BARE)
        if plain and recorded:
            x = per_round(INSERT, clients, RECORDED, SIDECAR)
            floor = None
            if least and bare:
                fl = per_round(INSERT, clients, FLOOR, BARE)
                text = f"{least[0]:,.0f} tps vs the bare relay's, {fl.median:.2f}x"
                floor = (f"{text} ({fl.spread('.2f')})", fl.median >= 0.5)
            out.check(
                f"PostgreSQL relay, recorded INSERT c={clients}: TPS vs unrecorded",
                f"{recorded[0]:,.0f} / {plain[0]:,.0f}, {x.median:.2f}x ({x.spread('.2f')})",
                "≥ 0.5x",
                x.median >= 0.5,
                floor,
            )
    out.figures["runs"] = {
        f"{workload} c={clients} {name}": [vars(r) for r in runs]
        for (workload, clients, name), runs in RESULTS.items()
    }


def main() -> None:
    options = parser(__doc__, seconds=4.0, seconds_help="pgbench -T per run")
    options.add_argument("--checks-only", action="store_true", help="only what bench all checks")
    args = options.parse_args()
    out = Output("pg")
    began, load = time.monotonic(), os.getloadavg()[0]
    server = psql("postgres", "SHOW server_version")
    version = subprocess.run(["pgbench", "--version"], capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory(prefix="bench-pg-") as tmp, scratch_database() as database:
        recorded, rows, note = measure(args, Path(tmp), database)
    print(
        f"\nmachine: {os.cpu_count()} CPUs ({platform.machine()}), Python "
        f"{platform.python_version()}, PostgreSQL {server}, {version.stdout.strip()}; "
        f"load average {load:.2f} before, {os.getloadavg()[0]:.2f} after"
    )
    print(f"command: {Path(sys.executable).name} bench/pg.py {' '.join(sys.argv[1:])}".rstrip())
    print(
        f"pgbench: pgbench -n -T {args.seconds:g} -c 1 -j 1 | -c 8 -j 2 [-S | -f SCRIPT] "
        f"-h {HOST} -p PORT -U {USER} {database}; {args.rounds} rounds, paths interleaved"
    )
    print(note)
    report(out)
    print(
        f"recorded: {rows:,} rows in effect_sidecar.effects for {recorded:,} statements sent "
        "through the recording sidecar (warm-up included)"
    )
    out.print_checks()
    print(f"runtime: {time.monotonic() - began:.0f} s")
    out.write(args.json)


if __name__ == "__main__":
    main()
