"""Helpers the benchmarks share (not a benchmark itself; ``bench/all.py`` skips it).

* ``Sample`` / ``spread``: one figure per round, reported as the median and min-max;
* ``Check``: one line of ``./run bench all``'s table (path, figure, target, met?), which
  every benchmark writes with ``--json PATH`` next to its rows;
* ``rss_mib``, ``cpu_seconds``, ``listening_port``, ``fdatasync_p50_ms``: what the benches
  read from /proc and the disk;
* ``drive`` / ``interleaved`` / ``Row``: closed-loop clients over an operation, rounds of
  cases interleaved (order reversed every other round), with the CPU the process under
  test spent per call when its pid is given;
* ``parser`` / ``run``: the options every timed benchmark takes (``--seconds``,
  ``--rounds``, ``--json``) and its main: measure in a scratch directory, report, write.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from itertools import count
from pathlib import Path
from typing import Any

#: One operation of a benchmark's client; its argument numbers the calls.
Op = Callable[[int], Awaitable[object]]


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values``, nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(len(ordered) * q) - 1)]


@dataclass
class Sample:
    """One figure measured once per round: its median and spread."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(value)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def spread(self, fmt: str = ",.0f") -> str:
        """``min-max`` of the rounds, e.g. ``480-530``."""
        if not self.values:
            return "-"
        return f"{min(self.values):{fmt}}-{max(self.values):{fmt}}"


@dataclass(frozen=True)
class Check:
    """One figure against its target, as ``./run bench all`` prints it, and the floor's.

    The floor is what the same path costs with nothing of the sidecar's in it: the
    engines and the least SPEC §3 asks of any design (``_floor_proxy.py``,
    ``bare_relay.py --durable``, ``group_commit_server.py --fenced``), or the reference
    a target is set against (the bare relay for pass-through).  A target the floor
    misses too is out of the sidecar's reach on that machine; one the floor meets and
    the sidecar misses is the sidecar's own gap."""

    path: str
    figure: str
    target: str
    met: bool | None  # None: a figure to report, with no pass mark
    floor: str | None = None  # the floor's figure for the same target; None: no floor
    floor_met: bool | None = None


@dataclass
class Output:
    """What a benchmark writes with ``--json``: its checks and its raw figures."""

    bench: str
    checks: list[Check] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def check(
        self,
        path: str,
        figure: str,
        target: str,
        met: bool | None,
        floor: tuple[str, bool] | None = None,
    ) -> None:
        """One line; ``floor`` is the floor's figure and whether it meets the target."""
        self.checks.append(
            Check(
                path,
                figure,
                target,
                None if met is None else bool(met),
                None if floor is None else floor[0],
                None if floor is None else bool(floor[1]),
            )
        )

    def print_checks(self) -> None:
        print_table([asdict(c) for c in self.checks])

    def write(self, path: str | None) -> None:
        if path:
            Path(path).write_text(
                json.dumps(
                    {
                        "bench": self.bench,
                        "checks": [asdict(c) for c in self.checks],
                        "figures": self.figures,
                    },
                    indent=1,
                )
            )


def met_text(met: bool | None) -> str:
    return "-" if met is None else "yes" if met else "no"


def print_table(checks: list[dict[str, Any]]) -> None:
    """The checks as one table, then how many are met, and of those not met, whose gap
    each is: the floor's too (the engines' on this machine) or the sidecar's own."""
    print("| path | figure | target | met? | floor: figure, met? |")
    print("|---|---|---|---|---|")
    for c in checks:
        floor = "-" if c.get("floor") is None else f"{c['floor']}: {met_text(c['floor_met'])}"
        print(f"| {c['path']} | {c['figure']} | {c['target']} | {met_text(c['met'])} | {floor} |")
    marked = [c for c in checks if c["met"] is not None]
    missed = [c for c in marked if not c["met"]]
    print(f"\n{len(marked) - len(missed)} of {len(marked)} targets met")
    if missed:
        engines = sum(c.get("floor_met") is False for c in missed)
        ours = sum(c.get("floor_met") is True for c in missed)
        print(
            f"of the {len(missed)} not met: {engines} missed by the floor too (the engines' "
            f"bound on this machine), {ours} met by the floor (the sidecar's own gap), "
            f"{len(missed) - engines - ours} without a floor"
        )


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _stat(pid: int) -> list[str]:
    """``/proc/PID/stat`` from its third field on (after the command name's ")")."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) process ``pid`` has used so far."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def minor_faults(pid: int) -> int:
    """Minor page faults process ``pid`` has taken so far (all threads): pages it touched
    for the first time, e.g. a large buffer freshly mapped for each request."""
    return int(_stat(pid)[7])


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


def fdatasync_p50_ms(directory: Path, times: int = 200) -> float:
    """Median of ``times`` (write 512 bytes + os.fdatasync) on a small file in ``directory``:
    what one durable commit costs at least on that disk."""
    path = directory / "fdatasync-probe"
    took: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for i in range(times):
            os.pwrite(fd, b"x" * 512, (i % 8) * 512)
            started = time.perf_counter()
            os.fdatasync(fd)
            took.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    return statistics.median(took) * 1e3


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def paired(a: list[float], b: list[float]) -> Sample:
    """Per-round ratios ``a[i] / b[i]`` of two figures measured side by side in each round:
    steadier than the ratio of their medians when the machine's load moves between rounds
    (both sides of a pair ran seconds apart)."""
    return Sample([ratio(x, y) for x, y in zip(a, b, strict=True)])


@dataclass
class Row:
    """One case's figures, a value per round."""

    rate: Sample = field(default_factory=Sample)
    p50: Sample = field(default_factory=Sample)
    p99: Sample = field(default_factory=Sample)
    # CPU ms the process under test spent per call: steadier than the rate on a busy
    # machine, since time the process waited for a core does not count.
    cpu_ms: Sample = field(default_factory=Sample)


