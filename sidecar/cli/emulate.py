"""``sidecar emulate github``: run a stand-in for an outside service in the foreground."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from sidecar.cli.options import add_deprecated_alias, deprecated
from sidecar.errors import ConfigError
from sidecar.runtime import logs

DEFAULT_GITHUB_LISTEN = "127.0.0.1:7310"


def register(verbs: Any) -> None:
    emulate: argparse.ArgumentParser = verbs.add_parser(
        "emulate",
        help="run an emulator of an outside service (for the demo and tests)",
        description="Run a local stand-in for a service agents write to, so effects can be "
        "tried, killed and checked without touching the real one.",
    )
    sub = emulate.add_subparsers(dest="emulator", metavar="SERVICE", required=True)
    github = sub.add_parser(
        "github",
        help="GitHub: REST API and git smart HTTP",
        description="Emulate GitHub: the REST API (repositories, refs, pull requests, "
        "comments, labels, releases, contents; also under /api/v3) and git clone/fetch/push "
        "over HTTP, on bare repositories in DATA_DIR/repos with the rest in DATA_DIR/state.json. "
        "Serves HTTPS instead when given --tls-cert and --tls-key. Prints 'github emulator "
        "ready http://HOST:PORT' (https:// with TLS) and runs until SIGTERM/SIGINT.",
    )
    github.add_argument(
        "--listen",
        default=DEFAULT_GITHUB_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve on (default {DEFAULT_GITHUB_LISTEN}; port 0 picks one)",
    )
    github.add_argument(
        "--data-dir", type=Path, metavar="DIR", help="where repositories and state live (required)"
    )
    add_deprecated_alias(github, "--data", "--data-dir", type=Path, metavar="DIR")
    github.add_argument(
        "--tls-cert",
        type=Path,
        metavar="FILE",
        help="serve HTTPS with this PEM certificate chain (server certificate first); "
        "needs --tls-key. Client certificates are not asked for",
    )
    github.add_argument(
        "--tls-key",
        type=Path,
        metavar="FILE",
        help="the PEM private key of --tls-cert, unencrypted",
    )
    github.add_argument(
        "--api-url",
        metavar="URL",
        help="base of the 'url' fields, e.g. https://api.github.com (default: the listen address)",
    )
    github.add_argument(
        "--web-url",
        metavar="URL",
        help="base of 'html_url' and 'clone_url', e.g. https://github.com (default: the listen "
        "address)",
    )
    github.add_argument(
        "--late",
        action="append",
        default=[],
        metavar="METHOD:PATH_REGEX=SECONDS",
        help="act on matching requests, then answer SECONDS late (fault injection; repeatable)",
    )
    github.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info"
    )
    github.set_defaults(run=run_github)


def run_github(args: argparse.Namespace) -> int:
    from sidecar.emulators import github  # noqa: PLC0415 - only this verb needs it
    from sidecar.emulators.faults import Late  # noqa: PLC0415
    from sidecar.runtime.tls import server_context  # noqa: PLC0415

    data_dir = deprecated(args, "--data", args.data_dir)
    if data_dir is None:
        raise ConfigError("give --data-dir DIR: where the emulator keeps repositories and state")
    logs.configure(args.log_level)
    late = [Late.parse(spec) for spec in args.late]
    if (args.tls_cert is None) != (args.tls_key is None):
        raise ConfigError("--tls-cert and --tls-key go together: give both or neither")
    # Loaded before the socket is bound, so a bad pair fails the start, not a handshake.
    tls = server_context(args.tls_cert, args.tls_key) if args.tls_cert else None
    asyncio.run(
        github.serve(
            args.listen,
            data_dir,
            api_url=args.api_url,
            web_url=args.web_url,
            late=late,
            tls=tls,
        )
    )
    return 0
