"""``sidecar rules check PATH...``: load rule files the way ``serve`` will, and say so.

It loads them with the same loader as the sidecar, so a file it passes is a file the
sidecar starts with, and every problem in every file is listed at once as ``FILE:LINE``.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from sidecar.rules import RuleError, load_rules


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
        "are read in name order) as the sidecar would. Prints one line per file and exits 0 "
        "when all are valid; otherwise prints every problem as FILE:LINE: message on stderr "
        "and exits 1.",
    )
    check.add_argument("paths", nargs="+", type=Path, metavar="PATH")
    check.set_defaults(run=run_check)


def run_check(args: argparse.Namespace) -> int:
    try:
        rule_set = load_rules(args.paths)
    except RuleError as error:
        for problem in error.problems:
            print(problem, file=sys.stderr)
        count = len(error.problems)
        print(f"rules check: {count} problem{'s' * (count != 1)}", file=sys.stderr)
        return 1
    per_file = Counter(source.file for source in rule_set.sources.values())
    for file in rule_set.files:
        print(f"{file}: {_rules(per_file[file])} ok")
    files = len(rule_set.files)
    print(f"{_rules(len(rule_set))} in {files} file{'s' * (files != 1)} ok")
    return 0


def _rules(count: int) -> str:
    return f"{count} rule{'s' * (count != 1)}"
