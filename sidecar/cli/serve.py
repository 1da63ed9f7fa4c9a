"""``sidecar serve``: run the sidecar in the foreground."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from sidecar.cli.options import add_store_options, settings
from sidecar.config import DEFAULT_CONTROL_LISTEN, DEFAULT_PG_LISTEN, DEFAULT_PROXY_LISTEN
from sidecar.runtime import logs, tls_roots


def register(verbs: Any) -> None:
    parser: argparse.ArgumentParser = verbs.add_parser(
        "serve",
        help="run the sidecar (proxy, control API and store)",
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
    parser.add_argument(
        "--proxy-listen",
        metavar="HOST:PORT",
        help=f"HTTP(S) proxy address (default {DEFAULT_PROXY_LISTEN}; port 0 picks one)",
    )
    parser.add_argument(
        "--mode",
        metavar="MODE",
        help="regular (explicit proxy, default) | transparent | reverse:URL",
    )
    parser.add_argument(
        "--rules",
        type=Path,
        action="append",
        metavar="PATH",
        help="rule file or folder, repeatable (default: the shipped github, "
        "idempotency-key, generic, webhooks and postgres packs; llm-cache is opt-in)",
    )
    parser.add_argument(
        "--route",
        action="append",
        metavar="HOST=URL",
        help="send traffic for HOST to URL, e.g. api.github.com=http://127.0.0.1:9000",
    )
    parser.add_argument(
        "--upstream-ca", type=Path, metavar="FILE", help="extra CA trusted for upstream TLS"
    )
    parser.add_argument(
        "--ca-from",
        type=Path,
        metavar="DIR",
        help="use the CA in DIR (tls.crt, or ca.crt, and tls.key: a Kubernetes TLS Secret "
        "mount, only read) instead of creating one in DATA_DIR/ca",
    )
    parser.add_argument(
        "--ca-bundle",
        type=Path,
        metavar="FILE",
        help="write the trust bundle agents are given (system roots + the CA) to FILE "
        "instead of DATA_DIR/ca-bundle.pem",
    )
    parser.add_argument(
        "--pg-listen",
        metavar="HOST:PORT",
        help=f"PostgreSQL relay address (default {DEFAULT_PG_LISTEN}; with --pg-upstream)",
    )
    parser.add_argument(
        "--pg-upstream",
        metavar="URL",
        help="the real server, postgresql://HOST:PORT[?sslmode=require|verify-ca|verify-full]: "
        "enables the relay; without sslmode, TLS to the server only for agents that ask for it",
    )
    parser.add_argument(
        "--pg-upstream-ca",
        type=Path,
        metavar="FILE",
        help="CA (PEM) the PostgreSQL server's certificate must chain to when the relay "
        "speaks TLS to it (default: the system roots)",
    )
    parser.add_argument("--task", metavar="ID", help="the task this sidecar works on itself")
    parser.add_argument("--worker", metavar="NAME", help="worker name (default: host name)")
    parser.add_argument("--lease-ttl-s", type=float, metavar="S", help="lease of --task")
    parser.add_argument(
        "--store-retry-s",
        type=float,
        metavar="S",
        help="how long an effect record is retried while the store is unavailable before "
        "the request is refused with 503 store_unavailable (default 2)",
    )
    parser.add_argument(
        "--uncovered-writes",
        choices=["log", "record", "deny"],
        help="POST/PUT/PATCH/DELETE no rule matches: log (default: once per host, method and "
        "path shape, counted in sidecar_uncovered_writes_total), record (also as effects "
        "of kind 'uncovered' of the bound task) or deny (403 uncovered_write)",
    )
    parser.add_argument(
        "--notify",
        metavar="URL",
        help="POST a JSON event to URL when a human is needed: effect_blocked, "
        "stale_write_refused, lease_taken_over (retried, queued up to 1,000)",
    )
    parser.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    chosen = settings(
        args,
        control_listen=args.control_listen,
        control_token_file=args.control_token_file,
        log_level=args.log_level,
        proxy_listen=args.proxy_listen,
        mode=args.mode,
        rules=args.rules,
        route=args.route,
        upstream_ca=args.upstream_ca,
        ca_from=args.ca_from,
        ca_bundle=args.ca_bundle,
        task=args.task,
        worker=args.worker,
        lease_ttl_s=args.lease_ttl_s,
        store_retry_s=args.store_retry_s,
        pg_listen=args.pg_listen,
        pg_upstream=args.pg_upstream,
        pg_upstream_ca=args.pg_upstream_ca,
        uncovered_writes=args.uncovered_writes,
        notify=args.notify,
    )
    logs.configure(chosen.log_level)
    # First: the system's trusted roots then load on a thread while the rest imports.
    tls_roots.import_aiohttp()
    # The whole sidecar, imported only when it runs: other verbs start faster.
    from sidecar.serve import server  # noqa: PLC0415

    asyncio.run(server.serve(chosen))
    return 0
