"""Benchmark: the HTTP data path, direct vs plain mitmproxy vs the sidecar, in one run.

    ./run bench proxy [--seconds 2] [--rounds 3] [--growth] [--json PATH]

Real processes on loopback: the counting upstream (``sidecar.testing.upstream``), a
plain ``mitmdump`` (default addons, nothing of ours), and ``sidecar serve`` with one
rule (bench/proxy-rules.yaml).  An aiohttp client in this process (the load tool, outside
both proxies) drives each path at concurrency 1 and 32 over plain HTTP (so TLS costs
are not measured, the proxies' own work is):

* direct                    GET /fast straight to the upstream;
* mitmdump                  GET /fast through mitmdump;
* sidecar pass-through      GET /fast through the sidecar (no rule matches);
* sidecar recorded          POST /effects/{new id}: record pending, forward, record answer;
* sidecar replayed          POST /effects/{same id}: answered from the log;

then with a 1 MiB JSON body:

* mitmdump 1 MiB            POST /upload through mitmdump;
* sidecar pass-through 1 MiB POST /upload through the sidecar (unmatched: streamed);
* sidecar recorded 1 MiB    POST /effects/{new id} through the sidecar (matched: buffered,
                            hashed, recorded);

and the floor, ``_floor_proxy.py``: mitmproxy embedded as the sidecar embeds it, with
an addon doing the least any design meeting SPEC §3 pays with these engines (two durable
SQLite writes in a group-commit thread and an aiohttp forward per new effect, a dict
lookup per replay; no rules, leases, audit or control API):

* floor pass-through        GET /fast, routed to the upstream and streamed by mitmproxy;
* floor recorded            POST /effects/{new id};
* floor replayed            POST /effects/{same id};
* floor pass-through 1 MiB  POST /upload, streamed (as the sidecar streams what no rule
                            records);
* floor recorded 1 MiB      POST /effects/{new id} with the 1 MiB body.

The checks against issue 18's targets are followed by the floor's figures on the same
paths (no pass mark): how much of a recorded row's gap the engines and the two durable
writes take, and how much is the sidecar's own.

Every row runs once per round for ``--seconds`` after a warm-up pass; rounds interleave
the rows, their order reversed every other round, so drift on a busy machine hits all
alike.  Rows show the median over rounds and the spread (min-max) of requests/s; a
ratio ("vs", and the checks) is the median of the per-round ratios (the two rows of a
pair ran seconds apart, under the same load), with their min-max in brackets.  Each row
also shows the CPU its proxy process (all threads) spent per request: time spent waiting
for a core does not count, so it is the steadier figure on a busy machine, and the one
that says whose work a gap is.

Also, in the same run: start-up time (mitmdump: until its port accepts; sidecar: until
``/readyz`` answers 200; the floor: until it listens), the median of three starts per
round each, alternated, each proxy on the state its first start made (mitmdump's CA; the
sidecar's CA and store); resident memory of both proxies idle; the growth of each
proxy's RSS (peak over the 1 MiB rows minus the RSS before them); os.fdatasync p50 on the
data dir's disk (200 calls on a small file: the least one durable commit costs); with
``--growth``, the sidecar's RSS after 10,000 and after 50,000 more recorded effects (32
clients, after the small rows, before the 1 MiB ones).  ``--json PATH`` writes the
checks against the targets (for ``./run bench all``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Iterator
from itertools import count
from pathlib import Path

import aiohttp
from _common import (
    Op,
    Output,
    Row,
    Sample,
    fdatasync_p50_ms,
    interleaved,
    listening_port,
    paired,
    parser,
    rss_mib,
    run,
)

from sidecar.testing.processes import Child

HERE = Path(__file__).parent
CLIENTS = (1, 32)
MIB = 1 << 20
BIG_BODY = b'{"data": "' + b"x" * (MIB - 12) + b'"}'
assert len(BIG_BODY) == MIB

DIRECT, MITM, PASS, RECORDED, REPLAYED = (
    "direct",
    "mitmdump",
    "sidecar pass-through",
    "sidecar recorded",
    "sidecar replayed",
)
MITM_BIG, PASS_BIG, RECORDED_BIG = (
    "mitmdump 1 MiB",
    "sidecar pass-through 1 MiB",
    "sidecar recorded 1 MiB",
)
FLOOR_PASS, FLOOR_RECORDED, FLOOR_REPLAYED, FLOOR_PASS_BIG, FLOOR_RECORDED_BIG = (
    "floor pass-through",
    "floor recorded",
    "floor replayed",
    "floor pass-through 1 MiB",
    "floor recorded 1 MiB",
)
VS = {
    PASS: MITM,
    RECORDED: PASS,
    REPLAYED: PASS,
    PASS_BIG: MITM_BIG,
    RECORDED_BIG: PASS_BIG,
    FLOOR_PASS: MITM,
    FLOOR_RECORDED: FLOOR_PASS,
    FLOOR_REPLAYED: FLOOR_PASS,
    FLOOR_PASS_BIG: MITM_BIG,
    FLOOR_RECORDED_BIG: FLOOR_PASS_BIG,
}

RESULTS: dict[tuple[str, int], Row] = {}


def mitmdump(root: Path, tag: str) -> Child:
    return Child(
        [
            str(Path(sys.executable).parent / "mitmdump"),
            "-q",
            "--listen-host",
            "127.0.0.1",
            "--listen-port",
            "0",
            "--set",
            f"confdir={root / 'mitm'}",
        ],
        stderr_path=root / f"mitmdump-{tag}.log",
    )


def floor(root: Path, upstream: str) -> Child:
    """The sidecar's engine with the floor addon (``_floor_proxy.py``): what a recorded
    effect costs at least with mitmproxy, aiohttp and SPEC §3's two durable writes."""
    return Child(
        [
            sys.executable,
            str(HERE / "_floor_proxy.py"),
            "--db",
            str(root / "floor.db"),
            "--upstream",
            upstream,
            "--confdir",
            str(root / "floor-ca"),
        ],
        stderr_path=root / "floor.log",
    )


