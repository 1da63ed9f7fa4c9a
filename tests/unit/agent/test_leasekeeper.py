"""Keeping a task's lease for a worker: claim (waiting if asked), heartbeat, release, and
noticing when another worker's claim fenced this one.

Against a real SQLite store (and, for ``sidecar exec``'s side, the real control API over
the in-memory store): what is asserted is what the store then holds."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from sidecar.agent.leasekeeper import ControlLeases, Held, LeaseKeeper, StoreLeases
from sidecar.domain.model import AgentExit
from sidecar.errors import (
    LeaseHeld,
    NotFound,
    SidecarUnreachable,
    StaleGeneration,
    StoreUnavailable,
    TaskIsDone,
)
from sidecar.runtime.clock import ManualClock
from sidecar.store import Store, create_store
from tests.conftest import sequential_ids

TTL = 0.3  # seconds: a heartbeat every 0.1 s of real time


@pytest.fixture
async def store(tmp_path, clock: ManualClock) -> AsyncIterator[Store]:
    opened = create_store(
        f"sqlite:///{tmp_path}/effects.db", clock=clock, new_attempt_id=sequential_ids()
    )
    await opened.open()
    yield opened
    await opened.close()


def keeper_of(store: Store, worker: str = "worker-a", **options: Any) -> LeaseKeeper:
    return LeaseKeeper(StoreLeases(store), "312", worker, TTL, **options)


async def lease_of(store: Store):
    view = await store.task_view("312")
    assert view is not None
    return view.state.lease


async def test_acquiring_claims_a_new_attempt_and_the_store_names_its_worker(store, clock):
    keeper = keeper_of(store)
    held = await keeper.acquire()
    assert (held.task, held.attempt_id, held.generation) == ("312", "att-0001", 1)
    lease = await lease_of(store)
    assert (lease.worker, lease.attempt_id, lease.expires_at) == (
        "worker-a",
        "att-0001",
        held.expires_at,
    )
    assert keeper.held == held


async def test_the_claim_carries_the_checkpoint_the_attempt_resumes_from(store, clock):
    first = await keeper_of(store).acquire()
    await store.append_checkpoint("312", first.attempt_id, first.generation, "READ_COMPLETE", {})
    clock.advance(TTL)
    again = await keeper_of(store, "worker-b").acquire()
    assert again.generation == 2
    assert again.last_checkpoint is not None
    assert again.last_checkpoint.stage == "READ_COMPLETE"


async def test_a_live_lease_of_another_worker_is_refused_without_waiting(store):
    await keeper_of(store, "worker-b").acquire()
    keeper = keeper_of(store)
    with pytest.raises(LeaseHeld) as refused:
        await keeper.acquire(wait_s=0)
    assert refused.value.holder == "worker-b"
    assert keeper.held is None
    assert (await lease_of(store)).worker == "worker-b"


async def test_a_waiting_claim_gets_the_lease_once_its_holder_lets_go(store):
    other = keeper_of(store, "worker-b")
    await other.acquire()
    waits: list[str] = []

    async def let_go_soon() -> None:
        await asyncio.sleep(0.2)
        await other.release()

    letting_go = asyncio.ensure_future(let_go_soon())
    held = await keeper_of(store).acquire(wait_s=2, on_wait=lambda h, _: waits.append(h.holder))
    await letting_go
    assert waits, "it said it waited"
    assert set(waits) == {"worker-b"}, "... and for whom"
    assert held.generation == 2
    assert (await lease_of(store)).worker == "worker-a"


async def test_a_waiting_claim_gives_up_when_its_wait_is_over(store):
    await keeper_of(store, "worker-b").acquire()
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(LeaseHeld):
        await keeper_of(store).acquire(wait_s=0.2)
    assert 0.2 <= loop.time() - started < 2


async def test_heartbeats_keep_the_lease_ahead_of_the_clock(store, clock):
    api = Beats(store)
    keeper = LeaseKeeper(api, "312", "worker-a", TTL)
    first = await keeper.acquire()
    keeping = asyncio.ensure_future(keeper.keep())
    clock.advance(TTL * 0.9)  # without a heartbeat the lease would run out in 0.03 s
    await api.wait_for_beats(1)
    keeping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await keeping
    assert keeper.held is not None
    assert keeper.held.expires_at > first.expires_at
    assert (await lease_of(store)).expires_at == keeper.held.expires_at
    assert keeper.lost is None


async def test_a_fenced_heartbeat_stops_the_keeping_and_says_the_lease_was_lost(store, clock):
    told: list[StaleGeneration] = []
    keeper = keeper_of(store, on_lost=told.append)
    held = await keeper.acquire()
    clock.advance(TTL)  # expired: another worker takes the task over
    await keeper_of(store, "worker-b").acquire()
    await asyncio.wait_for(keeper.keep(), timeout=2)  # returns on its own
    assert keeper.lost is not None
    assert told == [keeper.lost]
    assert (keeper.lost.attempt_id, keeper.lost.generation) == (held.attempt_id, 1)
    assert [r.operation for r in await store.refusals("312")] == ["heartbeat"]


class Beats(StoreLeases):
    """The store's leases, counting heartbeats; the first ``failures`` are lost on the way."""

    def __init__(self, store: Store, failures: int = 0) -> None:
        super().__init__(store)
        self.failures = failures
        self.beats = 0
        self._beat = asyncio.Condition()

    async def heartbeat(self, held: Held, ttl_s: float) -> Held:
        try:
            if self.beats < self.failures:
                raise StoreUnavailable("the store is briefly away")
            return await super().heartbeat(held, ttl_s)
        finally:
            self.beats += 1
            async with self._beat:
                self._beat.notify_all()

    async def wait_for_beats(self, count: int) -> None:
        async with asyncio.timeout(5), self._beat:
            await self._beat.wait_for(lambda: self.beats >= count)


