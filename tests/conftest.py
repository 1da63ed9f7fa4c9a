"""Fixtures shared by every layer of the suite."""

from __future__ import annotations

import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from itertools import count
from pathlib import Path

import psycopg
import pytest

from sidecar.runtime.clock import ManualClock
from sidecar.store import Store, create_store
from tests.support.postgres import server_url, unreachable

# The CLI fits its tables to COLUMNS; something in a test run may set it (80) for the
# processes the tests start.  Tables are checked whole unless a test sets a width itself.
os.environ.pop("COLUMNS", None)

type StoreFactory = Callable[[], Awaitable[Store]]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def sequential_ids() -> Callable[[], str]:
    numbers = count(1)
    return lambda: f"att-{next(numbers):04d}"


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def scratch_schema() -> str:
    """A fresh schema name for one PostgreSQL store under test."""
    return f"es_test_{secrets.token_hex(5)}"


def drop_schema(server: str, schema: str) -> None:
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def store_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """Where the parametrised backend keeps this test's data (a schema of its own on
    PostgreSQL, dropped afterwards)."""
    if backend == "memory":
        yield "memory://"
    elif backend == "sqlite":
        yield f"sqlite:///{tmp_path}/effects.db"
    else:
        server = request.getfixturevalue("postgres_server")
        schema = scratch_schema()
        yield f"{server}?schema={schema}"
        drop_schema(server, schema)


@pytest.fixture
async def open_store(
    backend: str, store_url: str, clock: ManualClock
) -> AsyncIterator[StoreFactory]:
    """Opens stores of the parametrised backend; a second call reopens the same data."""
    opened: list[Store] = []
    url = store_url
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