def sidecar(root: Path, tag: str, upstream: str) -> Child:
    return Child.python(
        "sidecar",
        "serve",
        "--data-dir",
        str(root / f"sidecar-{tag}"),
        "--control-listen",
        "127.0.0.1:0",
        "--proxy-listen",
        "127.0.0.1:0",
        "--rules",
        str(HERE / "proxy-rules.yaml"),
        "--route",
        f"bench.test={upstream}",
        "--log-level",
        "warning",
        stderr_path=root / f"sidecar-{tag}.log",
    )


async def mitmdump_ready(mitm: Child, within: float = 30.0) -> int:
    """Poll until mitmdump's port accepts a connection; return the port."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if mitm.proc.poll() is not None:
            raise RuntimeError("mitmdump exited")
        if (port := listening_port(mitm.pid)) is not None:
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                pass
            else:
                writer.close()
                return port
        await asyncio.sleep(0.005)
    raise RuntimeError("mitmdump did not start listening")


async def sidecar_ready(
    side: Child, http: aiohttp.ClientSession, within: float = 60.0
) -> tuple[str, str]:
    """Wait for the sidecar's URLs on stdout, then poll /readyz until 200."""
    match = await asyncio.to_thread(side.wait_for, r"control=(\S+) proxy=(\S+)", within)
    control, proxy = match.group(1, 2)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            async with http.get(f"{control}/readyz") as r:
                if r.status == 200:
                    return control, proxy
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.005)
    raise RuntimeError("sidecar /readyz did not answer 200")


