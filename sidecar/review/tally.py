"""The review's arithmetic, kept pure: percentiles, stage durations against the lease, and
the counting of audit lines.  Callers feed rows a page at a time; each tally keeps only
what its figures need (counters, durations as floats, a bounded list of examples)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from sidecar.domain.model import EffectEvent, FenceRefusal
from sidecar.review.figures import (
    Bucket,
    Duplicates,
    Humans,
    Leases,
    Percentiles,
    Refusals,
    RefusedWrite,
    Settlement,
    StageFigure,
    Uncovered,
    UncoveredTarget,
)
from sidecar.store.base import StageRow

#: the audit lines the review reads (see :mod:`sidecar.domain.effects`, NOTES).
REVIEWED_EVENTS = ("replayed", "divergent", "resolved", "blocked")
#: a ``replayed`` line with this detail answered a request whose payload differed.
DIVERGENT_REPLAY = "payload differs"
#: a stage this close to its lease (fraction of ttl_s) is "near the lease".
NEAR_LEASE = 0.8
#: the lease-fraction histogram's upper edges; the last bucket is "over the lease".
RATIO_EDGES = (0.2, 0.4, 0.6, 0.8, 1.0)
#: examples kept for the report's tables (the counts cover everything).
MAX_LISTED = 100


def percentile(values: Sequence[float], p: float) -> float | None:
    """The nearest-rank ``p``-th percentile (0 < p <= 100): the smallest value that at
    least ``p`` % of ``values`` do not exceed - always one of the values, never an
    interpolation; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def percentiles(seconds: Sequence[float]) -> Percentiles:
    """p50/p95/p99/max of durations in seconds, as milliseconds."""

    def ms(p: float) -> float | None:
        found = percentile(seconds, p)
        return None if found is None else round(found * 1000, 3)

    return Percentiles(
        count=len(seconds), p50_ms=ms(50), p95_ms=ms(95), p99_ms=ms(99), max_ms=ms(100)
    )


@dataclass
class EventTally:
    """Counts audit lines: replays (plain and divergent), rejected divergent replays,
    what waited for a human and how a human settled it."""

    replays: int = 0
    divergent_replays: int = 0
    divergent_rejected: int = 0
    blocked: int = 0
    replayed_effects: set[tuple[str, str]] = field(default_factory=set)
    waited: set[tuple[str, str]] = field(default_factory=set)
    outcomes: Counter[str] = field(default_factory=Counter)
    settlements: list[Settlement] = field(default_factory=list)

    def add(self, event: EffectEvent) -> None:
        slot = (event.task, event.key)
        match event.event:
            case "replayed":
                self.replays += 1
                self.replayed_effects.add(slot)
                if DIVERGENT_REPLAY in (event.detail or ""):
                    self.divergent_replays += 1
            case "divergent":
                self.divergent_rejected += 1
            case "blocked":
                self.blocked += 1
                self.waited.add(slot)
            case "resolved":
                self.waited.add(slot)
                settled = settlement(event)
                self.outcomes[settled.outcome] += 1
                if len(self.settlements) < MAX_LISTED:
                    self.settlements.append(settled)

    def duplicates(self) -> Duplicates:
        return Duplicates(
            replays=self.replays,
            divergent_replays=self.divergent_replays,
            divergent_rejected=self.divergent_rejected,
            effects_replayed=len(self.replayed_effects),
        )

    def humans(self, waiting_now: int) -> Humans:
        return Humans(
            waited=len(self.waited),
            attempts_blocked=self.blocked,
            settled=dict(sorted(self.outcomes.items())),
            settlements=self.settlements,
            waiting_now=waiting_now,
        )


def settlement(event: EffectEvent) -> Settlement:
    """A ``resolved`` line as who settled what, how and why.

    Its detail is written by :func:`sidecar.domain.settling.resolve` as ``OUTCOME by BY:
    NOTE (consequence)``; the consequence is dropped.  A ``by`` holding ": " would be
    split at the first one (``--by`` is a name, ``$USER@host`` by default)."""
    text = event.detail or ""
    outcome, _, rest = text.partition(" by ")
    by, _, note = rest.partition(": ")
    if note.endswith(")") and " (" in note:
        note = note[: note.rindex(" (")]
    return Settlement(
        at=event.at, task=event.task, key=event.key, outcome=outcome or "?", by=by, note=note
    )


