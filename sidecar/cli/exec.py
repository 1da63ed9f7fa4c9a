"""``sidecar exec --task T -- CMD...``: run a command as one attempt of a task."""

from __future__ import annotations

import argparse
import asyncio
import socket
from pathlib import Path
from typing import Any

from sidecar import config, logs, worker
from sidecar.errors import ConfigError


def register(verbs: Any) -> None:
    parser: argparse.ArgumentParser = verbs.add_parser(
        "exec",
        help="run an agent command as one attempt of a task, through the sidecar",
        description="Claim TASK on the running sidecar (a new attempt and generation), run "
        "CMD with HTTP(S)_PROXY pointing at the sidecar and its CA trusted, heartbeat while "
        "it runs, release when it exits, and exit with its status (75 if the lease was "
        "lost to another worker).",
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
    return asyncio.run(
        worker.run(
            command,
            control_url=control,
            token=settings.token(),
            task=args.task,
            worker=args.worker or socket.gethostname(),
            ttl_s=args.ttl_s,
            wait_s=args.wait_s,
        )
    )
