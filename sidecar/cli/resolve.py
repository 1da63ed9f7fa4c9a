"""``sidecar effects resolve TASK EFFECT_KEY --as completed|failed|abandoned``.

A human settles an effect the sidecar cannot (SPEC §3.10), through a running sidecar
(``--control URL``: the control API's resolve route) or straight in its store
(``--data-dir``/``--store``/``--config``, while the sidecar runs or after it died).
Either way the same command decides and writes, with a ``resolved`` audit line.

``sidecar effects TASK`` stays what it was: ``main`` hands ``effects resolve ...`` to this
module's own parser (:func:`build_parser`) before the verbs' parser sees it.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import socket
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sidecar.cli.control_client import ControlClient, add_control_options
from sidecar.cli.options import add_store_options, existing_store, settings
from sidecar.control.schemas import EffectOut
from sidecar.control.settle import ResolveOut
from sidecar.domain import settling
from sidecar.errors import ConfigError
from sidecar.rules import load_rules
from sidecar.rules.packs import default_rule_paths
from sidecar.store.settle import landing_of, resolve_effect

PROG = "sidecar effects resolve"
_AFTER = {
    "completed": "later attempts are answered with this evidence (X-Sidecar-Effect: replayed)",
    "failed": "the next attempt sends it again, with the first idempotency key",
    "abandoned": "later attempts are refused (409 effect_abandoned)",
}


def default_by() -> str:
    user = os.environ.get("USER") or getpass.getuser()
    return f"{user}@{socket.gethostname()}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Settle an effect that waits for a human (its outcome is unknown and "
        "no probe can check it: CANNOT DETERMINE), once you have checked the outside "
        "world: --as completed with the answer you found (later attempts are answered with "
        "it), --as failed (the next attempt sends it again, with the first idempotency "
        "key), or --as abandoned (later attempts are refused). Recorded in the effect's "
        "audit trail with --by and --note. Refused (exit 1) while an attempt could still "
        "land the effect, or when it is settled already.",
        epilog="Exit codes: 0 resolved, 1 refused or failed, 2 usage, 5 store unavailable or "
        "no sidecar answers. Reads a running sidecar with --control, else the store "
        "(--data-dir/--store).",
    )
    parser.add_argument("task", metavar="TASK")
    parser.add_argument(
        "effect_key", metavar="EFFECT_KEY", help="as `sidecar effects TASK` shows it"
    )
    parser.add_argument(
        "--as", dest="outcome", required=True, choices=[o.value for o in settling.Outcome]
    )
    parser.add_argument("--note", required=True, metavar="TEXT", help="what you found, and why")
    parser.add_argument("--by", metavar="NAME", help="who resolves it (default: $USER@hostname)")
    evidence = parser.add_argument_group("evidence (--as completed)")
    evidence.add_argument("--status", type=int, metavar="N", help="the answer's HTTP status")
    evidence.add_argument(
        "--header", action="append", default=[], metavar="NAME:VALUE", help="repeatable"
    )
    evidence.add_argument(
        "--body",
        metavar="JSON|@FILE",
        help="the answer's body: JSON (sent as application/json), or any other text "
        "(text/plain); @FILE reads it from FILE",
    )
    add_control_options(parser.add_argument_group("where"))
    add_store_options(parser)
    parser.add_argument(
        "--rules",
        action="append",
        type=Path,
        metavar="PATH",
        help="with a store: the rules the sidecar runs with, for how long a request of the "
        "effect may still land (default: the shipped packs; a rule not found gets the "
        "longest window)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    resolution, request = _resolution(args)
    if args.control:
        answer = asyncio.run(_through_control(args, request))
    else:
        answer = asyncio.run(_in_store(args, resolution))
    if args.json:
        print(json.dumps(answer))
    else:
        said = answer["effect"]["events"][-1]["detail"] if answer["effect"]["events"] else ""
        print(
            f"task {answer['task']}: effect {answer['effect_key']!r} resolved "
            f"{answer['outcome']} (state {answer['state']}): {said}\n"
            f"{_AFTER[answer['outcome']]}"
        )
    return 0


def _resolution(args: argparse.Namespace) -> tuple[settling.Resolution, dict[str, Any]]:
    """What the human said, for the store, and as the control API's request body."""
    given = args.status is not None or args.header or args.body is not None
    if given and args.outcome != "completed":
        raise ConfigError("--status, --header and --body are evidence for --as completed only")
    if given and args.status is None:
        raise ConfigError("--header and --body need --status")
    if args.status is not None and not 100 <= args.status <= 599:
        raise ConfigError(f"--status {args.status}: an HTTP status is 100-599")
    headers: dict[str, str] = {}
    for item in args.header:
        name, colon, value = item.partition(":")
        if not colon or not name.strip():
            raise ConfigError(f"--header {item!r}: give NAME:VALUE")
        headers[name.strip()] = value.strip()
    by = (args.by if args.by is not None else default_by()).strip()
    note = args.note.strip()
    if not by or not note:
        raise ConfigError("--note and --by must not be blank")
    request: dict[str, Any] = {"outcome": args.outcome, "note": note, "by": by}
    response = None
    if args.status is not None:
        body = _body(args.body)
        response = settling.evidence(args.status, headers, body)
        request["response"] = {"status": args.status, "headers": headers, "body": body}
    return settling.Resolution(settling.Outcome(args.outcome), by, note, response), request


def _body(given: str | None) -> Any:
    if given is None:
        return None
    text = given
    if given.startswith("@"):
        try:
            text = Path(given[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"--body {given}: {exc}") from exc
    try:
        return json.loads(text)
    except ValueError:
        return text


async def _through_control(args: argparse.Namespace, request: dict[str, Any]) -> dict[str, Any]:
    task, key = quote(args.task, safe=""), quote(args.effect_key, safe="")
    async with ControlClient(args.control, args.control_token_file) as control:
        found = await control.call("POST", f"/v1/tasks/{task}/effects/{key}/resolve", body=request)
    return dict(found)


async def _in_store(args: argparse.Namespace, resolution: settling.Resolution) -> dict[str, Any]:
    found = settings(args)
    rules = load_rules(args.rules or found.rules or default_rule_paths())
    async with existing_store(found.store_url) as store:
        effect = await resolve_effect(
            store, args.task, args.effect_key, resolution, landing_of(rules)
        )
        events = await store.effect_events_of([(args.task, args.effect_key)])
    return ResolveOut(
        task=args.task,
        effect_key=args.effect_key,
        outcome=resolution.outcome.value,
        state=effect.state.value,
        by=resolution.by,
        note=resolution.note,
        effect=EffectOut.of(effect, events),
    ).model_dump(mode="json")
