"""``sidecar demo``: the seed's task #312 scenario, with and without the sidecar."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(verbs: Any) -> None:
    parser: argparse.ArgumentParser = verbs.add_parser(
        "demo",
        help="run the task #312 scenario: an agent evicted after its push, then resumed",
        description="Starts a GitHub emulator, a model endpoint and a sidecar; runs an "
        "unmodified coding agent that is SIGKILLed after its push and restarted as a new "
        "attempt; prints the timeline and counts branches and pull requests - then does the "
        "same without the sidecar. Exits 0 when the sidecar run ends with one branch and one "
        "pull request.",
    )
    parser.add_argument("--keep", type=Path, metavar="DIR", help="work (and keep logs) in DIR")
    matrix = parser.add_argument_group(
        "--matrix: the failure-injection matrix of the same agent (sidecar matrix)"
    )
    matrix.add_argument(
        "--matrix",
        action="store_true",
        help="instead of the scenario, inject every fault at every effect of the agent and "
        "write the filled matrix (exit 1 if a cell FAILs)",
    )
    matrix.add_argument(
        "--out", type=Path, default=Path("sidecar-matrix"), metavar="DIR", help="(sidecar-matrix)"
    )
    matrix.add_argument("--jobs", type=int, default=4, metavar="N", help="cells at once (4)")
    matrix.add_argument("--faults", metavar="LIST", help="a subset of the faults")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.matrix:
        from sidecar.demo import matrix  # noqa: PLC0415 - imported only by this verb

        return matrix.main(args.out.resolve(), jobs=args.jobs, faults=args.faults)
    from sidecar.demo import scenario  # noqa: PLC0415 - imported only by this verb

    return scenario.main(args.keep)