async def start_up(root: Path, rounds: int, upstream: str, http: aiohttp.ClientSession) -> dict[
    str, Sample
]:  # fmt: skip
    """Start each proxy ``rounds`` times, alternating which goes first; time to ready."""
    took = {MITM: Sample(), "sidecar": Sample(), "floor": Sample()}

    async def one(which: str, tag: str) -> None:
        began = time.perf_counter()
        # Each starts on the state of its first start, as a restarted proxy does: mitmdump
        # keeps its CA in one confdir, the sidecar its CA and store in one data dir.
        if which == MITM:
            child = mitmdump(root, tag)
        else:
            child = floor(root, upstream) if which == "floor" else sidecar(root, "start", upstream)
        with child:
            if which == MITM:
                await mitmdump_ready(child)
            elif which == "floor":
                await asyncio.to_thread(child.wait_for, r"floor ready (\S+)", 60.0)
            else:
                await sidecar_ready(child, http)
            took[which].add(time.perf_counter() - began)
            child.terminate()

    for round_ in range(rounds):
        order = [MITM, "sidecar", "floor"]
        for which in order if round_ % 2 == 0 else order[::-1]:
            await one(which, f"start{round_}")
    return took


async def measure(args: argparse.Namespace, root: Path, out: Output) -> None:
    upstream = Child.python("sidecar.testing.upstream", stderr_path=root / "upstream.log")
    up = upstream.wait_for(r"upstream ready (\S+)").group(1)
    figures = out.figures
    figures["fdatasync_p50_ms"] = fdatasync_p50_ms(root)
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as http:
        # Starts are cheap and their spread wide: three per round, for a median to trust.
        started = await start_up(root, 3 * args.rounds, up, http)
        figures["startup_s"] = {k: v.values for k, v in started.items()}
        mitm, side, least = mitmdump(root, "main"), sidecar(root, "main", up), floor(root, up)
        with upstream, mitm, side, least:
            mitm_url = f"http://127.0.0.1:{await mitmdump_ready(mitm)}"
            floor_url = least.wait_for(r"floor ready (\S+)").group(1)
            control, proxy = await sidecar_ready(side, http)
            await asyncio.sleep(1)
            idle = {
                MITM: rss_mib(mitm.pid),
                "sidecar": rss_mib(side.pid),
                "floor": rss_mib(least.pid),
            }
            figures["idle_rss_mib"] = idle
            async with http.post(
                f"{control}/v1/tasks/bench/claim", json={"worker": "b", "ttl_s": 3600}
            ) as r:
                claim = await r.json()
            # The proxy credentials that bind requests to the attempt, sent as clients
            # send them to an HTTP proxy: a Proxy-Authorization header on each request.
            auth = {"Proxy-Authorization": aiohttp.encode_basic_auth("bench", claim["attempt_id"])}
            ids = count()
            # Whose CPU each row is: the proxy it goes through (direct has none).
            pids = {name: mitm.pid for name in (MITM, MITM_BIG)}
            pids |= {name: side.pid for name in (PASS, RECORDED, REPLAYED, PASS_BIG, RECORDED_BIG)}
            floors = (
                FLOOR_PASS,
                FLOOR_RECORDED,
                FLOOR_REPLAYED,
                FLOOR_PASS_BIG,
                FLOOR_RECORDED_BIG,
            )
            pids |= {name: least.pid for name in floors}

            async def get(url: str, via: str | None = None) -> None:
                async with http.get(url, proxy=via, headers=auth if via == proxy else None) as r:
                    await r.read()

            async def post(url: str, body: bytes = b"{}", via: str | None = proxy) -> None:
                headers = {"Content-Type": "application/json"}
                if via == proxy:
                    headers |= auth
                async with http.post(url, data=body, proxy=via, headers=headers) as r:
                    assert r.status in (200, 201), f"{url}: {r.status} {await r.text()}"
                    await r.read()

            def new_effect(body: bytes = b"{}", via: str = proxy) -> Op:
                return lambda n: post(f"http://bench.test/effects/e{next(ids)}", body, via)

            for via in (proxy, floor_url):  # the one that is replayed
                await post("http://bench.test/effects/same", via=via)
            small: list[tuple[str, int, Op]] = []
            for clients in CLIENTS:
                small += [
                    (DIRECT, clients, lambda n: get(f"{up}/fast")),
                    (MITM, clients, lambda n: get(f"{up}/fast", mitm_url)),
                    (PASS, clients, lambda n: get("http://bench.test/fast", proxy)),
                    (RECORDED, clients, new_effect()),
                    (REPLAYED, clients, lambda n: post("http://bench.test/effects/same")),
                    (FLOOR_PASS, clients, lambda n: get("http://bench.test/fast", floor_url)),
                    (FLOOR_RECORDED, clients, new_effect(via=floor_url)),
                    (
                        FLOOR_REPLAYED,
                        clients,
                        lambda n: post("http://bench.test/effects/same", via=floor_url),
                    ),
                ]
            await interleaved(small, RESULTS, args, warm_clients=8, pids=pids)
            if args.growth:  # before the 1 MiB rows, whose freed buffers could hide growth
                figures["growth_rss_mib"] = await growth(side.pid, new_effect())

            big: list[tuple[str, int, Op]] = []
            for clients in CLIENTS:
                big += [
                    (MITM_BIG, clients, lambda n: post(f"{up}/upload", BIG_BODY, mitm_url)),
                    (PASS_BIG, clients, lambda n: post("http://bench.test/upload", BIG_BODY)),
                    (RECORDED_BIG, clients, new_effect(BIG_BODY)),
                    (
                        FLOOR_PASS_BIG,
                        clients,
                        lambda n: post("http://bench.test/upload", BIG_BODY, floor_url),
                    ),
                    (FLOOR_RECORDED_BIG, clients, new_effect(BIG_BODY, floor_url)),
                ]
            before = {MITM: rss_mib(mitm.pid), "sidecar": rss_mib(side.pid)}
            peak = dict(before)
            stop = asyncio.Event()

            async def watch() -> None:
                while not stop.is_set():
                    peak[MITM] = max(peak[MITM], rss_mib(mitm.pid))
                    peak["sidecar"] = max(peak["sidecar"], rss_mib(side.pid))
                    await asyncio.sleep(0.02)

            watcher = asyncio.create_task(watch())
            await interleaved(big, RESULTS, args, warm_clients=8, pids=pids)
            stop.set()
            await watcher
            figures["big_rss_mib"] = {"before": before, "peak": peak}


