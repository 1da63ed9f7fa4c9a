"""Every benchmark with settings that finish in about 5 minutes, and ONE table of figures
against the targets of issue 18 ("Performance").

    ./run bench all [--seconds 1.5] [--rounds 3] [--no-growth] [--json PATH]

Runs, one after another, each in its own process (their own tables and progress go to
stderr; each writes its checks with ``--json``):

* ``proxy --growth``: the HTTP data path vs plain mitmdump (interleaved rounds), 1 MiB
  rows and RSS, start-up, idle RSS, RSS after 10k and 50k recorded effects;
* ``pg --checks-only``: the PostgreSQL relay vs a bare Python relay, recorded INSERT;
* ``stores --mode uncontended --backend postgresql``: the shared PostgreSQL store, 32
  workers over 32 tasks;
* ``control_api --http-only``: POST /checkpoints vs a plain aiohttp + sqlite3
  group-commit server, 32 clients;

then prints the table (path | figure | target | met? | the floor's figure and whether it
meets the target), with the date, the machine and the command, as docs/benchmarks.md
keeps it, and a count of the targets not met whose floor misses them too.  Exits 1 if a
benchmark failed to run (a target not met is a figure, not a failure).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import parser, print_table

HERE = Path(__file__).parent


def benches(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    timing = ["--seconds", f"{args.seconds:g}", "--rounds", str(args.rounds)]
    return [
        ("proxy", [*timing, *([] if args.no_growth else ["--growth"])]),
        ("pg", ["--checks-only", "--seconds", f"{max(1, round(args.seconds))}",
                "--rounds", str(args.rounds)]),
        ("stores", ["--mode", "uncontended", "--backend", "postgresql", *timing]),
        ("control_api", ["--http-only", *timing]),
    ]  # fmt: skip


def machine() -> str:
    model = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return (
        f"{os.cpu_count()} CPUs (nproc {len(os.sched_getaffinity(0))}), {model}, "
        f"Linux {platform.release()}, Python {platform.python_version()}"
    )


def main() -> int:
    options = parser(__doc__, seconds=1.5)
    options.add_argument("--no-growth", action="store_true", help="skip the 50k-effect RSS run")
    args = options.parse_args()
    began = time.monotonic()
    load_before = os.getloadavg()
    checks: list[dict[str, Any]] = []
    failed: list[str] = []
    took: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-all-") as tmp:
        for name, argv in benches(args):
            out = Path(tmp) / f"{name}.json"
            command = [sys.executable, str(HERE / f"{name}.py"), *argv, "--json", str(out)]
            print(f"== bench {name} {' '.join(argv)}", file=sys.stderr, flush=True)
            started = time.monotonic()
            # Their tables and progress go to stderr; stdout keeps the one table.
            done = subprocess.run(command, stdout=sys.stderr, check=False)
            took[name] = time.monotonic() - started
            if not out.exists():
                failed.append(f"{name} (exit {done.returncode}, no figures)")
                continue
            if done.returncode != 0:
                failed.append(f"{name} (exit {done.returncode})")
            checks += json.loads(out.read_text())["checks"]
    elapsed = time.monotonic() - began
    print(f"\ndate: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"machine: {machine()}")
    print(f"load average (1 min): {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after")
    print(f"command: ./run bench all {' '.join(sys.argv[1:])}".rstrip())
    print(
        f"took: {elapsed / 60:.1f} min ("
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in took.items())
        + ")\n"
    )
    print_table(checks)
    if failed:
        print(f"FAILED to run: {', '.join(failed)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"checks": checks, "failed": failed}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
