"""A control app over the in-memory store and a manual clock: the control API's route
tests, and the parts that act through it (the PostgreSQL relay's writes before a release)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from sidecar.control.app import make_app
from sidecar.runtime.clock import ManualClock
from sidecar.runtime.metrics import Metrics
from sidecar.store.memory import MemoryStore
from sidecar.store.observed import MetricsObserver
from tests.conftest import sequential_ids

type Client = TestClient[Any, Any]


@pytest.fixture
def memory_store(clock: ManualClock) -> MemoryStore:
    return MemoryStore(clock=clock, new_attempt_id=sequential_ids())


@pytest.fixture
def make_client(
    aiohttp_client: Callable[..., Awaitable[Client]], memory_store: MemoryStore, clock: ManualClock
) -> Callable[..., Awaitable[Client]]:
    async def make(token: str | None = None, store: Any = None, **options: Any) -> Client:
        metrics = Metrics()
        used = store or memory_store
        used.observer = MetricsObserver(metrics)
        app = make_app(used, metrics=metrics, clock=clock, token=token, **options)
        return await aiohttp_client(app)

    return make


@pytest.fixture
async def client(make_client: Callable[..., Awaitable[Client]]) -> Client:
    return await make_client()


async def claim(client: Client, task: str = "312", worker: str = "worker-a", ttl: float = 2):
    response = await client.post(f"/v1/tasks/{task}/claim", json={"worker": worker, "ttl_s": ttl})
    assert response.status == 200, await response.text()
    return await response.json()
