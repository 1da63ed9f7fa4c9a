"""``sidecar exec --task T -- CMD...``: run a command as one attempt of a task."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sidecar import config
from sidecar.cli.options import add_config_option, add_deprecated_alias, deprecated
from sidecar.config import DEFAULT_CONTROL_LISTEN, control_url
from sidecar.errors import ConfigError, LeaseHeld, SidecarUnreachable
from sidecar.runtime import logs, tls_roots

if TYPE_CHECKING:
    from sidecar.agent import worker


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
    parser.add_argument(
        "--lease-ttl-s", type=float, metavar="S", help="the lease, renewed every S/3 (60)"
    )
    add_deprecated_alias(parser, "--ttl-s", "--lease-ttl-s", type=float, metavar="S")
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
        help="the sidecar's control API, http://HOST:PORT or HOST:PORT (default: "
        f"control_listen of --config or SIDECAR_CONTROL_LISTEN, else {DEFAULT_CONTROL_LISTEN})",
    )
    parser.add_argument(
        "--control-token-file",
        type=Path,
        metavar="FILE",
        help="its bearer token (or control_token_file / SIDECAR_CONTROL_TOKEN)",
    )
    add_config_option(parser)
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no 'sidecar exec:' lines on stderr (errors are still printed)",
    )
    isolate = parser.add_mutually_exclusive_group()
    isolate.add_argument(
        "--isolate",
        dest="isolate",
        action="store_const",
        const=True,
        default=None,
        help="run CMD in a network namespace whose only way out is the sidecar: clients "
        "that ignore HTTP(S)_PROXY are redirected to it (80, 443, PostgreSQL) or refused "
        "(Linux, root). Default: on where possible, else a warning; given explicitly, "
        "exec fails (exit 2) where it is not possible",
    )
    isolate.add_argument(
        "--no-isolate",
        dest="isolate",
        action="store_const",
        const=False,
        help="run CMD in the host's network (only clients that honour the proxy "
        "variables go through the sidecar)",
    )
    parser.add_argument(
        "--pg-relay",
        metavar="HOST:PORT",
        help="the sidecar's PostgreSQL relay, where isolated connections to PostgreSQL "
        "ports go (default: pg_listen of --config / SIDECAR_PG_LISTEN when pg_upstream "
        "is set there)",
    )
    parser.add_argument(
        "--log-level", default="warning", choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    parser.set_defaults(run=run)


def control_of(args: argparse.Namespace) -> tuple[str, config.Settings, str]:
    """The control URL exec talks to, the settings it read, and where the URL came from:
    ``--control``, else ``control_listen`` of the config file or ``SIDECAR_*``
    environment (what ``serve`` listens on), else the default."""
    lease_ttl_s = deprecated(args, "--ttl-s", args.lease_ttl_s)
    settings, origins = config.load_with_origins(
        {
            "control_token_file": args.control_token_file,
            "lease_ttl_s": lease_ttl_s,
            "worker": args.worker,
        },
        args.config,
    )
    if args.control:
        return control_url(args.control), settings, "--control"
    host, port = config.parse_listen(settings.control_listen)
    # serve listening on every address is reached on loopback
    host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104
    origin = origins.get("control_listen", "")
    where = (
        "SIDECAR_CONTROL_LISTEN"
        if origin.startswith("environment")
        else f"control_listen of the {origin}"
        if origin
        else "the default control address"
    )
    return f"http://{f'[{host}]' if ':' in host else host}:{port}", settings, where


def isolation_of(args: argparse.Namespace, settings: config.Settings) -> worker.Isolation:
    """``--isolate``/``--no-isolate`` and where PostgreSQL connections go when isolated."""
    from sidecar.agent import worker  # noqa: PLC0415 - imported by run() already

    relay: tuple[str, int] | None = None
    pg_ports = [5432]
    if args.pg_relay:
        relay = config.parse_listen(args.pg_relay)
    elif settings.pg_upstream:
        relay = config.parse_listen(settings.pg_listen)
    if settings.pg_upstream:
        upstream_port = urlsplit(settings.pg_upstream).port
        if upstream_port and upstream_port not in pg_ports:
            pg_ports.append(upstream_port)
    return worker.Isolation(requested=args.isolate, pg_relay=relay, pg_ports=tuple(pg_ports))


def run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ConfigError(
            "give the command to run after --, e.g. sidecar exec --task 312 -- python agent.py"
        )
    control, settings, where = control_of(args)
    logs.configure(args.log_level)
    # First: the system's trusted roots then load on a thread while the rest imports.
    tls_roots.import_aiohttp()
    from sidecar.agent import worker  # noqa: PLC0415 - after aiohttp, see above

    try:
        return asyncio.run(
            worker.run(
                command,
                control_url=control,
                token=settings.token(),
                task=args.task,
                worker=settings.worker,
                ttl_s=settings.lease_ttl_s,
                wait_s=args.wait_s,
                notes=worker.Notes(quiet=args.quiet),
                isolation=isolation_of(args, settings),
            )
        )
    except LeaseHeld as held:
        # main() maps LeaseHeld to exit 4 (SPEC §5); say whether exec waited.
        held.detail += f" (waited {args.wait_s:g}s)" if args.wait_s > 0 else " (see --wait-s)"
        raise
    except SidecarUnreachable as error:
        error.detail += f" (the address is {where}; give --control HOST:PORT)"
        raise
