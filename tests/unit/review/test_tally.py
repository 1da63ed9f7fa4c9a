"""The review's arithmetic: percentiles, and stage durations against the lease."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sidecar.domain.model import EffectEvent
from sidecar.review.tally import EventTally, StageTally, percentile, percentiles, settlement
from sidecar.store.base import StageRow

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def row(attempt: str, seq: int, after_claim_s: float, ttl_s: float = 100.0, stage: str = "S"):  # type: ignore[no-untyped-def]
    return StageRow("t", seq, stage, attempt, T0 + timedelta(seconds=after_claim_s), T0,
                    None, None, ttl_s)  # fmt: skip


def test_percentile_is_nearest_rank_and_one_of_the_values() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 95) == 95.0
    assert percentile(values, 100) == 100.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([], 50) is None


def test_percentiles_are_reported_in_milliseconds() -> None:
    found = percentiles([0.001, 0.002, 0.010])
    assert (found.count, found.p50_ms, found.max_ms) == (3, 2.0, 10.0)


def test_a_stage_runs_from_the_previous_checkpoint_of_its_attempt_or_from_the_claim() -> None:
    tally = StageTally()
    for r in (row("a1", 1, 30), row("a1", 2, 120), row("a2", 3, 10)):
        tally.add(r)
    seconds = sorted(s for s, _ in tally.by_stage["S"])
    assert seconds == [10.0, 30.0, 90.0]


def test_stages_near_and_over_the_lease_are_counted() -> None:
    tally = StageTally()
    for r in (row("a1", 1, 50), row("a2", 2, 85), row("a3", 3, 130)):
        tally.add(r)
    leases = tally.figures()
    assert (leases.stages, leases.near_lease, leases.over_lease) == (3, 2, 1)
    assert {b.label: b.count for b in leases.ratio_buckets} == {
        "0-20%": 0, "20-40%": 0, "40-60%": 1, "60-80%": 0, "80-100%": 1, "over 100%": 1,
    }  # fmt: skip
    assert leases.by_stage[0].lease_s == 100.0


def test_replays_divergent_replays_and_human_settlements_are_told_apart() -> None:
    tally = EventTally()

    def event(name: str, detail: str | None = None, key: str = "k") -> EffectEvent:
        return EffectEvent("t", key, name, "att", 2, T0, detail)

    tally.add(event("replayed"))
    tally.add(event("replayed", "payload differs from the recorded one"))
    tally.add(event("divergent", "rejected: payload differs"))
    tally.add(event("blocked", key="k2"))
    tally.add(event("resolved", "failed by bob@ops: nothing arrived (the next attempt ...)", "k2"))
    assert tally.duplicates().model_dump() == {
        "replays": 2, "divergent_replays": 1, "divergent_rejected": 1, "effects_replayed": 1,
    }  # fmt: skip
    humans = tally.humans(waiting_now=0)
    assert (humans.waited, humans.attempts_blocked, humans.settled) == (1, 1, {"failed": 1})


def test_a_resolution_line_names_who_settled_how_and_why() -> None:
    line = "completed by alice@ops: saw PR #7 (evidence: status 201)"
    found = settlement(EffectEvent("t", "k", "resolved", "att", 1, T0, line))
    assert (found.outcome, found.by, found.note) == ("completed", "alice@ops", "saw PR #7")
