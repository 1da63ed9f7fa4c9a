"""Flags shared by several verbs, and turning them into :class:`Settings`."""

from __future__ import annotations

import argparse
from pathlib import Path

from sidecar import config


def add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=Path, metavar="FILE", help="YAML file of settings (keys as the flags)"
    )
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