async def growth(pid: int, op: Op) -> dict[str, float]:
    """The sidecar's RSS after 10,000 and after 50,000 recorded effects (32 clients)."""
    rss: dict[str, float] = {}
    began = time.perf_counter()
    sent = 0
    for mark in (10_000, 50_000):
        numbers = iter(range(sent, mark))

        async def client(numbers: Iterator[int] = numbers) -> None:
            for n in numbers:
                await op(n)

        await asyncio.gather(*(client() for _ in range(32)))
        sent = mark
        rss[f"{mark}"] = rss_mib(pid)
        print(
            f"  growth: {mark:,} recorded effects, RSS {rss[f'{mark}']:.0f} MiB "
            f"({time.perf_counter() - began:.0f} s)",
            file=sys.stderr,
        )
    rss["per_second"] = 50_000 / (time.perf_counter() - began)
    return rss


def med(name: str, clients: int) -> Row:
    return RESULTS[(name, clients)]


def rps_vs(name: str, base: str, clients: int) -> Sample:
    """``name``'s req/s over ``base``'s, per round."""
    return paired(med(name, clients).rate.values, med(base, clients).rate.values)


def cpu_per_request(name: str, base: str, clients: int) -> str:
    """The proxy's CPU per request on both rows, e.g. ``CPU 2.70 / 1.12 ms``."""
    return f"CPU {med(name, clients).cpu_ms.median:.2f} / {med(base, clients).cpu_ms.median:.2f} ms"


def times(x: Sample) -> str:
    return f"{x.median:.2f}x ({x.spread('.2f')})"


