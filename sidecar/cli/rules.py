"""``sidecar rules check PATH...`` and ``sidecar rules explain``.

``check`` loads rule files with the same loader as the sidecar, so a file it passes is a
file the sidecar starts with; every problem in every file, and the checks across rules,
are reported in one run as ``FILE:LINE``, followed by warnings (a keyless
``non_idempotent`` rule, a rule an earlier one shadows) that do not fail the check.

``explain`` prints what the sidecar would do with one request or SQL text, as
:mod:`sidecar.rules.explain` works it out: the rule that matches (and the later ones it
shadows for it), the effect key, the idempotency key sent upstream, the probe an unknown
outcome would send, or that it is a write no rule covers.  This module parses the
arguments and prints, nothing more.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from sidecar.errors import ConfigError
from sidecar.rules import HttpRequestFacts, RuleProblem
from sidecar.rules.explain import explain_http, explain_sql
from sidecar.rules.loader import RuleReport, check_rules

__all__ = ["register", "run_check", "run_explain"]


def register(verbs: Any) -> None:
    rules: argparse.ArgumentParser = verbs.add_parser(
        "rules",
        help="work with rule files",
        description="Rule files say which outbound requests are effects and how to key, "
        "replay and probe them.",
    )
    sub = rules.add_subparsers(dest="rules_verb", metavar="VERB", required=True)
    check = sub.add_parser(
        "check",
        help="validate rule files and folders",
        description="Load every PATH (a .yaml/.yml file, or a folder whose .yaml/.yml files "
        "are read in name order) as the sidecar would. Every problem of every file, and the "
        "checks across files (duplicate names), are printed in one run as FILE:LINE: message "
        "on stderr, then warnings as FILE:LINE: warning: message (a non_idempotent rule "
        "without a key; a rule an earlier one shadows). Exits 1 if there is any problem, 0 "
        "otherwise (warnings included), printing one line per valid file.",
    )
    check.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    check.add_argument(
        "--json",
        action="store_true",
        help="print {ok, rules, problems, warnings} as JSON (problems as {file, line, message})",
    )
    check.set_defaults(run=run_check)

    explain = sub.add_parser(
        "explain",
        help="show what the sidecar would do with one request or SQL text",
        description="Match METHOD URL (or --sql TEXT) against the rules as the sidecar would "
        "and show the rule that wins, the later rules that would also match (shadowed), the "
        "effect key, the idempotency header and key it would send, and the probe it would "
        "send when an earlier attempt's outcome is unknown. A write no rule matches is shown "
        "as uncovered, with its path shape and a rule to start from.",
    )
    explain.add_argument("method", nargs="?", metavar="METHOD")
    explain.add_argument("url", nargs="?", metavar="URL")
    explain.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="K:V",
        help="a request header, repeatable",
    )
    explain.add_argument("--body", metavar="JSON|@FILE", help="the request body (JSON text)")
    explain.add_argument(
        "--sql", metavar="TEXT", help="explain SQL statements instead of an HTTP request"
    )
    explain.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="VALUE",
        help="a bind parameter of the SQL statement ($1, $2, ...), repeatable",
    )
    explain.add_argument(
        "--rules",
        type=Path,
        action="append",
        metavar="PATH",
        help="rule file or folder, repeatable (default: the packs serve loads)",
    )
    explain.add_argument("--json", action="store_true", help="print JSON")
    explain.set_defaults(run=run_explain, explain_parser=explain)


# ---- check -------------------------------------------------------------------------------


def _check_json(report: RuleReport) -> dict[str, Any]:
    def entries(found: list[RuleProblem]) -> list[dict[str, Any]]:
        return [{"file": str(p.file), "line": p.line, "message": p.message} for p in found]

    return {
        "ok": not report.problems,
        "rules": [] if report.problems else [rule.name for rule in report.rules],
        "problems": entries(report.problems),
        "warnings": entries(report.warnings),
    }


def run_check(args: argparse.Namespace) -> int:
    report = check_rules(args.paths)
    if args.json:
        print(json.dumps(_check_json(report), indent=2))
        return 1 if report.problems else 0
    for problem in report.problems:
        print(problem, file=sys.stderr)
    for warning in report.warnings:
        print(_warning(warning), file=sys.stderr)
    if report.problems:
        count = len(report.problems)
        tail = f", {_count(len(report.warnings), 'warning')}" if report.warnings else ""
        print(f"rules check: {_count(count, 'problem')}{tail}", file=sys.stderr)
        return 1
    rule_set = report.rules
    per_file = Counter(source.file for source in rule_set.sources.values())
    for file in rule_set.files:
        print(f"{file}: {_count(per_file[file], 'rule')} ok")
    files = len(rule_set.files)
    tail = f" ({_count(len(report.warnings), 'warning')})" if report.warnings else ""
    print(f"{_count(len(rule_set), 'rule')} in {_count(files, 'file')} ok{tail}")
    return 0


def _warning(problem: RuleProblem) -> str:
    where = f"{problem.file}:{problem.line}" if problem.line else str(problem.file)
    return f"{where}: warning: {problem.message}"


def _count(count: int, word: str) -> str:
    return f"{count} {word}{'s' * (count != 1)}"


# ---- explain -----------------------------------------------------------------------------


def run_explain(args: argparse.Namespace) -> int:
    parser: argparse.ArgumentParser = args.explain_parser
    if args.sql is None and (args.method is None or args.url is None):
        parser.error("give METHOD URL, or --sql TEXT")
    if args.sql is not None and args.method is not None:
        parser.error("give either METHOD URL or --sql TEXT, not both")
    paths = args.rules
    if not paths:
        from sidecar.rules.packs import default_rule_paths  # noqa: PLC0415

        paths = default_rule_paths()
    report = check_rules(paths)
    if report.problems:
        for problem in report.problems:
            print(problem, file=sys.stderr)
        print(f"rules explain: {_count(len(report.problems), 'problem')}", file=sys.stderr)
        return 1
    rules = report.rules
    if args.sql is not None:
        params = tuple(p.encode() for p in args.param)
        found: Any = explain_sql(rules, args.sql, params)
        text = _sql_text(found)
    else:
        facts = _facts(args.method, args.url, args.header, args.body)
        found = explain_http(rules, facts)
        text = _http_text(found)
    print(json.dumps(found, indent=2) if args.json else text)
    return 0


def _facts(method: str, url: str, headers: list[str], body: str | None) -> HttpRequestFacts:
    if "://" not in url:
        raise ConfigError(f"URL must be absolute (https://HOST/PATH), got {url!r}")
    pairs: list[tuple[str, str]] = []
    for header in headers:
        name, sep, value = header.partition(":")
        if not sep or not name.strip():
            raise ConfigError(f"--header takes NAME:VALUE, got {header!r}")
        pairs.append((name.strip(), value.strip()))
    raw: bytes | None = None
    if body is not None:
        if body.startswith("@"):
            try:
                raw = Path(body[1:]).read_bytes()
            except OSError as error:
                raise ConfigError(f"--body {body}: {error}") from error
        else:
            raw = body.encode()
        if not any(n.lower() == "content-type" for n, _ in pairs):
            pairs.append(("Content-Type", "application/json"))
    return HttpRequestFacts.from_url(method, url, pairs, raw)


def _http_text(found: dict[str, Any]) -> str:
    request = found["request"]
    lines = [f"request:     {request['method']} {request['host']}{request['path']}"]
    rule = found["rule"]
    if rule is None:
        if found["disposition"] == "uncovered":
            uncovered = found["uncovered"]
            suggested = uncovered["suggested_match"]
            lines += [
                "rule:        none - an uncovered write (passed through; see serve "
                "--uncovered-writes)",
                f"shape:       {uncovered['shape']}",
                "a rule to start from:",
                "  - name: CHOOSE.A.NAME",
                f"    match: {{host: {suggested['host']}, method: {suggested['method']}, "
                f'path: "{suggested["path"]}"}}',
                "    effect: non_idempotent",
                '    key: "..."   # what makes two of these requests the same effect',
            ]
        else:
            lines.append("rule:        none - passed through untouched")
        return "\n".join(lines)
    lines.append(f"rule:        {rule['name']} ({rule['at']}), effect {rule['effect']}")
    if rule["params"]:
        shown = ", ".join(f"{k}={v}" for k, v in rule["params"].items())
        lines.append(f"params:      {shown}")
    for shadowed in found["shadows"]:
        lines.append(f"shadows:     {shadowed['name']} ({shadowed['at']}) would match too")
    if found["disposition"] == "passthrough":
        lines.append("disposition: passed through untouched (not an effect)")
        return "\n".join(lines)
    lines += [
        f"effect key:  {found['effect_key']}",
        f"key from:    {found['key_from']}",
        f"fingerprint: {found['fingerprint']}",
    ]
    idem = found["idempotency"]
    if idem:
        lines.append(f"idempotency: {idem['header']}: {idem['value']}  ({idem['shape']})")
    else:
        lines.append("idempotency: none sent (the rule names no idempotency_header)")
    lines.append(f"on unknown:  {found['on_unknown']}; on divergence: {found['on_divergence']}")
    probe = found["probe"]
    if probe is None:
        lines.append("probe:       none")
    elif "builtin" in probe:
        lines.append(f"probe:       {probe['builtin']}")
    elif "error" in probe:
        lines.append(f"probe:       {probe['error']}")
    else:
        lines.append(f"probe:       {probe['method']} {probe['host']}{probe['path']}")
        lines += [f"             {n}: {v}" for n, v in probe["headers"].items()]
        lines.append(
            f"             found if {probe['found']}, answered as {probe['answer_status']}"
        )
    return "\n".join(lines)


def _sql_text(found: dict[str, Any]) -> str:
    lines: list[str] = []
    for number, entry in enumerate(found["statements"], 1):
        lines.append(f"statement {number}: {entry['statement']}")
        rule = entry["rule"]
        if rule is None:
            lines.append("  rule:       none - passed through")
            continue
        lines.append(f"  rule:       {rule['name']} ({rule['at']}), effect {rule['effect']}")
        for shadowed in entry["shadows"]:
            lines.append(f"  shadows:    {shadowed['name']} ({shadowed['at']}) would match too")
        if entry["disposition"] == "passthrough":
            lines.append("  passed through (not an effect)")
            continue
        lines.append(f"  effect key: {entry['effect_key']}")
        ordinal = entry["ordinal"]
        lines.append(
            f"  ordinal:    {ordinal}"
            if ordinal is not None
            else f"  ordinal:    none ({entry['ordinal_note']})"
        )
    if any(entry.get("ordinal") for entry in found["statements"]):
        lines.append(
            "ordinals: the n-th run of one key in an attempt is 'KEY #n'; a new attempt "
            "counts from 1 again, meets the same keys and is answered from the log"
        )
    return "\n".join(lines)
