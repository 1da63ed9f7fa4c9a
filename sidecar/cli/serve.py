"""``sidecar serve``: run the sidecar in the foreground."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from sidecar import logs, server
from sidecar.cli.options import add_store_options, settings
from sidecar.config import DEFAULT_CONTROL_LISTEN


def register(verbs: Any) -> None:
    parser: argparse.ArgumentParser = verbs.add_parser(
        "serve",
        help="run the sidecar (control API and store)",
        description="Run the sidecar in the foreground until SIGTERM/SIGINT. Every flag can "
        "also come from the config file or a SIDECAR_<FLAG> environment variable.",
    )
    add_store_options(parser)
    parser.add_argument(
        "--control-listen",
        metavar="HOST:PORT",
        help=f"control API address (default {DEFAULT_CONTROL_LISTEN}; port 0 picks one)",
    )
    parser.add_argument(
        "--control-token-file",
        type=Path,
        metavar="FILE",
        help="bearer token required by the control API (mandatory beyond loopback)",
    )
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    chosen = settings(
        args,
        control_listen=args.control_listen,
        control_token_file=args.control_token_file,
        log_level=args.log_level,
    )
    logs.configure(chosen.log_level)
    asyncio.run(server.serve(chosen))
    return 0
