"""Claim, heartbeat, release and fencing, decided with no store and no sleeping."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sidecar.domain import leases
from sidecar.domain.model import AttemptEnd, TaskState
from sidecar.errors import InvalidRequest, LeaseHeld, NotFound, StaleGeneration
from sidecar.runtime.clock import ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def claimed(clock: ManualClock, worker: str = "a", ttl: float = 10) -> TaskState:
    return leases.claim(None, "312", worker, ttl, clock.now(), "att-1").state


def test_first_claim_starts_generation_one_with_a_lease_until_now_plus_ttl(clock):
    outcome = leases.claim(None, "312", "a", 10, clock.now(), "att-1")
    assert outcome.state.generation == 1
    assert outcome.attempt.attempt_id == "att-1"
    assert outcome.state.lease is not None
    assert outcome.state.lease.expires_at == clock.now() + timedelta(seconds=10)
    assert outcome.ended is None


def test_claim_is_refused_while_another_workers_lease_is_live(clock):
    state = claimed(clock)
    clock.advance(9.999)
    with pytest.raises(LeaseHeld) as refused:
        leases.claim(state, "312", "b", 10, clock.now(), "att-2")
    assert refused.value.holder == "a"
    assert refused.value.expires_at == state.lease.expires_at  # type: ignore[union-attr]


def test_claim_after_expiry_takes_over_with_the_next_generation(clock):
    state = claimed(clock)
    clock.advance(10)
    outcome = leases.claim(state, "312", "b", 10, clock.now(), "att-2")
    assert outcome.state.generation == 2
    assert outcome.ended == leases.EndedAttempt("att-1", AttemptEnd.EXPIRED, state.lease.expires_at)


def test_same_worker_reclaiming_a_live_lease_supersedes_its_previous_attempt(clock):
    state = claimed(clock)
    outcome = leases.claim(state, "312", "a", 10, clock.now(), "att-2")
    assert outcome.state.generation == 2
    assert outcome.ended is not None
    assert outcome.ended.attempt_id == "att-1"
    assert outcome.ended.reason is AttemptEnd.SUPERSEDED
    with pytest.raises(StaleGeneration):
        leases.fence(outcome.state, "312", "att-1", 1)


def test_claim_after_release_needs_no_waiting(clock):
    state = claimed(clock)
    released, _ = leases.release(state, "312", "att-1", 1, clock.now())
    outcome = leases.claim(released, "312", "b", 10, clock.now(), "att-2")
    assert outcome.state.generation == 2
    assert outcome.ended is None  # the released attempt had already ended


@pytest.mark.parametrize("ttl", [0, -1, float("nan")])
def test_claim_refuses_a_non_positive_ttl(clock, ttl):
    with pytest.raises(InvalidRequest):
        leases.claim(None, "312", "a", ttl, clock.now(), "att-1")


def test_heartbeat_extends_from_now_and_defaults_to_the_claims_ttl(clock):
    state = claimed(clock, ttl=10)
    clock.advance(8)
    renewed = leases.heartbeat(state, "312", "att-1", 1, None, clock.now())
    assert renewed.lease.expires_at == clock.now() + timedelta(seconds=10)  # type: ignore[union-attr]
    longer = leases.heartbeat(renewed, "312", "att-1", 1, 60, clock.now())
    assert longer.lease.expires_at == clock.now() + timedelta(seconds=60)  # type: ignore[union-attr]


def test_heartbeat_of_an_expired_but_untaken_lease_renews_it(clock):
    state = claimed(clock)
    clock.advance(30)
    renewed = leases.heartbeat(state, "312", "att-1", 1, None, clock.now())
    assert renewed.lease.is_live(clock.now())  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("attempt_id", "generation", "reason"),
    [
        ("att-1", 1, "superseded by generation 2"),
        ("att-2", 3, "was never issued"),
        ("att-forged", 2, "belongs to attempt att-2"),
    ],
)
def test_fence_refuses_old_forged_and_foreign_generations(clock, attempt_id, generation, reason):
    state = claimed(clock)
    clock.advance(10)
    state = leases.claim(state, "312", "b", 10, clock.now(), "att-2").state
    with pytest.raises(StaleGeneration, match=reason) as refused:
        leases.fence(state, "312", attempt_id, generation)
    assert refused.value.current_generation == 2


def test_fence_refuses_writes_after_release(clock):
    state = claimed(clock)
    released, _ = leases.release(state, "312", "att-1", 1, clock.now())
    with pytest.raises(StaleGeneration, match="released"):
        leases.fence(released, "312", "att-1", 1)
    with pytest.raises(StaleGeneration):
        leases.heartbeat(released, "312", "att-1", 1, None, clock.now())


def test_fence_of_a_task_never_claimed_is_not_found(clock):
    with pytest.raises(NotFound):
        leases.fence(None, "999", "att-1", 1)


def test_releasing_twice_is_a_no_op_for_the_same_attempt(clock):
    state = claimed(clock)
    once, changed = leases.release(state, "312", "att-1", 1, clock.now())
    twice, changed_again = leases.release(once, "312", "att-1", 1, clock.now())
    assert changed
    assert not changed_again
    assert twice == once