def report(out: Output) -> None:
    f = out.figures
    print(
        "\n| path | clients | requests/s (median) | spread | p50 ms | p99 ms "
        "| proxy CPU ms/request | vs |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for (name, clients), row in RESULTS.items():
        base = VS.get(name)
        vs = f"{rps_vs(name, base, clients).median:.2f}x {base}" if base else ""
        cpu = f"{row.cpu_ms.median:.2f}" if row.cpu_ms.values else "-"
        print(
            f"| {name} | {clients} | {row.rate.median:,.0f} | {row.rate.spread()} | "
            f"{row.p50.median:.2f} | {row.p99.median:.2f} | {cpu} | {vs} |"
        )
    f["rows"] = {
        f"{name} c={clients}": {
            "rps": row.rate.values,
            "p50_ms": row.p50.values,
            "p99_ms": row.p99.values,
            "cpu_ms": row.cpu_ms.values,
        }
        for (name, clients), row in RESULTS.items()
    }
    idle, big = f["idle_rss_mib"], f["big_rss_mib"]
    start = {k: statistics.median(v) for k, v in f["startup_s"].items()}
    grow = {k: big["peak"][k] - big["before"][k] for k in (MITM, "sidecar")}
    print("\n| figure | mitmdump | sidecar | floor |")
    print("|---|---:|---:|---:|")
    print(
        f"| start-up to ready, s (median of {len(f['startup_s'][MITM])}) "
        f"| {start[MITM]:.2f} | {start['sidecar']:.2f} | {start['floor']:.2f} |"
    )
    print(f"| idle RSS, MiB | {idle[MITM]:.0f} | {idle['sidecar']:.0f} | {idle['floor']:.0f} |")
    print(f"| RSS growth over the 1 MiB rows, MiB | {grow[MITM]:.0f} | {grow['sidecar']:.0f} | - |")
    fsync = f["fdatasync_p50_ms"]
    print(f"\nos.fdatasync p50 on the data dir's disk: {fsync:.3f} ms")
    if g := f.get("growth_rss_mib"):
        print(
            f"sidecar RSS after 10,000 recorded effects {g['10000']:.0f} MiB, after 50,000 "
            f"{g['50000']:.0f} MiB ({g['per_second']:,.0f} effects/s)"
        )

    # ---- against the targets of issue 18, each beside the floor's figure for it ----
    for c in CLIENTS:
        x, fl = rps_vs(PASS, MITM, c), rps_vs(FLOOR_PASS, MITM, c)
        out.check(
            f"HTTP pass-through, small JSON, c={c}: req/s vs mitmdump",
            times(x),
            "≥ 0.95x",
            x.median >= 0.95,
            (times(fl), fl.median >= 0.95),
        )
        p99 = {name: med(name, c).p99 for name in (PASS, MITM, FLOOR_PASS)}
        p, fl = (paired(p99[n].values, p99[MITM].values) for n in (PASS, FLOOR_PASS))
        out.check(
            f"HTTP pass-through, small JSON, c={c}: p99 vs mitmdump",
            f"{p99[PASS].median:.2f} / {p99[MITM].median:.2f} ms, {times(p)}",
            "≤ 1.5x",
            p.median <= 1.5,
            (f"{p99[FLOOR_PASS].median:.2f} ms, {times(fl)}", fl.median <= 1.5),
        )
    rec, pas = med(RECORDED, 1).p50.median, med(PASS, 1).p50.median
    budget = pas + 2 * fsync + 0.3
    # The floor's budget is its own pass-through's p50 + the same allowance.
    least, least_pass = med(FLOOR_RECORDED, 1).p50.median, med(FLOOR_PASS, 1).p50.median
    least_budget = least_pass + 2 * fsync + 0.3
    out.check(
        "HTTP recorded effect, c=1: p50",
        f"{rec:.2f} ms (pass-through {pas:.2f}, fdatasync {fsync:.2f})",
        f"≤ {budget:.2f} ms (pass-through + 2 fdatasync + 0.3)",
        rec <= budget,
        (f"{least:.2f} ms vs ≤ {least_budget:.2f}", least <= least_budget),
    )
    x, fl = rps_vs(RECORDED, PASS, 32), rps_vs(FLOOR_RECORDED, FLOOR_PASS, 32)
    out.check(
        "HTTP recorded effect, c=32: req/s vs pass-through",
        f"{times(x)}; {cpu_per_request(RECORDED, PASS, 32)}",
        "≥ 0.85x",
        x.median >= 0.85,
        (f"{times(fl)}; {cpu_per_request(FLOOR_RECORDED, FLOOR_PASS, 32)}", fl.median >= 0.85),
    )
    for c in CLIENTS:
        x, fl = rps_vs(REPLAYED, PASS, c), rps_vs(FLOOR_REPLAYED, FLOOR_PASS, c)
        out.check(
            f"HTTP replayed effect, c={c}: req/s vs pass-through",
            f"{times(x)}; {cpu_per_request(REPLAYED, PASS, c)}",
            "≥ 1.2x",
            x.median >= 1.2,
            (f"{times(fl)}; {cpu_per_request(FLOOR_REPLAYED, FLOOR_PASS, c)}", fl.median >= 1.2),
        )
    for c in CLIENTS:
        # Each against its own pass-through, which streams the body (the floor as the
        # sidecar does): a base faster than mitmdump's buffered one (the row above it).
        x, fl = rps_vs(RECORDED_BIG, PASS_BIG, c), rps_vs(FLOOR_RECORDED_BIG, FLOOR_PASS_BIG, c)
        out.check(
            f"1 MiB recorded effect, c={c}: req/s vs 1 MiB pass-through",
            f"{times(x)}; {cpu_per_request(RECORDED_BIG, PASS_BIG, c)}",
            "≥ 0.7x",
            x.median >= 0.7,
            (
                f"{times(fl)}; {cpu_per_request(FLOOR_RECORDED_BIG, FLOOR_PASS_BIG, c)}",
                fl.median >= 0.7,
            ),
        )
    out.check(
        "1 MiB rows: RSS growth, sidecar vs mitmdump",
        f"{grow['sidecar']:.0f} vs {grow[MITM]:.0f} MiB",
        "≤ mitmdump + 50 MiB",
        grow["sidecar"] <= grow[MITM] + 50,
    )
    out.check(
        "sidecar idle RSS",
        f"{idle['sidecar']:.0f} MiB (mitmdump {idle[MITM]:.0f})",
        "≤ mitmdump + 15 MiB",
        idle["sidecar"] <= idle[MITM] + 15,
        (f"{idle['floor']:.0f} MiB", idle["floor"] <= idle[MITM] + 15),
    )
    x = paired(f["startup_s"]["sidecar"], f["startup_s"][MITM])
    fl = paired(f["startup_s"]["floor"], f["startup_s"][MITM])
    out.check(
        "start-up to /readyz 200 vs mitmdump's port",
        f"{start['sidecar']:.2f} / {start[MITM]:.2f} s, {times(x)}",
        "≤ 1.2x",
        x.median <= 1.2,
        (f"{start['floor']:.2f} s to listening, {times(fl)}", fl.median <= 1.2),
    )
    if g := f.get("growth_rss_mib"):
        d = g["50000"] - g["10000"]
        out.check(
            "growth: RSS 10k → 50k recorded effects",
            f"{g['10000']:.0f} → {g['50000']:.0f} MiB ({d:+.0f})",
            "≤ +20 MiB",
            d <= 20,
        )
    out.print_checks()


def main() -> None:
    options = parser(__doc__, seconds=2.0, warm_up=0.5)
    options.add_argument("--growth", action="store_true", help="RSS after 10k and 50k effects")
    args = options.parse_args()
    run("proxy", args, lambda tmp, out: measure(args, tmp, out), report)


if __name__ == "__main__":
    main()
