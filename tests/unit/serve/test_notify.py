"""Events for a human reach the --notify URL: retried, bounded, counted."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from sidecar.errors import StaleGeneration
from sidecar.runtime.metrics import Metrics
from sidecar.serve.notify import Notifier
from sidecar.store.memory import MemoryStore
from sidecar.store.observed import MetricsObserver
from sidecar.testing.served import serving


def _count(metrics: Metrics, event: str, outcome: str) -> float:
    value = metrics.registry.get_sample_value(
        "sidecar_notifications_total", {"event": event, "outcome": outcome}
    )
    return value or 0.0


async def _receiver(answers: list[int], got: list[dict]) -> web.Application:
    async def receive(request: web.Request) -> web.Response:
        got.append(await request.json())
        return web.Response(status=answers.pop(0) if answers else 204)

    app = web.Application()
    app.router.add_post("/hook", receive)
    return app


async def test_a_refused_post_is_retried_and_a_client_error_is_not():
    got: list[dict] = []
    async with serving(await _receiver([503, 429, 204, 400], got)) as url:
        metrics = Metrics()
        notifier = Notifier(f"{url}/hook", metrics, source="pod-a", first_backoff_s=0.01)
        await notifier.start()
        notifier.announce("effect_blocked", {"task": "312", "effect_key": "k"})
        notifier.announce("lease_taken_over", {"task": "313"})
        await notifier.stop(drain_s=5)
    assert [e["event"] for e in got] == ["effect_blocked"] * 3 + ["lease_taken_over"]
    assert (got[0]["sidecar"], got[0]["task"]) == ("pod-a", "312")
    assert _count(metrics, "effect_blocked", "delivered") == 1
    assert _count(metrics, "lease_taken_over", "failed") == 1, "a 400 is not sent again"


async def test_the_queue_is_bounded_and_drops_the_oldest():
    metrics = Metrics()
    # Nothing listens on port 9: every post fails, slowly enough for the queue to fill.
    notifier = Notifier(
        "http://127.0.0.1:9/hook", metrics, source="s", queue_size=2, first_backoff_s=0.5
    )
    await notifier.start()
    for n in range(5):
        notifier.announce("stale_write_refused", {"n": n})
    await asyncio.sleep(0)
    assert _count(metrics, "stale_write_refused", "dropped") >= 2
    await notifier.stop(drain_s=0)


async def test_without_a_url_nothing_is_queued():
    notifier = Notifier(None, Metrics(), source="s")
    await notifier.start()
    notifier.announce("effect_blocked", {})
    await notifier.stop()


async def test_the_store_observer_announces_takeovers_and_refused_stale_writes(clock):
    told: list[tuple[str, dict]] = []
    store = MemoryStore(clock=clock)
    metrics = Metrics()
    store.observer = MetricsObserver(metrics, announce=lambda e, f: told.append((e, dict(f))))
    first = await store.claim("312", "a", 1)
    clock.advance(2)  # A's lease ran out: B takes the task over
    second = await store.claim("312", "b", 30)
    with pytest.raises(StaleGeneration):
        await store.append_checkpoint("312", first.attempt_id, first.generation, "LATE", {})
    assert [e for e, _ in told] == ["lease_taken_over", "stale_write_refused"]
    assert metrics.registry.get_sample_value("sidecar_lease_takeovers_total") == 1
    assert told[0][1]["previous_attempt_id"] == first.attempt_id
    assert (told[0][1]["worker"], told[0][1]["generation"]) == ("b", second.generation)
    assert told[1][1] == {
        "task": "312",
        "operation": "checkpoint",
        "attempt_id": first.attempt_id,
        "generation": first.generation,
        "current_generation": second.generation,
    }
