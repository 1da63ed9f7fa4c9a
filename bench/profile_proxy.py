"""Profile: where the sidecar's CPU goes on one row of ``bench proxy``, by component.

    ./run bench profile_proxy [--row recorded|replayed|pass-through|recorded-1mib]
                              [--clients 1] [--requests 3000] [--rate 400] [--raw PATH]
                              [--proxy sidecar|floor]

Starts the counting upstream and ``sidecar serve`` as ``bench proxy`` does (its rule
file, its route), drives ``--requests`` requests of the row from ``--clients`` clients
after 100 warm-up ones, and samples the sidecar meanwhile with ``py-spy record --gil``:
only the thread holding the GIL is sampled, so a sample is CPU spent in Python (a thread
blocked in a system call or waiting for a core is not counted; in gVisor py-spy would
otherwise count idle threads as busy).  Prints the sidecar's CPU per request (from
/proc, all threads) and each component's share of the samples and its milliseconds per
request:

* mitmproxy and asyncio - the proxy engine: connections, HTTP/1 parsing and body
  buffering, its layers and hook dispatch, the event loop - every sample with no frame of
  the sidecar's own below mitmproxy's hook call (mitmproxy as the sidecar embeds it - its
  hook dispatcher, the body limit's wrappers around two of its HTTP states - counts as
  the engine: the floor embeds it the same way);
* own effect path - the sidecar's rules, binding, guard, addons, and the library calls
  they make (building the answer, parsing headers), the JSON work of the fingerprint
  apart; for the floor, its addon;
* JSON canonical body - ``json`` parsing and dumping the body for the fingerprint (and
  the request summary);
* forwarding client - aiohttp sending a recorded effect upstream (``proxy/upstream.py``);
* store, event-loop side - the store's calls, batching and the hop to its writer;
* store writer thread - building rows and SQLite (its ``COMMIT`` waits on the disk
  without the GIL, so it is not in these samples).

Then the 15 functions of the sidecar's own with the most samples below them.

``--proxy floor`` profiles the floor proxy (``bench/_floor_proxy.py``, as ``bench proxy``
runs it) on the same row instead, its own code (the addon and its group commit) in
place of the sidecar's, in the same components: what the engine costs the floor, next
to what it costs the sidecar, is how a gap is told to be the engine's or the sidecar's.
py-spy comes with the dev install (pyproject.toml).  Compare components of one run
(or of two runs close together); the ms figures move with the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from itertools import count
from pathlib import Path

import aiohttp
from _common import cpu_seconds, minor_faults
from proxy import BIG_BODY, floor, sidecar, sidecar_ready

from sidecar.testing.processes import Child

ROWS = ("recorded", "replayed", "pass-through", "recorded-1mib")
COMPONENTS = (
    "mitmproxy and asyncio",
    "own effect path",
    "JSON canonical body",
    "forwarding client (aiohttp)",
    "store, event-loop side",
    "store writer thread",
)


#: The floor's own files (run as a script, py-spy names them without a folder): its addon
#: and its group commit.
FLOOR_FILES = ("(_floor_proxy.py)", "(_group_commit.py)")
#: The floor's functions that start it and run the loop: below everything, no one's work.
FLOOR_ENTRY = ("<module> ", "main ", "serve ")
#: What both proxies run as the engine: mitmproxy embedded, its hooks dispatched and two
#: of its HTTP states wrapped for the body limit (the floor embeds it the same way).
EMBEDDING = ("sidecar/proxy/body_limit.py", "sidecar/proxy/embed.py", "sidecar/proxy/dispatch.py")


def is_ours(frame: str) -> bool:
    """A frame of the profiled proxy's own code: the sidecar's below its command line
    (which runs the loop), or the floor's below its entry point."""
    if any(name in frame for name in FLOOR_FILES):
        return not frame.startswith(FLOOR_ENTRY)
    return "sidecar/" in frame and "sidecar/cli/" not in frame and "sidecar/__main__" not in frame


def component(frames: list[str]) -> str:
    """Which component one sampled stack (outermost frame first) counts for."""
    if "MainThread" not in frames[0]:  # py-spy's first "frame" names the thread
        return "store writer thread"  # the only other thread that runs Python
    ours = [f for f in frames if is_ours(f) and not any(name in f for name in EMBEDDING)]
    if not ours:
        return "mitmproxy and asyncio"
    below = frames[frames.index(ours[0]) :]
    if any("aiohttp/" in f or "Upstream.send" in f for f in below):
        return "forwarding client (aiohttp)"
    store = ("sidecar/store/", "Recorder.durably", "(_group_commit.py)")
    if any(name in f for f in below for name in store):
        return "store, event-loop side"
    if any(f.startswith(("loads (json/", "dumps (json/")) for f in below):
        return "JSON canonical body"
    return "own effect path"


