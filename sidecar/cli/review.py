"""``sidecar review``: the monthly review (SPEC §6), from a store or a running sidecar.

Reads the window's figures (:mod:`sidecar.review.collect`; over ``--control``, the route
``GET /v1/review``), then proves fencing on a scratch task and times its own writes
there (:mod:`sidecar.review.proof`), then prints a text summary, or writes the HTML
report (``--out``) and/or prints the figures as JSON (``--json``).  A failed proof exits
1 and says so on stderr, after the report is written.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from sidecar.cli.control_client import ControlClient, add_control_options
from sidecar.cli.durations import duration
from sidecar.cli.options import add_store_options, existing_store, settings
from sidecar.errors import ConfigError
from sidecar.review import report_html, report_text
from sidecar.review.collect import collect
from sidecar.review.figures import Review
from sidecar.review.proof import ControlTarget, StoreTarget, prove_fencing
from sidecar.runtime.clock import SystemClock


def register(verbs: Any) -> None:
    parser = verbs.add_parser(
        "review",
        help="the monthly review: duplicates prevented, human settlements, uncovered and "
        "refused writes, leases against stage durations, write latency, a fencing proof",
        description="Review what the sidecar saw since --since: replays and divergent "
        "replays (duplicates prevented), effects that waited for a human and how each was "
        "settled, writes no rule covered, stale writes refused by fencing, stage "
        "durations against the lease. Then prove fencing is active: on a scratch task "
        "(sidecar-review-fence-...) claim generation 1, release, claim generation 2 and "
        "write a checkpoint with generation 1, which must be refused; time checkpoint "
        "(and, on a store, effect) writes there; delete the scratch task.",
        epilog="Exit codes: 0 ok; 1 the fencing proof failed (a stale write was accepted) "
        "or another error; 2 usage; 5 store unavailable, or no sidecar answers. Reads "
        "--data-dir/--store, or a running sidecar with --control (token from "
        "--control-token-file or SIDECAR_CONTROL_TOKEN).",
    )
    parser.add_argument(
        "--since",
        type=duration,
        default="30d",
        metavar="AGE",
        help="the window, back from now: 30d (default), 12h, 90m",
    )
    parser.add_argument(
        "--out", type=Path, metavar="FILE", help="write the report as one HTML file"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    add_control_options(parser.add_argument_group("a running sidecar"))
    add_store_options(parser)
    parser.set_defaults(run=lambda a: asyncio.run(_review(a)))


def _shown(url: str) -> str:
    """A store URL without its password, for the report."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


async def _from_control(args: argparse.Namespace, back: str) -> Review:
    async with ControlClient(args.control, args.control_token_file) as control:
        review = Review.model_validate(await control.get("/v1/review", {"since": back}))
        proof, checkpoint, effect = await prove_fencing(ControlTarget(control))
    return review.model_copy(
        update={"fence_proof": proof, "checkpoint_write": checkpoint, "effect_write": effect}
    )


async def _from_store(args: argparse.Namespace) -> Review:
    url = settings(args).store_url
    async with existing_store(url) as store:
        now = SystemClock().now()
        review = await collect(store, now - args.since, now, source=_shown(url))
        proof, checkpoint, effect = await prove_fencing(StoreTarget(store))
    return review.model_copy(
        update={"fence_proof": proof, "checkpoint_write": checkpoint, "effect_write": effect}
    )


def _back(args: argparse.Namespace) -> str:
    """--since as the control route takes it (whole minutes)."""
    return f"{max(1, int(args.since.total_seconds() // 60))}m"


async def _review(args: argparse.Namespace) -> int:
    if args.control and (args.store or args.data_dir):
        raise ConfigError("give --control, or --data-dir/--store, not both")
    review = await (_from_control(args, _back(args)) if args.control else _from_store(args))
    if args.out is not None:
        try:
            args.out.write_text(report_html.render(review), encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot write the report to {args.out}: {exc}") from exc
    if args.json:
        print(review.model_dump_json())
    elif args.out is not None:
        print(f"report written to {args.out}")
        print(report_text.proof_lines(review.fence_proof)[0])
    else:
        print(report_text.render(review))
    proof = review.fence_proof
    if proof is None or not proof.ok:
        said = "; ".join(proof.steps) if proof is not None else "it did not run"
        print(f"sidecar review: FENCING PROOF FAILED - {said}", file=sys.stderr)
        return 1
    return 0