@dataclass
class RefusalTally:
    total: int = 0
    by_operation: Counter[str] = field(default_factory=Counter)
    latest: list[RefusedWrite] = field(default_factory=list)

    def add(self, refusal: FenceRefusal) -> None:
        self.total += 1
        self.by_operation[refusal.operation] += 1
        self.latest.append(RefusedWrite.of(refusal))
        if len(self.latest) > MAX_LISTED:
            del self.latest[0]  # rows come oldest first: keep the newest

    def figures(self) -> Refusals:
        return Refusals(
            total=self.total,
            by_operation=dict(sorted(self.by_operation.items())),
            latest=self.latest,
        )


def uncovered_target(key: str) -> str:
    """What an uncovered write was: its key ``uncovered:METHOD HOST SHAPE#RANDOM``
    without the prefix and the random part that keeps each one apart."""
    return key.removeprefix("uncovered:").rsplit("#", 1)[0]


@dataclass
class UncoveredTally:
    total: int = 0
    targets: Counter[str] = field(default_factory=Counter)

    def add(self, key: str) -> None:
        self.total += 1
        self.targets[uncovered_target(key)] += 1

    def figures(self) -> Uncovered:
        top = self.targets.most_common(MAX_LISTED)
        return Uncovered(
            total=self.total, targets=[UncoveredTarget(target=t, count=n) for t, n in top]
        )


@dataclass
class StageTally:
    """Stage durations against the lease.

    A stage's duration is the time from the previous checkpoint of the same attempt - or,
    for an attempt's first checkpoint, from its claim - to the checkpoint that ends it.
    The lease it is set against is the ``ttl_s`` of the task's lease (what its latest
    claim or heartbeat asked for: the store keeps no ttl per attempt); for a task with no
    lease row, the span the attempt's lease held (``lease_until`` - claim)."""

    by_stage: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    attempts: set[str] = field(default_factory=set)
    expired: set[str] = field(default_factory=set)
    _previous: tuple[str, datetime] | None = None

    def add(self, row: StageRow) -> None:
        previous = self._previous
        start = previous[1] if previous and previous[0] == row.attempt_id else row.claimed_at
        self._previous = (row.attempt_id, row.at)
        self.attempts.add(row.attempt_id)
        if row.end_reason == "expired":
            self.expired.add(row.attempt_id)
        lease = row.ttl_s
        if lease is None and row.lease_until is not None:
            lease = (row.lease_until - row.claimed_at).total_seconds()
        if lease is None or lease <= 0:
            return
        seconds = max((row.at - start).total_seconds(), 0.0)
        self.by_stage.setdefault(row.stage, []).append((seconds, lease))

    def figures(self) -> Leases:
        pairs = [pair for found in self.by_stage.values() for pair in found]
        buckets = [0] * (len(RATIO_EDGES) + 1)
        for seconds, lease in pairs:
            ratio = seconds / lease
            index = next((i for i, edge in enumerate(RATIO_EDGES) if ratio <= edge), -1)
            buckets[index] += 1
        labels = [
            f"{round(low * 100)}-{round(edge * 100)}%"
            for low, edge in zip((0.0, *RATIO_EDGES), RATIO_EDGES, strict=False)
        ]
        labels.append(f"over {round(RATIO_EDGES[-1] * 100)}%")
        leases = [lease for _, lease in pairs]
        return Leases(
            stages=len(pairs),
            attempts=len(self.attempts),
            attempts_expired=len(self.expired),
            lease_p50_s=percentile(leases, 50),
            lease_min_s=min(leases, default=None),
            near_lease=sum(1 for s, lease in pairs if s >= NEAR_LEASE * lease),
            over_lease=sum(1 for s, lease in pairs if s > lease),
            ratio_buckets=[
                Bucket(label=lb, count=n) for lb, n in zip(labels, buckets, strict=True)
            ],
            by_stage=[_stage(name, found) for name, found in sorted(self.by_stage.items())],
        )


def _stage(name: str, found: list[tuple[float, float]]) -> StageFigure:
    seconds = [s for s, _ in found]
    return StageFigure(
        stage=name,
        count=len(found),
        p50_s=_round(percentile(seconds, 50)),
        p95_s=_round(percentile(seconds, 95)),
        max_s=_round(max(seconds)),
        lease_s=_round(percentile([lease for _, lease in found], 50)),
        near_lease=sum(1 for s, lease in found if s >= NEAR_LEASE * lease),
    )


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
