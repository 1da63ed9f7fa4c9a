"""Fixtures shared by every layer of the suite."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from itertools import count
from pathlib import Path

import pytest

from sidecar.clock import ManualClock
from sidecar.store import Store, create_store
from sidecar.testing.postgres import server_url, unreachable

type StoreFactory = Callable[[], Awaitable[Store]]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def sequential_ids() -> Callable[[], str]:
    numbers = count(1)
    return lambda: f"att-{next(numbers):04d}"


@pytest.fixture(params=["memory", "sqlite"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def open_store(
    backend: str, tmp_path: Path, clock: ManualClock
) -> AsyncIterator[StoreFactory]:
    """Opens stores of the parametrised backend; a second call reopens the same data."""
    opened: list[Store] = []
    url = "memory://" if backend == "memory" else f"sqlite:///{tmp_path}/effects.db"
    ids = sequential_ids()
    memory: Store | None = None

    async def factory() -> Store:
        nonlocal memory
        if backend == "memory":
            if memory is None:
                memory = create_store(url, clock=clock, new_attempt_id=ids)
            store = memory  # memory:// has no "reopen": the same instance stands in for it
        else:
            store = create_store(url, clock=clock, new_attempt_id=ids)
        await store.open()
        opened.append(store)
        return store

    yield factory
    for store in opened:
        await store.close()


@pytest.fixture
async def store(open_store: StoreFactory) -> Store:
    return await open_store()


@pytest.fixture(scope="session")
def postgres_server() -> str:
    """The real PostgreSQL the suite runs against; its absence fails the run in CI."""
    problem = unreachable()
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{problem} (CI=true: PostgreSQL is a required service)")
        pytest.skip(problem)
    return server_url()
