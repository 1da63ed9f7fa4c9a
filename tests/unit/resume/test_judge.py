"""What resume predicts the next attempt does with each effect, and the verdict."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sidecar.domain.effects import ABANDONED_DETAIL, ABANDONED_HEADER
from sidecar.domain.model import Effect, EffectState, RecordedResponse
from sidecar.resume.judge import absence_proven_at, judge, verdict, wants_probe
from sidecar.resume.model import EffectCheck, Found, Next, Probed, Verdict
from sidecar.rules.model import Rule

T0 = datetime(2026, 1, 1, 14, 0, tzinfo=UTC)
PROBE = {
    "request": {"method": "GET", "path": "/things?name={body.name}"},
    "found": "length(@) > `0`",
    "answer": {"status": 201, "body": "[0]"},
}


def rule(**fields: Any) -> Rule:
    base: dict[str, Any] = {
        "name": "things.create",
        "match": {"host": "api.test", "method": "POST", "path": "/things"},
        "effect": "non_idempotent",
        "timeout_s": 10,
        "settle_s": 5,
    }
    return Rule.model_validate(base | fields)


def effect(state: EffectState = EffectState.UNKNOWN, **fields: Any) -> Effect:
    made = Effect(
        task="312",
        key="thing:gear",
        state=state,
        kind="http",
        rule="things.create",
        origin_attempt_id="att-1",
        attempt_id="att-1",
        generation=1,
        fingerprint="sha256:x",
        idempotency_key="att-1:abc",
        request={"method": "POST", "url": "https://api.test/things"},
        created_at=T0,
        updated_at=T0,
    )
    return replace(made, **fields)


def check(e: Effect, r: Rule | None, probed: Probed | None = None, **kw: Any) -> EffectCheck:
    return judge(
        e, r, probed, now=kw.get("now", T0 + timedelta(hours=1)), lease_until=kw.get("lease_until")
    )


def test_a_completed_effect_is_replayed_and_a_failed_one_sent_again() -> None:
    done = effect(EffectState.COMPLETED, response=RecordedResponse(201))
    assert check(done, rule()).next is Next.REPLAY
    failed = check(effect(EffectState.FAILED, detail="upstream answered 422"), rule())
    assert (failed.next, failed.found) == (Next.SEND, Found.NOT_PROBED)
    assert "first idempotency key" in failed.why


def test_an_abandoned_effect_is_refused() -> None:
    abandoned = effect(
        EffectState.FAILED,
        detail=f"{ABANDONED_DETAIL}ops@host: not wanted",
        response=RecordedResponse(409, ((ABANDONED_HEADER, "ops@host"),)),
    )
    assert check(abandoned, rule()).next is Next.REFUSE


def test_no_probe_and_no_safe_retry_waits_for_a_human() -> None:
    blocked = check(effect(), rule(on_unknown="block"))
    assert (blocked.found, blocked.next) == (Found.CANNOT_PROBE, Next.HUMAN)
    assert "sidecar effects resolve" in blocked.why


def test_a_rule_not_loaded_waits_for_a_human() -> None:
    assert check(effect(), None).next is Next.HUMAN


def test_a_safe_retry_and_a_model_call_are_sent_again() -> None:
    retry = check(effect(), rule(on_unknown="retry", idempotency_header="Idempotency-Key"))
    assert (retry.found, retry.next) == (Found.CANNOT_PROBE, Next.SEND)
    assert "Idempotency-Key" in retry.why
    assert check(effect(), rule(effect="cache")).next is Next.SEND


def test_found_by_a_probe_is_replayed() -> None:
    found = check(
        effect(), rule(on_unknown="probe", probe=PROBE), Probed(found=Found.FOUND, evidence="GET")
    )
    assert (found.found, found.next) == (Found.FOUND, Next.REPLAY)


def test_a_probe_that_fails_is_cannot_determine() -> None:
    failed = Probed(found=Found.CANNOT_PROBE, evidence="probe answered 500")
    assert check(effect(), rule(on_unknown="probe", probe=PROBE), failed).next is Next.HUMAN


def test_not_found_is_proof_only_once_the_first_try_can_no_longer_land() -> None:
    probed = rule(on_unknown="probe", probe=PROBE)
    absent = Probed(found=Found.NOT_FOUND, evidence="GET answered 200")
    lease_until = T0 + timedelta(seconds=30)
    # updated T0 + 10 + 5 = T0+15; the lease until T0+30 + 10 = T0+40; then settle 5 more
    proven = absence_proven_at(effect(), probed, lease_until)
    assert proven == T0 + timedelta(seconds=45)
    early = check(
        effect(), probed, absent, now=proven - timedelta(seconds=1), lease_until=lease_until
    )
    assert (early.found, early.next, early.wait_until) == (Found.WAIT, Next.WAIT, proven)
    late = check(effect(), probed, absent, now=proven, lease_until=lease_until)
    assert (late.found, late.next) == (Found.NOT_FOUND, Next.SEND)


def test_not_found_with_an_idempotency_key_is_sent_again_at_once() -> None:
    keyed = rule(on_unknown="probe", probe=PROBE, idempotency_header="Idempotency-Key")
    absent = Probed(found=Found.NOT_FOUND, evidence="GET answered 200")
    assert check(effect(), keyed, absent, now=T0).next is Next.SEND


def test_sql_statements_are_decided_by_their_record() -> None:
    sql = effect(kind="sql", request={"statement": "INSERT INTO t VALUES ($1)"})
    found = check(sql, None)
    assert (found.found, found.next) == (Found.BY_RECORD, Next.DATABASE)
    outside = effect(kind="sql", request={"statement": "CREATE INDEX CONCURRENTLY i ON t (a)"})
    assert check(outside, None).next is Next.SEND


def test_only_unsettled_effects_with_a_probe_are_probed() -> None:
    probed = rule(on_unknown="probe", probe=PROBE)
    assert wants_probe(effect(), probed)
    assert wants_probe(effect(EffectState.PENDING), probed)
    assert not wants_probe(effect(EffectState.COMPLETED), probed)
    assert not wants_probe(effect(), rule(on_unknown="block"))
    assert not wants_probe(effect(kind="sql"), probed)
    assert not wants_probe(effect(), None)


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ({"done": True, "held": True, "writable": False}, (Verdict.NOT_RESUMABLE, 1)),
        ({"held": True, "writable": False}, (Verdict.LEASE_HELD, 4)),
        ({"writable": False}, (Verdict.STORE_UNAVAILABLE, 5)),
        ({}, (Verdict.CANNOT_DETERMINE, 3)),
    ],
)
def test_the_first_condition_that_stops_a_resume_wins(
    conditions: dict[str, bool], expected: tuple[Verdict, int]
) -> None:
    stuck = [check(effect(), rule(on_unknown="block"))]
    given = {"done": False, "held": False, "writable": True} | conditions
    assert verdict(effects=stuck, **given) == expected


def test_safe_when_every_effect_is_replayed_or_sent() -> None:
    fine = [check(effect(EffectState.FAILED), rule()), check(effect(EffectState.COMPLETED), rule())]
    assert verdict(done=False, held=False, writable=True, effects=fine) == (Verdict.SAFE, 0)
    waiting = [check(effect(), rule(on_unknown="probe", probe=PROBE),
                     Probed(found=Found.NOT_FOUND, evidence="-"), now=T0)]  # fmt: skip
    assert verdict(done=False, held=False, writable=True, effects=waiting)[1] == 3
