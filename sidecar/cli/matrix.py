"""``sidecar matrix -- AGENT_CMD...``: the seed's failure-injection matrix, filled by
killing the user's own agent (and its sidecar) at every step of every effect."""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path
from typing import Any

from sidecar import config
from sidecar.errors import ConfigError
from sidecar.matrix.faults import FAULTS, chosen
from sidecar.matrix.run import Plan, run, summary
from sidecar.matrix.stack import Setup
from sidecar.rules import load_rules
from sidecar.rules.packs import default_rule_paths

DEFAULT_JOBS = 4


def register(verbs: Any) -> None:
    parser: argparse.ArgumentParser = verbs.add_parser(
        "matrix",
        help="fill the seed's failure-injection matrix by killing your agent at every effect",
        description="Run AGENT_CMD once with no fault to discover its effects, then, for "
        "every effect and every fault, run it again as a task of its own under a private "
        "sidecar (own data dir and free ports), inject the fault with a real signal to a "
        "real process, resume the task as new attempts until the agent finishes, and check "
        "that every effect was forwarded at most once, none was made twice under a new key, "
        "every effect ended as in the clean run, no stale write was accepted, and --check "
        "passes. Writes OUT/matrix.md (the seed's table, filled) and OUT/matrix.json; exits "
        "0 when no cell FAILs, 1 when one does.",
        epilog="Faults: "
        + "; ".join(f"{f.name} ({f.failure_point.lower()})" for f in FAULTS)
        + ". The agent runs under `sidecar exec` with SIDECAR_TASK set to the cell's task; "
        "it must be able to run as several tasks side by side (or use --jobs 1 and --setup).",
    )
    parser.add_argument(
        "--rules",
        type=Path,
        action="append",
        metavar="PATH",
        help="rule file or folder, repeatable (default: the shipped packs, as serve)",
    )
    parser.add_argument(
        "--route",
        action="append",
        default=[],
        metavar="HOST=URL",
        help="send traffic for HOST to URL (as serve), repeatable",
    )
    parser.add_argument(
        "--pg-upstream",
        metavar="URL",
        help="the agent's database, postgresql://USER@HOST:PORT/DB: SQL effects go through "
        "each cell's relay (serve --pg-upstream gets the server part) and the agent gets "
        "DATABASE_URL, this URL with the relay's address (and SIDECAR_PG_URL)",
    )
    parser.add_argument(
        "--control",
        metavar="URL",
        help="use this running sidecar (its rules and routes) instead of private ones: "
        "only the faults done to the worker can be injected (agent-killed-after-forward, "
        "-after-record, stale-worker), timed by polling its effect log; the rest are "
        "CANNOT_DETERMINE. Token: --control-token-file or SIDECAR_CONTROL_TOKEN",
    )
    parser.add_argument("--control-token-file", type=Path, metavar="FILE")
    parser.add_argument(
        "--check",
        metavar="CMD",
        help="shell command run after the clean run and after each cell, with "
        "SIDECAR_MATRIX_TASK (the cell's task), SIDECAR_MATRIX_FAULT and "
        "SIDECAR_MATRIX_EFFECT set: exit 0 when the outside world is right",
    )
    parser.add_argument(
        "--setup",
        metavar="CMD",
        help="shell command run before the clean run and each cell (SIDECAR_MATRIX_TASK set)",
    )
    parser.add_argument(
        "--faults",
        metavar="LIST",
        help="comma-separated faults to inject (default: all): " + ",".join(f.name for f in FAULTS),
    )
    parser.add_argument(
        "--out", type=Path, default=Path("sidecar-matrix"), metavar="DIR", help="(sidecar-matrix)"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=DEFAULT_JOBS,
        metavar="N",
        help=f"cells run at once ({DEFAULT_JOBS}); each is its own task on its own sidecar",
    )
    parser.add_argument(
        "--lease-ttl-s",
        type=float,
        default=4.0,
        metavar="S",
        help="the attempts' lease: how long a killed or frozen worker holds the task (4)",
    )
    parser.add_argument("agent", nargs=argparse.REMAINDER, metavar="-- AGENT_CMD [ARGS...]")
    parser.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    agent = args.agent[1:] if args.agent[:1] == ["--"] else args.agent
    if not agent:
        raise ConfigError(
            "give the agent's command after --, e.g. sidecar matrix -- python agent.py"
        )
    try:
        faults = chosen(args.faults)
    except ValueError as error:
        raise ConfigError(f"--faults: {error}") from error
    if args.jobs < 1:
        raise ConfigError("--jobs must be at least 1")
    rule_paths = [p.resolve() for p in (args.rules or default_rule_paths())]
    for route in args.route:
        if "=" not in route:
            raise ConfigError(f"--route {route!r}: expected HOST=URL")
    plan = Plan(
        Setup(
            tuple(agent),
            tuple(rule_paths),
            tuple(args.route),
            args.pg_upstream,
            args.lease_ttl_s,
            control=config.control_url(args.control) if args.control else None,
            token=config.load({"control_token_file": args.control_token_file}).token(),
        ),
        load_rules(rule_paths),
        faults,
        args.out.resolve(),
        args.check,
        args.jobs,
        args.setup,
    )
    os.environ.pop("SIDECAR_FAILPOINTS", None)  # the cells arm their own
    # SIGTERM as Ctrl-C: the run stops every process of its cells before it exits.
    signal.signal(signal.SIGTERM, _interrupted)
    result = run(plan)
    print(summary(result))
    return 1 if result.failed else 0


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