async def drive(clients: int, seconds: float, op: Op) -> tuple[float, float, float, int]:
    """Run ``op`` from ``clients`` closed-loop clients for ``seconds``: (calls/s, p50 ms,
    p99 ms, calls)."""
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
    return (
        len(latencies) / elapsed,
        statistics.median(latencies) * 1e3,
        percentile(latencies, 0.99) * 1e3,
        len(latencies),
    )


async def interleaved(
    cases: list[tuple[str, int, Op]],
    results: dict[tuple[str, int], Row],
    args: argparse.Namespace,
    *,
    warm_clients: int | None = None,
    pids: dict[str, int] | None = None,
) -> None:
    """A warm-up of ``args.warm_up`` seconds per case (with at most ``warm_clients``
    clients), then ``args.rounds`` rounds of ``args.seconds`` per case, the order reversed
    every other round; each round's figures are added to ``results[(name, clients)]``.
    ``pids`` names the process under test of a case (by its name), whose CPU per call
    is then measured too."""
    width = max(len(name) for name, _, _ in cases)
    for _name, clients, op in cases:
        await drive(min(clients, warm_clients or clients), args.warm_up, op)
    for round_ in range(args.rounds):
        for name, clients, op in cases if round_ % 2 == 0 else cases[::-1]:
            pid = (pids or {}).get(name)
            cpu_before = cpu_seconds(pid) if pid else 0.0
            rate, p50, p99, calls = await drive(clients, args.seconds, op)
            row = results.setdefault((name, clients), Row())
            row.rate.add(rate)
            row.p50.add(p50)
            row.p99.add(p99)
            cpu = ""
            if pid and calls:
                row.cpu_ms.add((cpu_seconds(pid) - cpu_before) / calls * 1e3)
                cpu = f"  cpu {row.cpu_ms.values[-1]:.2f} ms/call"
            print(
                f"  round {round_ + 1}  {name:<{width}} c={clients:<3} {rate:>9,.0f}/s  "
                f"p50 {p50:6.2f} ms{cpu}",
                file=sys.stderr,
            )


def parser(
    doc: str | None,
    *,
    seconds: float,
    seconds_help: str = "per row and round",
    rounds_help: str = "interleaved rounds (median)",
    warm_up: float | None = None,
) -> argparse.ArgumentParser:
    """The options of a timed benchmark: ``--seconds``, ``--rounds``, ``--json`` and, given
    a default, ``--warm-up``; the benchmark adds its own."""
    options = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    options.add_argument("--seconds", type=float, default=seconds, help=seconds_help)
    options.add_argument("--rounds", type=int, default=3, help=rounds_help)
    if warm_up is not None:
        options.add_argument("--warm-up", type=float, default=warm_up, help="seconds per row, once")
    options.add_argument("--json", help="write the figures and checks here")
    return options


def run(
    bench: str,
    args: argparse.Namespace,
    measure: Callable[[Path, Output], Awaitable[None]],
    report: Callable[[Output], None],
) -> None:
    """A benchmark's main: ``measure`` in a scratch directory, ``report`` into its
    ``Output``, the run time, and ``--json``."""
    began = time.monotonic()
    out = Output(bench)
    with tempfile.TemporaryDirectory(prefix=f"bench-{bench}-") as tmp:
        asyncio.run(measure(Path(tmp), out))
    report(out)
    print(f"\nruntime: {time.monotonic() - began:.0f} s")
    out.write(args.json)
