"""The ``sidecar`` command: parses arguments and calls into the package; nothing else.

Each verb lives in its own module with ``register(subparsers)``; the module's ``run``
returns the process exit code, or raises: :data:`EXIT_CODES` turns the error into the
exit code here, the one place for every verb (SPEC §5; docs/reference.md has the
table).  ``exec`` also exits with its agent's status, 75 when its lease was lost, and 127
when the command does not exist.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Sequence

import sidecar
from sidecar.domain.ids import TASK_PATTERN
from sidecar.errors import (
    ConfigError,
    EffectUnknown,
    InvalidRequest,
    LeaseHeld,
    SidecarError,
    StoreUnavailable,
)
from sidecar.runtime import startup

# Each verb and the module that registers it (sidecar.cli.MODULE).  A command imports
# only the module of its own verb: a `sidecar exec` per agent run need not load the
# emulators, the store or Kubernetes (about 0.6 s of start-up each time).
VERB_MODULES = {
    "serve": "serve",
    "exec": "exec",
    "tasks": "inspect",
    "effects": "inspect",
    "prune": "lifecycle",
    "rules": "rules",
    "emulate": "emulate",
    "demo": "demo",
    "inject": "inject",
    "webhook": "webhook",
    "redirect": "redirect",
    "matrix": "matrix",
    "resume": "resume",
    "review": "review",
}

USAGE_EXIT = 2
#: Errors to exit codes, the first that matches wins (SPEC §5). argparse exits 2 itself.
EXIT_CODES: tuple[tuple[type[SidecarError], int], ...] = (
    (LeaseHeld, 4),  # another live worker holds the task's lease (a claim, exec)
    (EffectUnknown, 3),  # CANNOT DETERMINE: an effect waits for a human
    (StoreUnavailable, 5),  # the store, or the sidecar in front of it, does not answer
    (ConfigError, USAGE_EXIT),  # bad flags, environment, config or rule files
    (InvalidRequest, USAGE_EXIT),  # a value the control API refuses (e.g. a task id)
    (SidecarError, 1),  # anything else: an unknown task, a refused resolution, ...
)


def exit_code(error: SidecarError) -> int:
    return next(code for kind, code in EXIT_CODES if isinstance(error, kind))


def _bad_task(args: argparse.Namespace) -> str | None:
    """Every verb's task id (``TASK``, ``--task``) is checked here, before anything runs."""
    task = getattr(args, "task", None)
    if not isinstance(task, str) or re.fullmatch(TASK_PATTERN, task):
        return None
    return (
        f"task id {task!r} is not valid: 1-128 letters, digits and . _ : @ -, "
        "starting with a letter or digit"
    )


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The parser of every verb, or of ``verb`` alone when it is one (the rest unloaded)."""
    parser = argparse.ArgumentParser(
        prog="sidecar",
        description="effect-sidecar: lets AI agents crash and resume without repeating "
        "side effects.",
        epilog="Exit codes: 0 ok; 1 error (e.g. an unknown task); 2 usage (bad flags, "
        "settings or task id); 3 CANNOT DETERMINE, an effect waits for a human; 4 the "
        "task's lease is held by another live worker; 5 store unavailable, or no sidecar "
        "answers; exec: its command's status, 75 lease lost, 127 command not found.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {sidecar.__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    modules = dict.fromkeys(VERB_MODULES.values())  # in order, each once
    if verb in VERB_MODULES:
        modules = {VERB_MODULES[verb]: None}
    for name in modules:
        importlib.import_module(f"sidecar.cli.{name}").register(verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["serve"]:
        # The sidecar's start-up builds what it keeps until it exits: its older garbage
        # generations are not collected meanwhile (the server restores that when ready).
        startup.begin()
    try:
        return _run(words)
    finally:
        # A serve refused (bad flags, --help) or stopped before it was ready: the
        # collector as it was (a no-op once ready, and for every other verb).
        startup.abandoned()


def _run(words: list[str]) -> int:
    if words[:2] == ["effects", "resolve"]:
        # `effects TASK` keeps its positional; `effects resolve ...` is a verb of its own
        # (a task named "resolve": `sidecar effects -- resolve`).
        from sidecar.cli import resolve  # noqa: PLC0415 - only for this verb

        args = resolve.build_parser().parse_args(words[2:])
    elif words[:1] == ["tasks"] and words[1:2] in (["done"], ["reopen"]):
        # the same for `tasks done|reopen TASK` (a task named done: `sidecar tasks -- done`)
        from sidecar.cli import lifecycle  # noqa: PLC0415 - only for this verb

        args = lifecycle.build_tasks_parser(words[1]).parse_args(words[2:])
    else:
        args = build_parser(words[0] if words else None).parse_args(words)
    bad = _bad_task(args)
    if bad is not None:
        print(f"sidecar: {bad}", file=sys.stderr)
        return USAGE_EXIT
    try:
        code: int = args.run(args)
    except SidecarError as error:
        print(f"sidecar: {error.detail}", file=sys.stderr)
        return exit_code(error)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `sidecar tasks | head`: the reader has what it wanted. Point stdout at /dev/null
        # so that the interpreter's last flush does not fail on the closed pipe too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code
