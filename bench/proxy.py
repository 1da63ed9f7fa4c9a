"""Benchmark: the HTTP data path, direct vs plain mitmproxy vs the sidecar, in one run.

    ./run bench proxy [--seconds 3]

Real processes on loopback: the counting upstream (``sidecar.testing.upstream``), a
plain ``mitmdump`` (default addons, nothing of ours), and ``sidecar serve`` with one
rule (bench/proxy-rules.yaml).  An aiohttp client drives each path at concurrency 1 and
32 over plain HTTP (so TLS costs are not measured, the proxies' own work is):

* direct                 GET /fast straight to the upstream;
* mitmproxy              GET /fast through mitmdump;
* sidecar pass-through   GET /fast through the sidecar (no rule matches);
* sidecar recorded       POST /effects/{new id}: record pending, forward, record answer;
* sidecar replayed       POST /effects/{same id}: answered from the log.

Then resident memory: both proxies idle, the sidecar after 10,000 requests, and the
sidecar's growth while 1 MiB bodies stream through it at concurrency 32.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from itertools import count
from pathlib import Path

import aiohttp

from sidecar.testing.processes import Child

HERE = Path(__file__).parent
ROWS: list[tuple[str, int, float, float, float]] = []


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def drive(
    name: str, clients: int, seconds: float, op: Callable[[int], Awaitable[None]]
) -> None:
    latencies: list[float] = []
    numbers = count()
    deadline = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            await op(next(numbers))
            latencies.append(time.perf_counter() - started)

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - began
    ordered = sorted(latencies)
    p99 = ordered[max(0, int(len(ordered) * 0.99) - 1)]
    ROWS.append(
        (name, clients, len(ordered) / elapsed, statistics.median(ordered) * 1e3, p99 * 1e3)
    )
    print(f"  {name:<24} c={clients:<3} {len(ordered) / elapsed:>8,.0f}/s", file=sys.stderr)


async def measure(seconds: float, root: Path) -> dict[str, float]:
    upstream = Child.python("sidecar.testing.upstream", stderr_path=root / "upstream.log")
    up = upstream.wait_for(r"upstream ready (\S+)").group(1)
    mitm = Child(
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
        stderr_path=root / "mitmdump.log",
    )
    sidecar = Child.python(
        "sidecar",
        "serve",
        "--data-dir",
        str(root / "sidecar"),
        "--control-listen",
        "127.0.0.1:0",
        "--proxy-listen",
        "127.0.0.1:0",
        "--rules",
        str(HERE / "proxy-rules.yaml"),
        "--route",
        f"bench.test={up}",
        "--log-level",
        "warning",
        stderr_path=root / "sidecar.log",
    )
    memory: dict[str, float] = {}
    with upstream, mitm, sidecar:
        control, proxy = sidecar.wait_for(r"control=(\S+) proxy=(\S+)").group(1, 2)
        mitm_port = await _mitmdump_port(mitm)
        mitm_url = f"http://127.0.0.1:{mitm_port}"
        connector = aiohttp.TCPConnector(limit=64)
        async with aiohttp.ClientSession(connector=connector) as http:
            async with http.post(
                f"{control}/v1/tasks/bench/claim", json={"worker": "b", "ttl_s": 3600}
            ) as r:
                claim = await r.json()
            # The proxy credentials that bind requests to the attempt, sent as clients
            # send them to an HTTP proxy: a Proxy-Authorization header on each request.
            auth = {"Proxy-Authorization": aiohttp.encode_basic_auth("bench", claim["attempt_id"])}
            await asyncio.sleep(1)
            memory["mitmproxy idle"] = rss_mib(mitm.pid)
            memory["sidecar idle"] = rss_mib(sidecar.pid)

            async def get(url: str, via: str | None = None) -> None:
                async with http.get(url, proxy=via, headers=auth if via == proxy else None) as r:
                    await r.read()

            async def post(url: str) -> None:
                async with http.post(url, data=b"{}", proxy=proxy, headers=auth) as r:
                    assert r.status == 201, await r.text()
                    await r.read()

            await post("http://bench.test/effects/same")  # the one that is replayed
            for clients in (1, 32):
                await drive("direct", clients, seconds, lambda n: get(f"{up}/fast"))
                await drive("mitmproxy", clients, seconds, lambda n: get(f"{up}/fast", mitm_url))
                await drive(
                    "sidecar pass-through",
                    clients,
                    seconds,
                    lambda n: get("http://bench.test/fast", proxy),
                )
                await drive(
                    "sidecar recorded",
                    clients,
                    seconds,
                    lambda n, c=clients: post(f"http://bench.test/effects/{c}-{n}"),
                )
                await drive(
                    "sidecar replayed",
                    clients,
                    seconds,
                    lambda n: post("http://bench.test/effects/same"),
                )
            done = count()

            async def filler() -> None:
                while next(done) < 10_000:
                    await get("http://bench.test/fast", proxy)

            await asyncio.gather(*(filler() for _ in range(32)))
            memory["sidecar after 10,000 requests"] = rss_mib(sidecar.pid)
            before, peak = rss_mib(sidecar.pid), 0.0
            body = b"x" * (1 << 20)

            async def upload() -> None:
                async with http.post(
                    "http://bench.test/upload", data=body, proxy=proxy, headers=auth
                ) as r:
                    await r.read()

            async def watch(stop: asyncio.Event) -> None:
                nonlocal peak
                while not stop.is_set():
                    peak = max(peak, rss_mib(sidecar.pid))
                    await asyncio.sleep(0.02)

            stop = asyncio.Event()
            watcher = asyncio.create_task(watch(stop))
            for _ in range(8):
                await asyncio.gather(*(upload() for _ in range(32)))
            stop.set()
            await watcher
            memory["sidecar growth, 256 x 1 MiB uploads at c=32"] = peak - before
    return memory


def listening_port(pid: int) -> int | None:
    """The TCP port process ``pid`` listens on, read from /proc (mitmdump -q prints none)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
            return int(fields[1].split(":")[1], 16)
    return None


async def _mitmdump_port(mitm: Child) -> int:
    for _ in range(200):
        if (port := listening_port(mitm.pid)) is not None:
            return port
        await asyncio.sleep(0.05)
    raise RuntimeError("mitmdump did not start listening")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-proxy-") as tmp:
        memory = asyncio.run(measure(args.seconds, Path(tmp)))
    by = {(n, c): (rps, p50) for n, c, rps, p50, _ in ROWS}
    print("\n| path | clients | requests/s | p50 ms | p99 ms | vs |")
    print("|---|---:|---:|---:|---:|---|")
    for name, clients, rps, p50, p99 in ROWS:
        base = {
            "sidecar pass-through": "mitmproxy",
            "sidecar recorded": "sidecar pass-through",
            "sidecar replayed": "sidecar pass-through",
        }.get(name)
        ratio = f"{rps / by[(base, clients)][0]:.2f}x {base}" if base else ""
        print(f"| {name} | {clients} | {rps:,.0f} | {p50:.2f} | {p99:.2f} | {ratio} |")
    print("\n| resident memory | MiB |")
    print("|---|---:|")
    for name, mib in memory.items():
        print(f"| {name} | {mib:.0f} |")


if __name__ == "__main__":
    main()
