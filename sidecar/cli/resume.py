"""``sidecar resume TASK``: the resume checklist, performed now, each step with its evidence.

Against a store (``--data-dir``/``--store``/``--config``: it is opened read-only to read,
and read-write only for the store's own test write; the probes go through an upstream
client of this process, with ``--route`` and ``--rules`` as ``serve`` takes them), or
through a running sidecar (``--control URL``: ``POST /v1/tasks/TASK/resume-check`` runs
the same checklist inside it, with its own rules, routes and upstream client).  Either way
the report is :class:`sidecar.resume.model.Report` and the exit code its verdict's:
0 safe to resume, 3 CANNOT DETERMINE, 4 lease held by a live worker, 5 store unavailable,
1 unknown task (or done), 2 usage.  See :mod:`sidecar.resume.checklist` for why resume
claims nothing and records nothing.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sidecar.cli.control_client import ControlClient, add_control_options
from sidecar.cli.options import add_store_options, settings
from sidecar.errors import ConfigError
from sidecar.proxy.exchange import unsendable_header
from sidecar.proxy.routes import Routes
from sidecar.proxy.upstream import Upstream
from sidecar.resume.checklist import run_checklist
from sidecar.resume.model import Report, Status
from sidecar.resume.probing import Prober
from sidecar.rules import load_rules
from sidecar.rules.packs import default_rule_paths
from sidecar.runtime.clock import SystemClock
from sidecar.store import StoreInfo, create_store

_MARK = {
    Status.OK: "ok",
    Status.FAILED: "FAILED",
    Status.CANNOT_DETERMINE: "CANNOT DETERMINE",
    Status.SKIPPED: "skipped",
}


def register(verbs: Any) -> None:
    parser = verbs.add_parser(
        "resume",
        help="check, now, whether a task can be resumed safely (the resume checklist)",
        description="Perform the resume checklist for TASK now and print each step with its "
        "evidence: 1 the lease is free or expired; 2 the store takes a test write; 3 the "
        "last checkpoint and its outputs; 4 every pending or unknown effect probed now "
        "(found / not found / cannot probe), with the rule's probe as the proxy runs it; "
        "5 what the next attempt will replay, send, or leave to a human; 6 fencing (the "
        "next claim's generation, stale writes refused); 7 where it resumes; 8 the verdict. "
        "It claims nothing and records nothing: the next attempt's own probe records what "
        "is found.",
        epilog="Exit codes: 0 safe to resume; 3 CANNOT DETERMINE (an effect waits for a "
        "human, `sidecar effects resolve`, or for its first try to settle); 4 a live worker "
        "holds the lease; 5 the store is unavailable (or no sidecar answers); 1 unknown or "
        "done task; 2 usage.",
    )
    parser.add_argument("task", metavar="TASK")
    add_control_options(parser.add_argument_group("where"))
    add_store_options(parser)
    probing = parser.add_argument_group("probing (the agent's credentials are never stored)")
    probing.add_argument(
        "--probe-header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="a header every probe carries, e.g. 'Authorization: Bearer ...' (repeatable; "
        "never printed or stored)",
    )
    probing.add_argument(
        "--route",
        action="append",
        metavar="HOST=URL",
        help="with a store: send HOST's probes to URL, as `serve --route` (repeatable; "
        "default: the config's)",
    )
    probing.add_argument(
        "--rules",
        action="append",
        type=Path,
        metavar="PATH",
        help="with a store: the rule files or folders the sidecar runs with (repeatable; "
        "default: the config's, else the shipped packs)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON document")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    headers = probe_headers(args.probe_header)
    if args.control:
        if args.rules or args.route or args.store or args.data_dir:
            raise ConfigError(
                "with --control the sidecar's own store, rules and routes are used: drop "
                "--store, --data-dir, --rules and --route"
            )
        report = asyncio.run(_through_control(args, headers))
    else:
        report = asyncio.run(_in_store(args, headers))
    print(report.model_dump_json(indent=2) if args.json else render(report))
    return report.exit_code


def probe_headers(given: list[str]) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    for item in given:
        name, colon, value = item.partition(":")
        if not colon or not name.strip():
            raise ConfigError(f"--probe-header {name.strip() or item[:20]!r}...: give NAME:VALUE")
        headers.append((name.strip(), value.strip()))
    if (why := unsendable_header(tuple(headers))) is not None:
        raise ConfigError(f"--probe-header: {why}")
    return headers


async def _through_control(args: argparse.Namespace, headers: list[tuple[str, str]]) -> Report:
    body = {"probe_headers": dict(headers)}
    async with ControlClient(args.control, args.control_token_file) as control:
        found = await control.call(
            "POST", f"/v1/tasks/{quote(args.task, safe='')}/resume-check", body=body
        )
    return Report.model_validate(found)


async def _in_store(args: argparse.Namespace, headers: list[tuple[str, str]]) -> Report:
    found = settings(args, rules=args.rules, route=args.route)
    rules = load_rules(found.rules or default_rule_paths())
    routes = Routes.parse(found.route)
    # Read-only: a store that is missing is an error, not a new empty one (and reads go
    # on while another process holds the write lock).  The read-write one is only for
    # step 2's test write.
    reading = create_store(found.store_url, read_only=True)
    await reading.open()
    upstream = Upstream(routes, extra_ca=found.upstream_ca)
    await upstream.start()
    try:
        return await run_checklist(
            reading,
            args.task,
            rules=rules,
            prober=Prober(rules, upstream, headers),
            clock=SystemClock(),
            write_check=lambda: _test_write(found.store_url),
        )
    finally:
        await upstream.close()
        await reading.close()


async def _test_write(url: str) -> StoreInfo:
    """Step 2 on a store of this process's own: opened read-write, written, closed."""
    async with create_store(url) as store:
        await store.check_writable()
        return await store.info()


def render(report: Report) -> str:
    """The report as the console shows it: each step, its status and evidence."""
    lines = [
        f"sidecar resume {report.task} (checked {report.checked_at.isoformat(timespec='seconds')})"
    ]
    for step in report.steps:
        lines.append(f"[{_MARK[step.status]}] {step.number}. {step.title}")
        lines.extend(f"      {line}" for line in step.evidence)
    verdict = report.verdict.value.replace("_", " ").upper()
    lines.append(f"=> {verdict} (exit {report.exit_code})")
    return "\n".join(lines)
