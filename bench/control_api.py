"""Benchmark: durable checkpoint writes and claims, from raw SQLite up to the HTTP API.

    ./run bench control_api [--seconds 2] [--rounds 3] [--http-only] [--json PATH]

One run, one table, side by side:

* ``sqlite3 group-commit loop``: plain sqlite3 in WAL + synchronous=FULL, concurrent
  asyncio writers batched into one COMMIT, in this process - the floor for the store;
* ``store``: SQLiteStore.append_checkpoint, 1 and 32 concurrent callers, with
  synchronous=FULL (the default: durable against power loss) and NORMAL (durable only
  against process death) to show what the fsync costs;
* ``aiohttp + sqlite3 group-commit server``: ``bench/group_commit_server.py``, a real
  HTTP server process with the same route and the same loop as the first row - the
  reference the HTTP API is held to;
* ``the same server, fenced (floor)``: ``group_commit_server.py --fenced``: the same
  plain code doing what SPEC §3 asks of a checkpoint - the body's fields checked, the
  task's row fenced by attempt and generation and its sequence moved on, the checkpoint
  appended under it, in the batch's transaction - the control API's floor;
* ``HTTP API``: a real ``sidecar serve`` process: POST /checkpoints and POST /claim.

The servers are driven over loopback by aiohttp clients in this process, sequential and
32 concurrent.  Every row first runs once for ``--warm-up`` seconds, then once per round
for ``--seconds``; rounds interleave the rows, in reverse order every other round, and the
table shows the median over rounds and the spread (min-max) of writes/s, and for the
server rows the CPU the server process (all its threads) spent per call; the check
compares the API with the reference, and the floor with the reference, by the median of
their per-round ratios, and shows their CPU per checkpoint too, which the load of other
work on the machine moves far less.
``--http-only`` runs only the servers' checkpoint rows (what ``./run bench all``
checks); ``--json PATH`` writes the checks against the targets.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
from _common import Op, Output, Row, interleaved, paired, parser, run
from _group_commit import GroupCommitter, open_db

from sidecar.store.sqlite import SQLiteStore
from sidecar.testing.processes import Child

HERE = Path(__file__).parent
CLIENTS = (1, 32)
LOOP = "sqlite3 group-commit loop, in process"
REFERENCE = "aiohttp + sqlite3 group-commit server (reference)"
FENCED = "the same server, fenced (floor)"
API = "HTTP API POST /checkpoints"
CLAIM = "HTTP API POST /claim (new task each)"

RESULTS: dict[tuple[str, int], Row] = {}


async def sqlite_loop(path: Path, stack: AsyncExitStack) -> Op:
    """Plain sqlite3, no domain logic, no aiosqlite, no HTTP.

    Asyncio writers each submit a row and wait for it to be durable; one committer takes
    every row waiting, INSERTs them and COMMITs once in a worker thread (group commit,
    ``_group_commit.py``, as the reference server does).  With one client this is a
    transaction per row.
    """
    db = open_db(
        path, "CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, stage TEXT, outputs TEXT)"
    )
    stack.callback(db.close)
    commits = GroupCommitter(db)
    commits.start()
    stack.callback(commits.stop)

    def write(n: int) -> asyncio.Future[None]:
        return commits.write("INSERT INTO t (stage, outputs) VALUES (?, ?)", ("S", f'{{"n": {n}}}'))

    return write


async def store_layer(path: Path, synchronous: str, stack: AsyncExitStack) -> Op:
    store = SQLiteStore(f"sqlite:///{path}", synchronous=synchronous)
    await store.open()
    stack.push_async_callback(store.close)
    claim = await store.claim(f"bench-{synchronous}", "bench", 3600)

    async def write(n: int) -> object:
        return await store.append_checkpoint(
            claim.task, claim.attempt_id, claim.generation, "S", {"n": n}
        )

    return write


async def measure(args: argparse.Namespace, root: Path) -> None:
    cases: list[tuple[str, int, Op]] = []
    async with AsyncExitStack() as stack:
        if not args.http_only:
            loop = await sqlite_loop(root / "loop.db", stack)
            cases += [(LOOP, c, loop) for c in CLIENTS]
            for synchronous in ("FULL", "NORMAL"):
                write = await store_layer(root / f"store-{synchronous}.db", synchronous, stack)
                cases += [
                    (f"store checkpoint, synchronous={synchronous}", c, write) for c in CLIENTS
                ]
        server = stack.enter_context(
            Child.python(
                "sidecar", "serve", "--data-dir", str(root / "serve"),
                "--control-listen", "127.0.0.1:0", "--log-level", "warning",
                stderr_path=root / "sidecar.log",
            )
        )  # fmt: skip
        reference = stack.enter_context(
            Child(
                [sys.executable, str(HERE / "group_commit_server.py"), str(root / "ref.db")],
                stderr_path=root / "reference.log",
            )
        )
        fenced = stack.enter_context(
            Child(
                [sys.executable, str(HERE / "group_commit_server.py"), str(root / "fenced.db"),
                 "--fenced"],
                stderr_path=root / "fenced.log",
            )
        )  # fmt: skip
        url = server.wait_for(r"control=(\S+)").group(1)
        ref_url = reference.wait_for(r"reference ready (\S+)").group(1)
        fenced_url = fenced.wait_for(r"reference ready (\S+)").group(1)
        connector = aiohttp.TCPConnector(limit=64)
        http = await stack.enter_async_context(aiohttp.ClientSession(connector=connector))
        holder: dict[str, dict[str, object]] = {}
        for base in (url, fenced_url):  # the attempt each server's checkpoints are fenced by
            async with http.post(
                f"{base}/v1/tasks/bench/claim", json={"worker": "b", "ttl_s": 3600}
            ) as r:
                claim = await r.json()
            holder[base] = {"attempt_id": claim["attempt_id"], "generation": claim["generation"]}

        def checkpoint(base: str) -> Op:
            body = holder.get(base, holder[url])  # the plain reference fences nothing

            async def post(n: int) -> object:
                payload = body | {"stage": "S", "outputs": {"n": n}}
                async with http.post(f"{base}/v1/tasks/bench/checkpoints", json=payload) as r:
                    assert r.status == 201, await r.text()
                    return await r.read()

            return post

        async def claim_new(n: int) -> object:
            task = f"claim-{time.perf_counter_ns()}-{n}"
            async with http.post(
                f"{url}/v1/tasks/{task}/claim", json={"worker": "b", "ttl_s": 60}
            ) as r:
                assert r.status == 200, await r.text()
                return await r.read()

        for c in CLIENTS:  # each server next to the other, in every round
            cases += [
                (REFERENCE, c, checkpoint(ref_url)),
                (FENCED, c, checkpoint(fenced_url)),
                (API, c, checkpoint(url)),
            ]
        if not args.http_only:
            cases += [(CLAIM, c, claim_new) for c in CLIENTS]

        # CPU per call of each server process (all its threads): on a shared machine
        # the steadier comparison, since time a server waited for a core does not count.
        pids = {REFERENCE: reference.pid, FENCED: fenced.pid, API: server.pid, CLAIM: server.pid}
        await interleaved(cases, RESULTS, args, pids=pids)


def _cpu_us(row: Row) -> str:
    return f"{row.cpu_ms.median * 1e3:,.0f}" if row.cpu_ms.values else "-"


def report(out: Output) -> None:
    print(
        "\n| path | clients | writes/s (median) | spread | p50 ms | p99 ms | server CPU µs/call |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (name, clients), row in RESULTS.items():
        print(
            f"| {name} | {clients} | {row.rate.median:,.0f} | {row.rate.spread()} "
            f"| {row.p50.median:.2f} | {row.p99.median:.2f} | {_cpu_us(row)} |"
        )
    out.figures["rows"] = {
        f"{name} c={clients}": {
            "per_s": row.rate.values,
            "p50_ms": row.p50.values,
            "p99_ms": row.p99.values,
            "cpu_ms": row.cpu_ms.values,
        }
        for (name, clients), row in RESULTS.items()
    }
    api, ref, least = RESULTS[(API, 32)], RESULTS[(REFERENCE, 32)], RESULTS[(FENCED, 32)]
    x, fl = paired(api.rate.values, ref.rate.values), paired(least.rate.values, ref.rate.values)
    # The reference's CPU over ours: the throughput ratio a CPU-bound pair would show.
    cpu = paired(ref.cpu_ms.values, api.cpu_ms.values)
    out.figures["cpu_ratio_c32"] = cpu.values
    out.check(
        "control API checkpoints, SQLite, 32 clients vs aiohttp+sqlite3 group-commit server",
        f"{api.rate.median:,.0f} / {ref.rate.median:,.0f} /s, {x.median:.2f}x ({x.spread('.2f')}); "
        f"CPU {_cpu_us(api)} / {_cpu_us(ref)} µs per checkpoint, {cpu.median:.2f}x",
        "≥ 0.9x",
        x.median >= 0.9,
        # The floor: the same server doing what SPEC §3 asks of a checkpoint (a fenced,
        # ordered append), so what is left between it and the API is the sidecar's.
        (
            f"fenced: {fl.median:.2f}x ({fl.spread('.2f')}); CPU {_cpu_us(least)} µs",
            fl.median >= 0.9,
        ),
    )
    out.print_checks()


def main() -> None:
    options = parser(__doc__, seconds=2.0, warm_up=1.0)
    options.add_argument("--http-only", action="store_true", help="only the two servers' rows")
    args = options.parse_args()
    run("control_api", args, lambda tmp, _out: measure(args, tmp), report)


if __name__ == "__main__":
    main()
