"""A GitHub world (emulator, model, sidecar) per test, and the git pack with short timeouts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.rules.packs import packs_dir
from sidecar.testing.github import GitHubWorld


@pytest.fixture
def make_world(tmp_path: Path) -> Iterator[Any]:
    worlds: list[GitHubWorld] = []

    def make(**kwargs: Any) -> GitHubWorld:
        world = GitHubWorld.start(tmp_path / f"world{len(worlds)}", **kwargs)
        worlds.append(world)
        return world

    yield make
    for world in worlds:
        world.close()


@pytest.fixture
def quick_rules(tmp_path: Path) -> list[Path]:
    """The shipped github pack with a 2 s upstream timeout (settle time follows it), and
    the llm-cache pack: so an unknown outcome is settled in seconds, not half a minute."""
    pack = yaml.safe_load((packs_dir() / "github.yaml").read_text())
    for rule in pack["rules"]:
        if rule["effect"] == "non_idempotent":
            rule["timeout_s"] = 2
    path = tmp_path / "github-quick.yaml"
    path.write_text(yaml.safe_dump(pack))
    return [path, packs_dir() / "llm-cache.yaml"]


def lines(agent: Any) -> list[str]:
    return list(agent.lines)
