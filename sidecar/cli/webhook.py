"""``sidecar webhook``: serve the mutating admission webhook that injects the sidecar."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from sidecar import logs

DEFAULT_LISTEN = "0.0.0.0:8443"  # the API server calls it from outside the pod
DEFAULT_RELOAD_S = 10.0  # sidecar.kube.webhook.DEFAULT_RELOAD_S, without importing it here


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value > 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds: {text!r}")
    return value


def register(verbs: Any) -> None:
    parser: argparse.ArgumentParser = verbs.add_parser(
        "webhook",
        help="serve the Kubernetes admission webhook that injects the sidecar",
        description="Serve POST /mutate (AdmissionReview v1 for Pod CREATE: a JSON Patch "
        'that injects the sidecar into pods with effect-sidecar.io/inject: "true") and '
        "GET /healthz over TLS. Prints 'effect-sidecar webhook ready https://HOST:PORT' and "
        "runs until SIGTERM/SIGINT. The certificate and key files are checked every "
        "--reload-s seconds: a renewed pair (e.g. cert-manager's, swapped in by kubelet) is "
        "served to new connections; a half-written or mismatched pair is logged and the "
        "old certificate kept.",
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
        "--reload-s",
        type=positive_seconds,
        default=DEFAULT_RELOAD_S,
        metavar="SECONDS",
        help="how often to check the certificate files for a renewal "
        f"(default {DEFAULT_RELOAD_S:g})",
    )
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
    asyncio.run(serve(args.listen, args.tls_cert, args.tls_key, config, args.reload_s))
    return 0
