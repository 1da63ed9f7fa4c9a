"""The effect state machine: pending first, completed forever, every change fenced."""

from __future__ import annotations

import pytest

from sidecar.domain import effects, leases
from sidecar.domain.model import EffectState, RecordedResponse
from sidecar.errors import EffectExists, InvalidTransition, StaleGeneration
from sidecar.runtime.clock import ManualClock

S = EffectState


def setup():
    clock = ManualClock()
    state = leases.claim(None, "312", "a", 10, clock.now(), "att-1").state
    effect, event = effects.record_pending(
        state,
        None,
        task="312",
        key="pr:agent/312",
        kind="http",
        rule="github.pulls.create",
        attempt_id="att-1",
        generation=1,
        fingerprint="f1",
        idempotency_key="att-1:abcd",
        request={"method": "POST"},
        now=clock.now(),
    )
    return clock, state, effect, event


def move(state, effect, to, attempt="att-1", generation=1, response=None):
    return effects.transition(
        state,
        effect,
        task="312",
        key=effect.key,
        to=to,
        attempt_id=attempt,
        generation=generation,
        now=ManualClock().now(),
        response=response,
    )[0]


def test_a_new_effect_is_recorded_pending_with_its_idempotency_key():
    _, _, effect, event = setup()
    assert effect.state is S.PENDING
    assert effect.idempotency_key == "att-1:abcd"
    assert effect.origin_attempt_id == "att-1"
    assert event.event == "pending"


def test_a_second_pending_for_the_same_key_returns_the_existing_record():
    clock, state, effect, _ = setup()
    with pytest.raises(EffectExists) as exists:
        effects.record_pending(
            state,
            effect,
            task="312",
            key=effect.key,
            kind="http",
            rule="r",
            attempt_id="att-1",
            generation=1,
            fingerprint="f2",
            idempotency_key=None,
            request={},
            now=clock.now(),
        )
    assert exists.value.existing == effect


def test_completed_needs_the_response_and_is_final():
    _, state, effect, _ = setup()
    with pytest.raises(InvalidTransition, match="needs the response"):
        move(state, effect, S.COMPLETED)
    done = move(state, effect, S.COMPLETED, response=RecordedResponse(201, (), b"{}"))
    for target in S:
        with pytest.raises(InvalidTransition):
            move(state, done, target, response=RecordedResponse(201))


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ([S.UNKNOWN, S.PENDING, S.COMPLETED], True),
        ([S.UNKNOWN, S.FAILED, S.PENDING], True),
        ([S.FAILED, S.COMPLETED], False),
        ([S.PENDING], False),
    ],
)
def test_transitions_follow_the_state_machine(path, allowed):
    _, state, effect, _ = setup()
    try:
        for target in path:
            effect = move(state, effect, target, response=RecordedResponse(200))
    except InvalidTransition:
        assert not allowed
    else:
        assert allowed


def test_a_later_attempt_resolves_an_unknown_effect_and_the_origin_is_kept():
    clock, state, effect, _ = setup()
    unknown = move(state, effect, S.UNKNOWN)
    clock.advance(11)
    state = leases.claim(state, "312", "b", 10, clock.now(), "att-2").state
    probed = move(state, unknown, S.COMPLETED, "att-2", 2, RecordedResponse(201))
    assert (probed.attempt_id, probed.generation) == ("att-2", 2)
    assert probed.origin_attempt_id == "att-1"
    assert probed.idempotency_key == "att-1:abcd"


def test_a_fenced_attempt_still_records_the_answer_to_its_own_forward():
    """SPEC §3.7: the answer to a request already sent is evidence, not a stale write."""
    clock, state, effect, _ = setup()
    clock.advance(11)
    state = leases.claim(state, "312", "b", 10, clock.now(), "att-2").state
    kept = move(state, effect, S.COMPLETED, response=RecordedResponse(201))
    assert (kept.state, kept.attempt_id, kept.generation) == (S.COMPLETED, "att-1", 1)


def test_a_released_attempt_still_records_the_answer_to_its_own_forward():
    _, state, effect, _ = setup()
    state, _ = leases.release(state, "312", "att-1", 1, ManualClock().now())
    assert move(state, effect, S.UNKNOWN).state is S.UNKNOWN


def test_a_stale_attempt_cannot_record_over_what_the_new_attempt_did():
    clock, state, effect, _ = setup()
    clock.advance(11)
    state = leases.claim(state, "312", "b", 10, clock.now(), "att-2").state
    taken = move(state, effect, S.UNKNOWN, "att-2", 2)
    with pytest.raises(StaleGeneration):
        move(state, taken, S.COMPLETED, response=RecordedResponse(201))


def test_a_stale_attempt_cannot_send_again():
    clock, state, effect, _ = setup()
    failed = move(state, effect, S.FAILED)
    clock.advance(11)
    state = leases.claim(state, "312", "b", 10, clock.now(), "att-2").state
    with pytest.raises(StaleGeneration):
        move(state, failed, S.PENDING)
