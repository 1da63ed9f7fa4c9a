"""The review's figures: one pydantic model that ``--json`` prints, ``GET /v1/review``
answers and both reports are drawn from, so that they cannot disagree.

The window's figures are read from the store (:mod:`.collect`); ``checkpoint_write``,
``effect_write`` and ``fence_proof`` are the review's own measurements, made after
reading (:mod:`.proof`), and are null in the control route's answer, which only reads.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from sidecar.domain.model import FenceRefusal


class Figure(BaseModel):
    # defer_build: built on the first review, not at import - the control API imports
    # these with every `sidecar serve`, and a review is a monthly question.
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class Percentiles(Figure):
    """Nearest-rank percentiles of ``count`` durations, in milliseconds."""

    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None


class Window(Figure):
    since: datetime
    until: datetime


class Duplicates(Figure):
    """Requests answered from the log instead of being sent again."""

    replays: int
    #: replays whose request differed from the recorded one (answered all the same).
    divergent_replays: int
    #: requests refused because their payload differed (rule ``on_divergence: reject``).
    divergent_rejected: int
    #: distinct effects that were replayed at least once.
    effects_replayed: int


class Settlement(Figure):
    at: datetime
    task: str
    key: str
    outcome: str
    by: str
    note: str


class Humans(Figure):
    """Effects that waited for a human: an attempt was refused because of them
    (``blocked``) or a human settled them (``resolved``) in the window."""

    waited: int
    attempts_blocked: int
    #: resolutions by outcome (completed, failed, abandoned).
    settled: dict[str, int]
    #: the resolutions themselves, oldest first (at most 100).
    settlements: list[Settlement]
    #: effects whose outcome is unknown right now, whenever they went unknown.
    waiting_now: int


class UncoveredTarget(Figure):
    target: str
    count: int


class Uncovered(Figure):
    """Writes no rule covered, recorded by ``serve --uncovered-writes record``."""

    total: int
    targets: list[UncoveredTarget]


class RefusedWrite(Figure):
    at: datetime
    task: str
    operation: str
    attempt_id: str
    generation: int
    current_generation: int
    reason: str

    @classmethod
    def of(cls, r: FenceRefusal) -> RefusedWrite:
        return cls(
            at=r.at,
            task=r.task,
            operation=r.operation,
            attempt_id=r.attempt_id,
            generation=r.generation,
            current_generation=r.current_generation,
            reason=r.reason,
        )


class Refusals(Figure):
    """Stale writes refused by fencing (store writes and the proxy's own refusals)."""

    total: int
    by_operation: dict[str, int]
    #: the newest refusals, oldest first (at most 100).
    latest: list[RefusedWrite]


class Bucket(Figure):
    label: str
    count: int


class StageFigure(Figure):
    stage: str
    count: int
    p50_s: float | None
    p95_s: float | None
    max_s: float | None
    #: the median lease (ttl_s) the stage ran under.
    lease_s: float | None
    near_lease: int


class Leases(Figure):
    """Stage durations (checkpoint to checkpoint within an attempt, the first from the
    claim) against the lease (the task's ``ttl_s``), for attempts claimed in the window."""

    stages: int
    attempts: int
    #: attempts whose lease ran out before they released it.
    attempts_expired: int
    lease_p50_s: float | None
    lease_min_s: float | None
    #: stages that took at least 80 % of their lease, and more than all of it.
    near_lease: int
    over_lease: int
    #: stages by duration as a share of their lease.
    ratio_buckets: list[Bucket]
    by_stage: list[StageFigure]


class Latency(Figure):
    """One measured latency and, in words, exactly what was timed."""

    what: str
    how: str
    samples: Percentiles


class FenceProof(Figure):
    """A stale write attempted on a scratch task: claim (generation 1), release, claim
    again (generation 2), then a checkpoint with generation 1, which must be refused."""

    task: str
    ok: bool
    #: what answered the stale write: ``stale_generation``, or what it was instead.
    refused_with: str | None
    cleaned_up: bool
    steps: list[str]


class Review(Figure):
    source: str
    window: Window
    duplicates: Duplicates
    humans: Humans
    uncovered: Uncovered
    refusals: Refusals
    leases: Leases
    checkpoint_write: Latency | None = None
    effect_write: Latency | None = None
    fence_proof: FenceProof | None = None
