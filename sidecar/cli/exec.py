"""``sidecar exec --task T -- CMD...``: run a command as one attempt of a task."""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from pathlib import Path
from typing import Any

from sidecar import config, logs, worker
from sidecar.errors import ConfigError, LeaseHeld

LEASE_HELD_EXIT = 4  # SPEC §5: the lease is held by another live worker


def register(verbs: Any) -> None:
    parser: argparse.ArgumentParser = verbs.add_parser(
        "exec",
        help="run an agent command as one attempt of a task, through the sidecar",
        description="Claim TASK on the running sidecar (a new attempt and generation), run "
        "CMD with HTTP(S)_PROXY pointing at the sidecar and its CA trusted and the last "
        "checkpoint in SIDECAR_LAST_STAGE / SIDECAR_LAST_CHECKPOINT (a JSON file), heartbeat "
        "while it runs, release when it exits (recording how it ended), and exit with its "
        "status: 127 if CMD does not exist, 75 if the lease was lost to another worker, 4 "
        "if another worker's lease is still live (after --wait-s). On stderr, one "
        "'sidecar exec:' line each: the claim, whom it waits for, and how the attempt "
        "ended with its effects (recorded, replayed, refused, blocked).",
    )
    parser.add_argument("--task", required=True, metavar="ID")
    parser.add_argument("--worker", metavar="NAME", help="default: this host's name")
    parser.add_argument("--ttl-s", type=float, default=60.0, metavar="S", help="lease (60)")
    parser.add_argument(
        "--wait-s",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds while another worker's lease is live (default: don't)",
    )
    parser.add_argument(
        "--control",
        metavar="URL",
        help=f"the sidecar's control API (default http://{config.DEFAULT_CONTROL_LISTEN})",
    )
    parser.add_argument("--control-token-file", type=Path, metavar="FILE")
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no 'sidecar exec:' lines on stderr (errors are still printed)",
    )
    parser.add_argument(
        "--log-level", default="warning", choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ConfigError(
            "give the command to run after --, e.g. sidecar exec --task 312 -- python agent.py"
        )
    settings = config.load({"control_token_file": args.control_token_file})
    control = args.control or f"http://{settings.control_listen}"
    logs.configure(args.log_level)
    try:
        return asyncio.run(
            worker.run(
                command,
                control_url=control,
                token=settings.token(),
                task=args.task,
                worker=args.worker or socket.gethostname(),
                ttl_s=args.ttl_s,
                wait_s=args.wait_s,
                notes=worker.Notes(quiet=args.quiet),
            )
        )
    except LeaseHeld as held:
        waited = f" (waited {args.wait_s:g}s)" if args.wait_s > 0 else " (see --wait-s)"
        print(f"sidecar: {held.detail}{waited}", file=sys.stderr)
        return LEASE_HELD_EXIT
