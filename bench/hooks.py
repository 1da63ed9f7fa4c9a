"""Benchmark: the sidecar's own work per HTTP flow, side by side with the floor's, with
neither mitmproxy nor a socket of the agent's in between.

    ./run bench hooks [--requests 3000] [--rounds 3] [--row pass-through|recorded|replayed]

``bench proxy`` measures whole proxies: there the sidecar's own work is mixed with
mitmproxy's, which both pay, and its figures move with the load tool and the loopback.
Here the two addons are called the way mitmproxy calls them, and nothing else runs:

* the sidecar: the addons ``sidecar serve`` puts in mitmproxy's chain
  (``serve.server.proxy_addons``: the readiness gate, the task binder, the effect addon,
  uncovered writes, the router, the tunnel counter), behind one ``HookDispatch`` as
  served, over a SQLite store (``synchronous=FULL``) and bench/proxy-rules.yaml, task
  ``bench`` claimed, its credentials in each request as the agent sends them;
* the floor: ``_floor_proxy.py``'s addon (the least SPEC §3 asks: a dict for replays, a
  pending and a completed row group-committed to sqlite3, an aiohttp client), behind a
  ``HookDispatch`` too, as the floor proxy embeds it.

Each is given mitmproxy's own test flows (``mitmproxy.test.tflow``, built before the
clock starts) and their hooks called in mitmproxy's order - requestheaders, request,
then (a test answer put in for a flow neither answers, as mitmproxy's upstream would)
responseheaders and response - what a hook returns awaited.  Three rows:

* pass-through   GET /fast to bench.test: no rule records it (routed, streamed);
* recorded       POST /effects/{new id}: recorded, forwarded to the counting upstream
                 (``sidecar.testing.upstream``, a process of its own), answer recorded;
* replayed       POST /effects/same: answered from what was recorded.

Figure: this process's CPU per flow (every thread: the store's writer and the forwarding
client included; the upstream's is not), the two sides alternated in ``--rounds``
rounds, the order reversed every other one; median and min-max over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import inspect
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _floor_proxy import SCHEMA, Floor, forwarding_client
from _group_commit import GroupCommitter, open_db
from mitmproxy import http
from mitmproxy.test import tflow, tutils
from yarl import URL

from sidecar.config import load
from sidecar.proxy.addons.gate import ReadinessGate
from sidecar.proxy.dispatch import HookDispatch
from sidecar.proxy.guard import EffectGuard
from sidecar.proxy.routes import Routes
from sidecar.proxy.upstream import Upstream
from sidecar.recording.bindings import Bindings
from sidecar.rules import load_rules
from sidecar.runtime.clock import SystemClock
from sidecar.runtime.metrics import Metrics
from sidecar.serve.server import proxy_addons
from sidecar.store import create_store
from sidecar.store.base import CompositeObserver
from sidecar.store.observed import MetricsObserver
from sidecar.testing.processes import Child

HERE = Path(__file__).parent
ROWS = ("pass-through", "recorded", "replayed")
#: The hooks mitmproxy calls for each HTTP flow, in order; the answer comes in between.
ASKED, ANSWERED = ("requestheaders", "request"), ("responseheaders", "response")


class Side:
    """One proxy's addons, behind a HookDispatch, and the flows it is given."""

    def __init__(self, name: str, dispatch: HookDispatch, headers: dict[str, str]) -> None:
        self.name = name
        self.dispatch = dispatch
        self.headers = headers
        self.ids = iter(range(sys.maxsize))

    def flow(self, row: str) -> http.HTTPFlow:
        if row == "pass-through":
            request = http.Request.make("GET", "http://bench.test/fast", b"", self.headers)
        else:
            name = "same" if row == "replayed" else f"e{next(self.ids)}"
            url = f"http://bench.test/effects/{name}"
            headers = {"Content-Type": "application/json", **self.headers}
            request = http.Request.make("POST", url, b"{}", headers)
        flow = tflow.tflow(req=request)
        flow.response = None
        return flow

    async def run(self, flow: http.HTTPFlow, answer: http.Response) -> None:
        await self._hooks(ASKED, flow)
        if flow.response is None:  # not answered by the addon: mitmproxy forwards it
            flow.response = answer
        elif flow.response.status_code not in (200, 201):
            raise SystemExit(f"{self.name}: {flow.response.status_code} {flow.response.text}")
        await self._hooks(ANSWERED, flow)

    async def _hooks(self, names: tuple[str, ...], flow: http.HTTPFlow) -> None:
        for name in names:
            hook: Callable[..., Any] | None = getattr(self.dispatch, name, None)
            outcome = None if hook is None else hook(flow)
            if outcome is not None and inspect.isawaitable(outcome):
                await outcome


