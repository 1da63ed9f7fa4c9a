"""``sidecar webhook``: serve the mutating admission webhook that injects the sidecar."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from sidecar import logs

DEFAULT_LISTEN = "0.0.0.0:8443"  # the API server calls it from outside the pod


def register(verbs: Any) -> None:
    parser: argparse.ArgumentParser = verbs.add_parser(
        "webhook",
        help="serve the Kubernetes admission webhook that injects the sidecar",
        description="Serve POST /mutate (AdmissionReview v1 for Pod CREATE: a JSON Patch "
        'that injects the sidecar into pods with effect-sidecar.io/inject: "true") and '
        "GET /healthz over TLS. Prints 'effect-sidecar webhook ready https://HOST:PORT' and "
        "runs until SIGTERM/SIGINT.",
    )
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve on (default {DEFAULT_LISTEN}; port 0 picks one)",
    )
    parser.add_argument("--tls-cert", type=Path, required=True, metavar="FILE")
    parser.add_argument("--tls-key", type=Path, required=True, metavar="FILE")
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="injection configuration (YAML)"
    )
    parser.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default="info"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.kube.config import load_config  # noqa: PLC0415 - only this verb needs it
    from sidecar.kube.webhook import serve  # noqa: PLC0415

    logs.configure(args.log_level)
    config = load_config(args.config)
    asyncio.run(serve(args.listen, args.tls_cert, args.tls_key, config))
    return 0
