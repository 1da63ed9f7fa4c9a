"""Where the shipped rule packs are, and which ones load when no ``--rules`` is given.

The packs are the top-level ``rules/`` folder of the source tree (an editable install or
the container image keep it beside the package); an installed wheel carries them under
``share/effect-sidecar/rules``.  Opt-in packs (``llm-cache.yaml``: it changes what an
agent sees from its model) load only when named.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sidecar.errors import ConfigError

DEFAULT_PACKS = (
    "github.yaml",
    "idempotency-key.yaml",
    "generic.yaml",
    "webhooks.yaml",
    "postgres.yaml",
)


def packs_dir() -> Path:
    for candidate in (
        Path(__file__).resolve().parents[2] / "rules",  # the source tree: beside sidecar/
        Path(sys.prefix) / "share" / "effect-sidecar" / "rules",
    ):
        if candidate.is_dir():
            return candidate
    raise ConfigError("the shipped rule packs are not installed; give --rules PATH")


def default_rule_paths() -> list[Path]:
    folder = packs_dir()
    return [folder / name for name in DEFAULT_PACKS if (folder / name).is_file()]