async def test_a_heartbeat_that_fails_for_a_while_is_tried_again(store, clock):
    api = Beats(store, failures=2)
    keeper = LeaseKeeper(api, "312", "worker-a", TTL)
    first = await keeper.acquire()
    keeping = asyncio.ensure_future(keeper.keep())
    clock.advance(0.1)
    await api.wait_for_beats(3)
    keeping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await keeping
    assert keeper.lost is None
    assert keeper.held is not None
    assert keeper.held.expires_at > first.expires_at, "the third beat went through"


async def test_releasing_gives_the_lease_up_and_keeps_how_the_agent_ended(store):
    keeper = keeper_of(store)
    held = await keeper.acquire()
    await keeper.release(AgentExit(exit_code=3))
    lease = await lease_of(store)
    assert lease is None or lease.released_at is not None
    attempt = await store.attempt(held.attempt_id)
    assert attempt.exit == AgentExit(exit_code=3)
    assert attempt.how() == "exit 3"
    assert await keeper_of(store, "worker-b").acquire(), "the task is free for the next worker"


async def test_releasing_what_was_never_held_does_nothing(store):
    await keeper_of(store).release(AgentExit(exit_code=0))
    assert await store.task_view("312") is None


async def test_after_a_lost_lease_a_bare_release_asks_nothing_of_the_store(store, clock):
    keeper = keeper_of(store)
    await keeper.acquire()
    clock.advance(TTL)
    await keeper_of(store, "worker-b").acquire()
    await asyncio.wait_for(keeper.keep(), timeout=2)
    await keeper.release()
    assert [r.operation for r in await store.refusals("312")] == ["heartbeat"]
    assert (await lease_of(store)).worker == "worker-b", "the new holder keeps its lease"


async def test_after_a_lost_lease_the_agents_end_is_still_kept_with_its_attempt(store, clock):
    keeper = keeper_of(store)
    held = await keeper.acquire()
    clock.advance(TTL)
    await keeper_of(store, "worker-b").acquire()
    await asyncio.wait_for(keeper.keep(), timeout=2)
    await keeper.release(AgentExit(signal="SIGTERM", lease_lost=True))
    assert (await store.attempt(held.attempt_id)).exit == AgentExit(
        signal="SIGTERM", lease_lost=True
    )
    assert (await lease_of(store)).worker == "worker-b"


async def test_a_release_refused_as_stale_marks_the_lease_lost(store, clock):
    keeper = keeper_of(store)
    await keeper.acquire()  # no heartbeats: the agent ended before the next one
    clock.advance(TTL)
    await keeper_of(store, "worker-b").acquire()
    await keeper.release(AgentExit(exit_code=0))
    assert isinstance(keeper.lost, StaleGeneration)
    assert "release" in [r.operation for r in await store.refusals("312")]


# ---- through a sidecar's control API (``sidecar exec``) ------------------------------


@pytest.fixture
async def control(client) -> ControlLeases:
    return ControlLeases(client.session, str(client.make_url("/")))


async def test_the_control_api_grants_heartbeats_and_releases_a_lease(control, memory_store):
    keeper = LeaseKeeper(control, "312", "worker-a", 60)
    held = await keeper.acquire()
    assert (held.attempt_id, held.generation) == ("att-0001", 1)
    beat = await control.heartbeat(held, 120)
    assert beat.expires_at > held.expires_at
    await keeper.release(AgentExit(exit_code=127, error="command not found"))
    attempt = await memory_store.attempt(held.attempt_id)
    assert attempt.exit == AgentExit(exit_code=127, error="command not found")


async def test_the_control_api_hands_back_the_last_checkpoint(control, memory_store, clock):
    first = await control.claim("312", "worker-a", 1)
    await memory_store.append_checkpoint(
        "312", first.attempt_id, first.generation, "PATCHED", {"sha": "abc"}
    )
    clock.advance(1)
    again = await control.claim("312", "worker-b", 1)
    assert again.last_checkpoint is not None
    assert (again.last_checkpoint.stage, again.last_checkpoint.outputs) == (
        "PATCHED",
        {"sha": "abc"},
    )


async def test_the_control_apis_refusals_come_back_as_the_errors_they_name(
    control, memory_store, clock
):
    first = await control.claim("312", "worker-a", 1)
    with pytest.raises(LeaseHeld) as held:
        await control.claim("312", "worker-b", 1)
    assert (held.value.holder, held.value.attempt_id) == ("worker-a", first.attempt_id)
    clock.advance(1)
    await control.claim("312", "worker-b", 1)
    with pytest.raises(StaleGeneration) as stale:
        await control.heartbeat(first, 1)
    assert (stale.value.generation, stale.value.current_generation) == (1, 2)
    with pytest.raises(NotFound):
        await control.heartbeat(Held("nope", "att-x", 1, first.expires_at), 1)
    clock.advance(1)
    await memory_store.mark_done("312", "operator")
    with pytest.raises(TaskIsDone) as done:
        await control.claim("312", "worker-c", 1)
    assert done.value.task == "312"


async def test_no_sidecar_at_the_control_address_is_said_plainly(unused_tcp_port):
    async with aiohttp.ClientSession() as session:
        control = ControlLeases(session, f"http://127.0.0.1:{unused_tcp_port}/")
        with pytest.raises(SidecarUnreachable, match="no sidecar answers at"):
            await control.claim("312", "worker-a", 1)
