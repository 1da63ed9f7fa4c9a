"""Flags shared by several verbs, turning them into :class:`Settings`, and opening the
store those settings name."""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar import config

if TYPE_CHECKING:
    from sidecar.store import Store


def add_config_option(parser: argparse.ArgumentParser) -> None:
    """``--config FILE``: the YAML settings file every verb with settings reads (under
    ``SIDECAR_*`` environment variables and the flags; see :mod:`sidecar.config`)."""
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="YAML file of settings (keys as the flags)"
    )


def add_deprecated_alias(
    parser: argparse.ArgumentParser, old: str, new: str, **kwargs: Any
) -> None:
    """``old``, hidden from ``--help``, still accepted for ``new``: :func:`deprecated`
    picks it up (and says so) when ``new`` was not given."""
    dest = "deprecated_" + old.lstrip("-").replace("-", "_")
    parser.add_argument(old, dest=dest, help=argparse.SUPPRESS, **kwargs)
    parser.set_defaults(**{dest: None})
    _ALIASES[dest] = (old, new)


_ALIASES: dict[str, tuple[str, str]] = {}


def deprecated(args: argparse.Namespace, old: str, given: Any) -> Any:
    """The value of the flag whose deprecated spelling is ``old``: ``given`` (the new
    flag's value) if set, else the old flag's, with a note on stderr."""
    dest = "deprecated_" + old.lstrip("-").replace("-", "_")
    value = getattr(args, dest, None)
    if given is not None or value is None:
        return given
    _, new = _ALIASES.get(dest, (old, "?"))
    print(f"sidecar: {old} is deprecated; use {new}", file=sys.stderr)
    return value


def add_store_options(parser: argparse.ArgumentParser) -> None:
    add_config_option(parser)
    parser.add_argument(
        "--store",
        metavar="URL",
        help="store URL: sqlite:///PATH (default: sqlite:///DATA_DIR/effects.db), or "
        "postgresql://USER@HOST:PORT/DB[?schema=NAME] shared by many sidecars "
        "(password from PGPASSWORD or ~/.pgpass rather than the URL)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help=f"where the sidecar keeps its files (default: {config.default_data_dir()})",
    )


def settings(args: argparse.Namespace, **flags: object) -> config.Settings:
    merged = {"store": args.store, "data_dir": args.data_dir} | flags
    return config.load(merged, args.config)


@asynccontextmanager
async def existing_store(url: str) -> AsyncIterator[Store]:
    """The store at ``url``, open for writing, closed on leaving.  It is opened read-only
    first: a store that is missing is an error, not a new empty one."""
    from sidecar.store import create_store  # noqa: PLC0415 - only the verbs that write

    probe = create_store(url, read_only=True)
    await probe.open()
    await probe.close()
    async with create_store(url) as store:
        yield store
