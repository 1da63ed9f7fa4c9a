"""A scratch database on the real PostgreSQL, the sidecar in front of it, agents under it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.postgres import PostgresWorld

HERE = Path(__file__).parent
AGENTS = HERE / "agents"

type MakeWorld = Callable[..., PostgresWorld]


@pytest.fixture
def make_world(tmp_path: Path, postgres_server: str) -> Iterator[MakeWorld]:
    worlds: list[PostgresWorld] = []

    def make(**kwargs: Any) -> PostgresWorld:
        world = PostgresWorld.start(tmp_path / f"world{len(worlds)}", **kwargs)
        worlds.append(world)
        return world

    yield make
    for world in worlds:
        world.close()


@pytest.fixture
def world(make_world: MakeWorld) -> PostgresWorld:
    return make_world()


def events(effect: dict[str, Any]) -> list[str]:
    return [event["event"] for event in effect["events"]]
