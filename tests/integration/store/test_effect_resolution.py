"""A human settles an effect (SPEC §3.10): one command, the same on every store."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sidecar.domain import settling
from sidecar.domain.effects import abandonment
from sidecar.domain.model import EffectState
from sidecar.errors import EffectAbandoned, NotFound, NotWaitingForAHuman
from sidecar.store.commands import ResolveEffect
from sidecar.store.settle import landing_of, resolve_effect

KEY = "acme/app#thing:x"
LANDING = timedelta(seconds=10)


def landing(_rule: str) -> timedelta:
    return LANDING


async def blocked(store, clock, *, release=True, task="312", kind="http"):
    """An effect sent by attempt 1 whose answer never came; attempt 1 is over."""
    a = await store.claim(task, "worker-a", 60)
    await store.record_pending(
        task, KEY, a.attempt_id, a.generation, kind=kind, rule="test.things.blocked",
        fingerprint="f1", idempotency_key=f"{a.attempt_id}:0123456789abcdef", request={},
    )  # fmt: skip
    await store.transition_effect(
        task, KEY, a.attempt_id, a.generation, EffectState.UNKNOWN, detail="no answer within 1s"
    )
    if release:
        await store.release(task, a.attempt_id, a.generation)
    return a


def resolution(outcome, response=None):
    return settling.Resolution(settling.Outcome(outcome), "alice@ops", "checked upstream", response)


async def test_completed_records_the_evidence_and_audits_it(store, clock):
    await blocked(store, clock)
    clock.advance(11)
    evidence = settling.evidence(201, {"X-Thing": "42"}, {"id": "thing_42"})
    effect = await resolve_effect(store, "312", KEY, resolution("completed", evidence), landing)
    assert effect.state is EffectState.COMPLETED
    stored = await store.effect("312", KEY)
    assert stored.state is EffectState.COMPLETED
    assert stored.response.status == 201
    assert stored.response.body == b'{"id":"thing_42"}'
    assert ("content-type", "application/json") in stored.response.headers
    assert stored.idempotency_key == effect.idempotency_key
    last = (await store.effect_events_of([("312", KEY)]))[-1]
    assert last.event == "resolved"
    assert "completed by alice@ops: checked upstream" in last.detail
    assert "status 201" in last.detail


async def test_failed_keeps_the_first_idempotency_key_for_the_resend(store, clock):
    a = await blocked(store, clock)
    clock.advance(11)
    effect = await resolve_effect(store, "312", KEY, resolution("failed"), landing)
    assert effect.state is EffectState.FAILED
    assert abandonment(effect) is None
    # The next attempt reopens it, as any failed effect, with the first key.
    b = await store.claim("312", "worker-b", 60)
    reopened = await store.transition_effect(
        "312", KEY, b.attempt_id, b.generation, EffectState.PENDING, detail="sent again"
    )
    assert reopened.idempotency_key == f"{a.attempt_id}:0123456789abcdef"
    events = [e.event for e in await store.effect_events_of([("312", KEY)])]
    assert events == ["pending", "unknown", "resolved", "pending"]


async def test_abandoned_is_failed_for_good(store, clock):
    await blocked(store, clock)
    clock.advance(11)
    effect = await resolve_effect(store, "312", KEY, resolution("abandoned"), landing)
    assert effect.state is EffectState.FAILED
    refusal = abandonment(await store.effect("312", KEY))
    assert refusal is not None
    assert (refusal.by, refusal.note) == ("alice@ops", "checked upstream")
    b = await store.claim("312", "worker-b", 60)
    with pytest.raises(EffectAbandoned) as refused:
        await store.transition_effect(
            "312", KEY, b.attempt_id, b.generation, EffectState.PENDING, detail="sent again"
        )
    assert refused.value.code == "effect_abandoned"
    with pytest.raises(NotWaitingForAHuman, match="abandoned already by alice@ops"):
        await resolve_effect(store, "312", KEY, resolution("failed"), landing)


async def test_settled_effects_are_not_waiting_for_a_human(store, clock):
    await blocked(store, clock)
    clock.advance(11)
    evidence = settling.evidence(200, None, None)
    await resolve_effect(store, "312", KEY, resolution("completed", evidence), landing)
    with pytest.raises(NotWaitingForAHuman) as refused:
        await resolve_effect(store, "312", KEY, resolution("failed"), landing)
    assert refused.value.code == "not_waiting_for_a_human"
    assert "completed" in refused.value.detail
    events = [e.event for e in await store.effect_events_of([("312", KEY)])]
    assert events.count("resolved") == 1


async def test_not_while_the_sender_may_still_land_it(store, clock):
    a = await blocked(store, clock, release=False)
    with pytest.raises(NotWaitingForAHuman, match="has not ended"):
        await resolve_effect(store, "312", KEY, resolution("failed"), landing)
    await store.release("312", a.attempt_id, a.generation)
    clock.advance(4)
    with pytest.raises(NotWaitingForAHuman, match="could still land") as early:
        await resolve_effect(store, "312", KEY, resolution("failed"), landing)
    assert early.value.retry_after_s == pytest.approx(6)
    clock.advance(6)
    assert (await resolve_effect(store, "312", KEY, resolution("failed"), landing)).state is (
        EffectState.FAILED
    )


async def test_a_blocked_attempt_that_never_sent_it_does_not_hold_it_up(store, clock):
    await blocked(store, clock)
    clock.advance(11)
    b = await store.claim("312", "worker-b", 60)  # live, refused with 409: sent nothing
    await store.note_effect("312", KEY, b.attempt_id, b.generation, "blocked", "refused")
    effect = await resolve_effect(store, "312", KEY, resolution("failed"), landing)
    assert effect.state is EffectState.FAILED


async def test_a_change_meanwhile_refuses_the_resolution(store, clock):
    await blocked(store, clock)
    clock.advance(11)
    seen = (await store.effect("312", KEY)).updated_at
    b = await store.claim("312", "worker-b", 60)
    await store.transition_effect(
        "312", KEY, b.attempt_id, b.generation, EffectState.PENDING, detail="sent again"
    )
    command = ResolveEffect("312", KEY, resolution("failed"), clock.now(), seen_at=seen)
    with pytest.raises(NotWaitingForAHuman, match="changed while"):
        await store.execute(command)
    assert (await store.effect("312", KEY)).state is EffectState.PENDING


async def test_unknown_task_or_effect_is_not_found(store, clock):
    with pytest.raises(NotFound, match="never been claimed"):
        await resolve_effect(store, "nope", KEY, resolution("failed"), landing)
    await blocked(store, clock)
    with pytest.raises(NotFound, match="no effect"):
        await resolve_effect(store, "312", "other", resolution("failed"), landing)


async def test_sql_effects_are_left_to_the_relay(store, clock):
    await blocked(store, clock, kind="sql")
    clock.advance(11)
    with pytest.raises(NotWaitingForAHuman, match="SQL statement"):
        await resolve_effect(store, "312", KEY, resolution("failed"), landing)


async def test_completed_needs_evidence_for_http(store, clock):
    await blocked(store, clock)
    clock.advance(11)
    with pytest.raises(Exception, match="needs the response"):
        await resolve_effect(store, "312", KEY, resolution("completed"), landing)
    assert (await store.effect("312", KEY)).state is EffectState.UNKNOWN


def test_landing_windows_come_from_the_rules():
    window = landing_of(None)("anything")
    assert window == timedelta(seconds=30 + 2 * 30)  # the rule defaults