def read_samples(raw: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw output: one ``thread;frame;frame... count`` line per distinct stack."""
    samples = []
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        samples.append(([re.sub(r":\d+\)$", ")", f) for f in stack.split(";")], int(n)))
    return samples


def report(
    samples: list[tuple[list[str], int]], requests: int, rate: int, cpu_ms: float, who: str
) -> None:
    per_sample_ms = 1000 / rate
    total = sum(n for _, n in samples) or 1
    by_component: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    for frames, n in samples:
        by_component[component(frames)] += n
        for f in {f for f in frames if is_ours(f)}:
            by_function[f] += n
    print(f"\n{who} CPU per request (/proc, all threads): {cpu_ms:.3f} ms")
    print(f"GIL-held samples: {total} at {rate}/s over {requests} requests\n")
    print("| component | share of samples | ms per request |")
    print("|---|---:|---:|")
    for name in COMPONENTS:
        n = by_component[name]
        print(f"| {name} | {n / total:.1%} | {n * per_sample_ms / requests:.3f} |")
    print(f"\n| the {who}'s own function (inclusive) | ms per request |")
    print("|---|---:|")
    for name, n in by_function.most_common(15):
        print(f"| {name} | {n * per_sample_ms / requests:.3f} |")


async def profile(args: argparse.Namespace, root: Path) -> None:
    upstream = Child.python("sidecar.testing.upstream", stderr_path=root / "upstream.log")
    up = upstream.wait_for(r"upstream ready (\S+)").group(1)
    side = floor(root, up) if args.proxy == "floor" else sidecar(root, "profile", up)
    with upstream, side:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as http:
            proxy, auth = await attach(args.proxy, side, http)
            op = row_op(args.row, http, proxy, auth)
            await op()  # the effect replayed is recorded first
            await many(op, 100, args.clients)
            raw = root / "profile.raw"
            spy = subprocess.Popen(  # noqa: ASYNC220 - py-spy runs beside us until stopped
                [spy_binary(), "record", "--gil", "--threads", "--format", "raw",
                 "--rate", str(args.rate), "--output", str(raw), "--pid", str(side.pid)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
            await asyncio.sleep(1.0)  # attached before the first request is timed
            began, faulted = cpu_seconds(side.pid), minor_faults(side.pid)
            await many(op, args.requests, args.clients)
            cpu_ms = (cpu_seconds(side.pid) - began) / args.requests * 1e3
            faults = (minor_faults(side.pid) - faulted) / args.requests
            spy.send_signal(signal.SIGINT)
            await asyncio.to_thread(spy.wait, 60)
    if args.raw:
        shutil.copyfile(raw, args.raw)
    report(read_samples(raw), args.requests, args.rate, cpu_ms, args.proxy)
    print(f"{args.proxy} minor page faults per request: {faults:.0f}")


async def attach(
    which: str, side: Child, http: aiohttp.ClientSession
) -> tuple[str, dict[str, str]]:
    """The started proxy's URL, and the credentials its effects are sent with: the
    sidecar's bind them to an attempt of task ``bench`` (claimed here); the floor has none."""
    if which == "floor":
        return (await asyncio.to_thread(side.wait_for, r"floor ready (\S+)", 60.0)).group(1), {}
    control, proxy = await sidecar_ready(side, http)
    async with http.post(
        f"{control}/v1/tasks/bench/claim", json={"worker": "b", "ttl_s": 3600}
    ) as r:
        attempt = (await r.json())["attempt_id"]
    return proxy, {"Proxy-Authorization": aiohttp.encode_basic_auth("bench", attempt)}


def row_op(
    row: str, http: aiohttp.ClientSession, proxy: str, auth: dict[str, str]
) -> Callable[[], Awaitable[None]]:
    ids = count()
    headers = {"Content-Type": "application/json", **auth}

    async def call() -> None:
        if row == "pass-through":
            request = http.get("http://bench.test/fast", proxy=proxy, headers=headers)
        else:
            name = "same" if row == "replayed" else f"e{next(ids)}"
            body = BIG_BODY if row == "recorded-1mib" else b"{}"
            url = f"http://bench.test/effects/{name}"
            request = http.post(url, data=body, proxy=proxy, headers=headers)
        async with request as r:
            assert r.status in (200, 201), f"{row}: {r.status} {await r.text()}"
            await r.read()

    return call


async def many(op: Callable[[], Awaitable[None]], requests: int, clients: int) -> None:
    left = iter(range(requests))

    async def client() -> None:
        for _ in left:
            await op()

    await asyncio.gather(*(client() for _ in range(clients)))


def spy_binary() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: ./run bench installs the dev extras")
    return found


def main() -> None:
    options = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    options.add_argument("--row", choices=ROWS, default="recorded")
    options.add_argument("--clients", type=int, default=1)
    options.add_argument("--requests", type=int, default=3000)
    options.add_argument("--rate", type=int, default=400, help="py-spy samples per second")
    options.add_argument("--raw", help="also keep py-spy's stacks (its raw format) here")
    options.add_argument("--proxy", choices=("sidecar", "floor"), default="sidecar")
    args = options.parse_args()
    if args.row == "recorded-1mib":
        args.requests = min(args.requests, 300)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        asyncio.run(profile(args, Path(tmp)))
    print(f"\nruntime: {time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
