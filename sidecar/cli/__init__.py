"""The ``sidecar`` command: parses arguments and calls into the package; nothing else.

Each verb lives in its own module with ``register(subparsers)``; the module's ``run``
returns the process exit code.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import sidecar
from sidecar.cli import (
    demo,
    emulate,
    inject,
    inspect,
    redirect,
    resolve,
    rules,
    serve,
    webhook,
)
from sidecar.cli import exec as exec_
from sidecar.errors import ConfigError, SidecarError, StoreUnavailable

VERBS = (serve, exec_, inspect, rules, emulate, demo, inject, webhook, redirect)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sidecar",
        description="effect-sidecar: lets AI agents crash and resume without repeating "
        "side effects.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {sidecar.__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for module in VERBS:
        module.register(verbs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:2] == ["effects", "resolve"]:
        # `effects TASK` keeps its positional; `effects resolve ...` is a verb of its own
        # (a task named "resolve": `sidecar effects -- resolve`).
        args = resolve.build_parser().parse_args(words[2:])
    else:
        args = build_parser().parse_args(words)
    try:
        code: int = args.run(args)
    except ConfigError as error:
        print(f"sidecar: {error.detail}", file=sys.stderr)
        return 2
    except StoreUnavailable as error:
        print(f"sidecar: {error.detail}", file=sys.stderr)
        return 5
    except SidecarError as error:
        print(f"sidecar: {error.detail}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `sidecar tasks | head`: the reader has what it wanted. Point stdout at /dev/null
        # so that the interpreter's last flush does not fail on the closed pipe too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code