async def sidecar_side(root: Path, upstream: str) -> tuple[Side, Callable[[], Any]]:
    """The sidecar's addons as ``sidecar serve`` builds them, task ``bench`` claimed."""
    settings = load({})
    rules = load_rules([HERE / "proxy-rules.yaml"])
    routes = Routes.parse([f"bench.test={upstream}"])
    store = create_store(f"sqlite:///{root}/effects.db")
    await store.open()
    metrics, clock = Metrics(), SystemClock()
    bindings = Bindings(store, clock, margin_s=settings.self_fence_margin_s)
    store.observer = CompositeObserver(MetricsObserver(metrics), bindings)
    client = Upstream(routes)
    await client.start()
    guard = EffectGuard(store, bindings, client, clock, metrics, store_retry_s=5.0)
    gate = ReadinessGate()
    gate.open()
    addons = proxy_addons(settings, rules, routes, guard, metrics, gate)
    claim = await store.claim("bench", "bench", 3600)
    credentials = base64.b64encode(f"bench:{claim.attempt_id}".encode()).decode()
    side = Side("sidecar", HookDispatch(*addons), {"Proxy-Authorization": f"Basic {credentials}"})

    async def close() -> None:
        await client.close()
        await store.close()

    return side, close


async def floor_side(root: Path, upstream: str) -> tuple[Side, Callable[[], Any]]:
    commits = GroupCommitter(open_db(root / "floor.db", SCHEMA))
    commits.start()
    client = forwarding_client()
    side = Side("floor", HookDispatch(Floor(commits, client, URL(upstream))), {})

    async def close() -> None:
        await client.close()
        commits.stop()

    return side, close


async def cpu_per_flow(side: Side, row: str, requests: int) -> tuple[float, float]:
    """CPU microseconds per flow of ``row`` (flows built beforehand): of this process, and
    of it the event loop's thread."""
    flows = [(side.flow(row), tutils.tresp()) for _ in range(requests)]
    process, loop = time.process_time(), time.thread_time()
    for flow, answer in flows:
        await side.run(flow, answer)
    process, loop = time.process_time() - process, time.thread_time() - loop
    return process / requests * 1e6, loop / requests * 1e6


type Results = dict[tuple[str, str], list[tuple[float, float]]]


async def measure(args: argparse.Namespace, root: Path) -> Results:
    upstream = Child.python("sidecar.testing.upstream", stderr_path=root / "upstream.log")
    with upstream:
        url = upstream.wait_for(r"upstream ready (\S+)", 30.0)[1]
        sidecar, close_sidecar = await sidecar_side(root, url)
        floor, close_floor = await floor_side(root, url)
        sides = [sidecar, floor]
        results: Results = {}
        try:
            for side in sides:  # warm-up: connections, caches, the replayed id recorded
                for row in ROWS:
                    await cpu_per_flow(side, row, 200)
            for round_ in range(args.rounds):
                for row in args.rows:
                    for side in sides if round_ % 2 == 0 else sides[::-1]:
                        cpu, loop = await cpu_per_flow(side, row, args.requests)
                        results.setdefault((row, side.name), []).append((cpu, loop))
                        print(
                            f"round {round_ + 1} {row:12s} {side.name:7s} {cpu:7.1f} us "
                            f"({loop:.1f} on the loop's thread)"
                        )
        finally:
            await close_sidecar()
            await close_floor()
    return results


def report(results: Results, rows: tuple[str, ...]) -> None:
    """Per row and side: the median CPU per flow (min-max over rounds) and, after "/",
    the median of it on the event loop's thread (the rest is the store's writer thread
    and the threads the default executor runs); then the median per-round difference."""
    print()
    print("| flow | sidecar: CPU per flow / on the loop | floor | sidecar - floor |")
    print("|---|---:|---:|---:|")
    for row in rows:
        mine, floor = results[(row, "sidecar")], results[(row, "floor")]
        gap = statistics.median(m[0] - f[0] for m, f in zip(mine, floor, strict=True))
        print(f"| {row} | {_figure(mine)} | {_figure(floor)} | {gap:+.1f} µs |")


def _figure(rounds: list[tuple[float, float]]) -> str:
    cpu = [c for c, _ in rounds]
    loop = statistics.median(lp for _, lp in rounds)
    return f"{statistics.median(cpu):.1f} µs ({min(cpu):.0f}-{max(cpu):.0f}) / {loop:.1f}"


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    options.add_argument("--requests", type=int, default=3000, help="flows per row, side, round")
    options.add_argument("--rounds", type=int, default=3)
    options.add_argument(
        "--row", dest="rows", action="append", choices=ROWS, help="only this row (repeatable)"
    )
    args = options.parse_args()
    args.rows = tuple(args.rows or ROWS)
    with tempfile.TemporaryDirectory(prefix="bench-hooks-") as scratch:
        report(asyncio.run(measure(args, Path(scratch))), args.rows)


if __name__ == "__main__":
    main()
