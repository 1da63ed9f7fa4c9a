"""What later attempts meet once a human settled a blocked effect (SPEC §3.10)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sidecar.domain import settling
from sidecar.domain.model import EffectState
from sidecar.runtime.clock import ManualClock
from sidecar.store.settle import landing_of, resolve_effect
from tests.unit.proxy.test_guard import World, call, make_world, reply, request

RULES = """
rules:
  - name: things.blocked
    match: {host: things.test, method: POST, path: /things}
    effect: non_idempotent
    key: "acme/app#thing:{body.name}"
    idempotency_header: Idempotency-Key
    on_unknown: block
    timeout_s: 0.05
    settle_s: 0.1
"""
KEY = "acme/app#thing:x"


@pytest.fixture
def world(tmp_path: Path, clock: ManualClock) -> World:
    return make_world(RULES, tmp_path, clock)


def thing():
    return request("things.test", "/things", {"name": "x"})


async def blocked_then_resolved(world: World, clock: ManualClock, outcome: str, response=None):
    """Attempt 1's answer is a 502 (unknown); attempt 2 is refused; a human resolves."""
    store = world.store
    a = await store.claim("312", "a", 60)
    world.upstream.answers.append(reply(502, {}))
    assert (await call(world, "312", thing())).status == 502
    await store.release("312", a.attempt_id, a.generation)
    b = await store.claim("312", "b", 60)
    for _ in range(2):  # refused twice, audited once
        refused = await call(world, "312", thing())
        assert refused.status == 409
        assert json.loads(refused.body)["code"] == "effect_unknown"
    await asyncio.sleep(0.01)  # the audit line is written in the background
    clock.advance(1)
    resolution = settling.Resolution(
        settling.Outcome(outcome), "alice@ops", "checked the dashboard", response
    )
    await resolve_effect(store, "312", KEY, resolution, landing_of(world.rules))
    return a, b


async def test_a_refusal_for_a_human_is_in_the_audit_trail_once_per_attempt(world, clock):
    _, b = await blocked_then_resolved(
        world, clock, "completed", settling.evidence(201, None, {"id": 1})
    )
    trail = await world.store.effect_events_of([("312", KEY)])
    blocked = [e for e in trail if e.event == "blocked"]
    assert [(e.attempt_id, e.detail) for e in blocked] == [
        (b.attempt_id, "refused: CANNOT DETERMINE, waits for a human")
    ]
    assert trail[-1].event == "resolved"


async def test_completed_answers_later_attempts_with_the_evidence(world, clock):
    evidence = settling.evidence(201, {"X-Thing": "t1"}, {"id": "thing_1"})
    await blocked_then_resolved(world, clock, "completed", evidence)
    answer = await call(world, "312", thing())
    assert (answer.status, answer.disposition) == (201, "replayed")
    headers = dict(answer.headers)
    assert headers["X-Sidecar-Effect"] == "replayed"
    assert headers["X-Thing"] == "t1"
    assert json.loads(answer.body) == {"id": "thing_1"}
    assert len(world.upstream.sent) == 1


async def test_failed_is_sent_again_once_with_the_first_idempotency_key(world, clock):
    await blocked_then_resolved(world, clock, "failed")
    world.upstream.answers.append(reply(201, {"id": "thing_1"}))
    answer = await call(world, "312", thing())
    assert (answer.status, answer.disposition) == (201, "recorded")
    assert (await call(world, "312", thing())).disposition == "replayed"
    sent = world.upstream.sent
    assert len(sent) == 2
    assert sent[0][2]["Idempotency-Key"] == sent[1][2]["Idempotency-Key"]
    assert sent[0][2]["Idempotency-Key"].startswith("att-0001:")
    assert (await world.store.effect("312", KEY)).state is EffectState.COMPLETED


async def test_abandoned_is_refused_clearly_and_never_sent(world, clock):
    await blocked_then_resolved(world, clock, "abandoned")
    for _ in range(2):
        answer = await call(world, "312", thing())
        assert answer.status == 409
        problem = json.loads(answer.body)
        assert problem["code"] == "effect_abandoned"
        assert problem["abandoned_by"] == "alice@ops"
        assert problem["note"] == "checked the dashboard"
        assert "abandoned by alice@ops" in problem["detail"]
        assert dict(answer.headers)["X-Sidecar-Effect"] == "refused"
    assert len(world.upstream.sent) == 1
