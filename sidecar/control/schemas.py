"""Request and response bodies of the control API, as pydantic models.

Requests are strict (unknown fields refused) so that a typo such as ``generaton`` is a
422, not a silently unfenced write.  Responses are built from domain records by
``model_validate(record)`` (members from attributes of the same names), or by ``of``
where some members are computed (a lease's ``live``, an effect's response digest); their
JSON Schemas feed ``/openapi.json``.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, model_validator

from sidecar.domain.model import (
    AgentExit,
    Attempt,
    Effect,
    EffectEvent,
    EffectState,
    FenceRefusal,
    Lease,
    TaskState,
    TaskView,
)
from sidecar.domain.text import MAX_INT64, text_problem

Worker = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@/-]*$",
        description="Name of the worker (pod, host, process) claiming the task.",
        examples=["worker-a"],
    ),
]
TtlSeconds = Annotated[
    float,
    # strict: "60" and true are not durations (a number, integer or not, is)
    Field(gt=0, le=86_400, strict=True, description="Lease duration in seconds.", examples=[600]),
]
AttemptId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=128,
        pattern=r"^[!-~]+$",  # printable ASCII, as minted (att-... or a UUID)
        examples=["att-9f2c5b1e0d3a7c44"],
    ),
]
Generation = Annotated[
    int,
    Field(ge=1, le=MAX_INT64, description="Fencing token returned by the claim."),
]


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False, defer_build=True)


class ClaimRequest(Request):
    worker: Worker
    ttl_s: TtlSeconds


class HeartbeatRequest(Request):
    attempt_id: AttemptId
    generation: Generation
    ttl_s: TtlSeconds | None = Field(
        default=None, description="New lease duration; defaults to the claim's."
    )


class AttemptEndIn(Request):
    """How the attempt's agent ended: exactly one of ``exit_code`` and ``signal``."""

    exit_code: int | None = Field(
        default=None, ge=0, le=255, strict=True, description="Its exit status.", examples=[3]
    )
    signal: str | None = Field(
        default=None,
        pattern=r"^SIG[A-Z0-9+-]{1,12}$",
        description="The signal that killed it.",
        examples=["SIGKILL"],
    )
    error: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Why the command could not be started (with exit_code 127 or 126).",
        examples=["command not found"],
    )
    lease_lost: bool = Field(
        default=False,
        strict=True,
        description="The worker stopped the agent because its lease was lost to another claim.",
    )

    @model_validator(mode="after")
    def _one_way_to_end(self) -> AttemptEndIn:
        if (self.exit_code is None) == (self.signal is None):
            raise ValueError("give exactly one of exit_code and signal")
        if self.error is not None and self.exit_code is None:
            raise ValueError("error goes with the exit_code the worker exited with")
        return self

    def to_domain(self) -> AgentExit:
        return AgentExit(self.exit_code, self.signal, self.error, self.lease_lost)


class ReleaseRequest(Request):
    attempt_id: AttemptId
    generation: Generation
    end: AttemptEndIn | None = Field(
        default=None,
        description="How the attempt's agent ended, kept with the attempt (also when the "
        "release is refused because the lease was already lost).",
    )


Note = Annotated[str, Field(min_length=1, max_length=4096, description="Why.")]
By = Annotated[str, Field(min_length=1, max_length=256, description="Who.")]


def _clean(**texts: str | None) -> None:
    for name, text in texts.items():
        if text is None:
            continue
        if not text.strip():
            raise ValueError(f"{name} must not be blank")
        if (why := text_problem(text)) is not None:
            raise ValueError(f"{name}: {why}")


class DoneRequest(Request):
    """By the lease holder: its ``attempt_id`` and ``generation`` (its lease is released
    with it).  By an operator: neither, only while no lease is live (409 lease_held)."""

    attempt_id: AttemptId | None = None
    generation: Generation | None = None
    note: Note | None = None
    by: By | None = Field(default=None, description="Who (default: the attempt id, or `operator`).")

    @model_validator(mode="after")
    def _token_whole(self) -> DoneRequest:
        if (self.attempt_id is None) != (self.generation is None):
            raise ValueError("give attempt_id and generation together, or neither")
        _clean(note=self.note, by=self.by)
        return self


class ReopenRequest(Request):
    note: Note
    by: By

    @model_validator(mode="after")
    def _texts(self) -> ReopenRequest:
        _clean(note=self.note, by=self.by)
        return self


class CheckpointRequest(Request):
    attempt_id: AttemptId
    generation: Generation
    stage: Annotated[
        str,
        Field(
            min_length=1,
            max_length=128,
            pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:/ -]*$",
            examples=["READ_COMPLETE"],
        ),
    ]
    outputs: dict[str, JsonValue] = Field(
        default_factory=dict, description="Whatever later stages need from this one."
    )


class Response(BaseModel):
    """An answer, built from the domain record it shows by ``model_validate(record)``:
    members from the record's attributes of the same names, nested records alike."""

    model_config = ConfigDict(frozen=True, from_attributes=True, defer_build=True)


def _of[R: Response](model: type[R], record: object, **computed: Any) -> R:
    """``model`` from ``record`` as ``model_validate`` builds it, but for the members
    ``computed`` gives (ones the record has no attribute for, or shows otherwise)."""
    found = {name: getattr(record, name) for name in model.model_fields if name not in computed}
    return model.model_validate(found | computed)


class CheckpointOut(Response):
    task: str
    seq: int
    stage: str
    attempt_id: str
    generation: int
    outputs: dict[str, JsonValue]
    created_at: datetime


class ClaimResponse(Response):
    task: str
    attempt_id: str
    generation: int
    worker: str
    lease_expires_at: datetime
    last_checkpoint: CheckpointOut | None
    previous_attempt_id: str | None = Field(
        description="The attempt this claim fenced off, if its lease had not been released."
    )


class LeaseOut(Response):
    attempt_id: str
    generation: int
    worker: str
    acquired_at: datetime
    expires_at: datetime
    released_at: datetime | None
    live: bool

    @classmethod
    def of(cls, lease: Lease, now: datetime) -> LeaseOut:
        return _of(cls, lease, live=lease.is_live(now))


class MarkOut(Response):
    at: datetime
    by: str
    note: str | None


class LeaseResponse(Response):
    task: str
    generation: int
    lease: LeaseOut

    @classmethod
    def of(cls, state: TaskState, now: datetime) -> LeaseResponse:
        assert state.lease is not None
        return _of(cls, state, lease=LeaseOut.of(state.lease, now))


class CheckpointCreated(Response):
    task: str
    seq: int
    stage: str
    generation: int
    created_at: datetime


class AttemptEndOut(Response):
    exit_code: int | None
    signal: str | None
    error: str | None
    lease_lost: bool


class AttemptOut(Response):
    attempt_id: str
    generation: int
    worker: str
    claimed_at: datetime
    ended_at: datetime | None
    end_reason: str | None
    lease_until: datetime | None = Field(
        description="For an ended attempt, the last moment its lease let it act."
    )
    exit: AttemptEndOut | None = Field(
        default=None, description="How its agent ended, as its worker reported on release."
    )
    how: str | None = Field(
        default=None,
        description="How it ended, in words: `exit 3`, `killed by SIGKILL`, `command not "
        "found (127)`, `lease lost`, `released`, `superseded`, `expired`, `current`.",
    )

    @classmethod
    def of(cls, a: Attempt, current: bool = False) -> AttemptOut:
        return _of(cls, a, how=a.how(current))


class RefusalOut(Response):
    operation: str
    attempt_id: str
    generation: int
    current_generation: int
    at: datetime
    reason: str


def _counts(view: TaskView) -> dict[str, int]:
    """Effect counts by state, every state named."""
    return {s.value: view.effect_counts.get(s.value, 0) for s in EffectState}


class TaskOut(Response):
    task: str
    generation: int
    lease: LeaseOut | None
    attempts: list[AttemptOut]
    last_checkpoint: CheckpointOut | None
    effects: dict[str, int] = Field(description="Effect counts by state.")
    refused_writes: list[RefusalOut] = Field(description="Writes fenced off for this task.")
    done: MarkOut | None = Field(
        default=None, description="Set while the task is done: claims get 409 task_done."
    )
    reopened: MarkOut | None = Field(default=None, description="Its last reopening.")

    @classmethod
    def of(cls, view: TaskView, refusals: list[FenceRefusal], now: datetime) -> TaskOut:
        lease = view.state.lease
        holder = lease.attempt_id if lease is not None and lease.released_at is None else None
        return _of(
            cls,
            view.state,
            lease=None if lease is None else LeaseOut.of(lease, now),
            attempts=[AttemptOut.of(a, a.attempt_id == holder) for a in view.attempts],
            last_checkpoint=view.last_checkpoint,
            effects=_counts(view),
            refused_writes=refusals,
        )


NEXT_CURSOR = "Pass as ?cursor= for the next page; null on the last page."


class CheckpointList(Response):
    task: str
    checkpoints: list[CheckpointOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR)


class EventOut(Response):
    event: str
    attempt_id: str
    generation: int
    at: datetime
    detail: str | None


class RecordedResponseOut(Response):
    status: int
    body_bytes: int
    body_sha256: str
    command_tag: str | None = Field(
        default=None, description="For a SQL statement, the command tag it answered."
    )


class EffectOut(Response):
    task: str
    key: str
    state: str
    kind: str
    rule: str
    origin_attempt_id: str = Field(description="The attempt that first issued the effect.")
    attempt_id: str = Field(description="The attempt that last drove it.")
    generation: int
    fingerprint: str
    idempotency_key: str | None
    request: dict[str, JsonValue] = Field(description="Request summary, secrets redacted.")
    response: RecordedResponseOut | None
    detail: str | None
    created_at: datetime
    updated_at: datetime
    events: list[EventOut]

    @classmethod
    def of(cls, e: Effect, events: list[EffectEvent]) -> EffectOut:
        """``events`` are this effect's own, oldest first."""
        r = e.response
        return _of(
            cls,
            e,
            response=None
            if r is None
            else RecordedResponseOut(
                status=r.status,
                body_bytes=len(r.body),
                body_sha256=hashlib.sha256(r.body).hexdigest(),
                command_tag=dict(r.headers).get("x-command-tag"),
            ),
            events=events,
        )


def with_trails(effects: Sequence[Effect], events: Iterable[EffectEvent]) -> list[EffectOut]:
    """``effects`` as answered, each with its own audit trail out of ``events`` (oldest
    first, as the store gives them)."""
    trail: dict[tuple[str, str], list[EffectEvent]] = defaultdict(list)
    for event in events:
        trail[event.task, event.key].append(event)
    return [EffectOut.of(e, trail[e.task, e.key]) for e in effects]


class EffectList(Response):
    task: str
    effects: list[EffectOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR)


class Health(Response):
    status: str


class Stopping(Response):
    status: str


class Readiness(Response):
    status: str
    store: dict[str, Any]


class ProxyOut(Response):
    proxy_url: str = Field(description="Address for HTTP_PROXY/HTTPS_PROXY (no credentials).")
    mode: str
    ca_cert: str = Field(description="The interception CA certificate (PEM).")
    ca_bundle: str = Field(description="System roots plus the CA (PEM), for SSL_CERT_FILE etc.")
    rules: list[str]
    routes: list[str]
    pg_relay: str | None = Field(
        default=None, description="The PostgreSQL relay's HOST:PORT, if it runs."
    )
    pg_upstream_port: int | None = Field(
        default=None, description="The port of the relay's server (--pg-upstream)."
    )


class Problem(Response):
    """RFC 9457 problem details; ``code`` is the stable machine-readable member."""

    model_config = ConfigDict(extra="allow")
    type: str
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None


class TaskSummary(Response):
    """A task in a listing: no attempts (``GET /v1/tasks/{task}`` has them)."""

    task: str
    generation: int
    state: str = Field(description="leased (a live lease), done (marked done) or free.")
    waiting_for_human: int = Field(description="Effects whose outcome a human must settle.")
    lease: LeaseOut | None
    last_checkpoint: CheckpointOut | None
    effects: dict[str, int] = Field(description="Effect counts by state.")
    created_at: datetime
    updated_at: datetime
    done: MarkOut | None = Field(default=None, description="Set while the task is done.")

    @classmethod
    def of(cls, view: TaskView, now: datetime) -> TaskSummary:
        state = view.state
        lease = state.lease
        live = lease is not None and lease.is_live(now)
        return _of(
            cls,
            state,
            state="leased" if live else "done" if state.done is not None else "free",
            waiting_for_human=view.effect_counts.get(EffectState.UNKNOWN.value, 0),
            lease=None if lease is None else LeaseOut.of(lease, now),
            last_checkpoint=view.last_checkpoint,
            effects=_counts(view),
        )


class TaskPage(Response):
    tasks: list[TaskSummary]
    next_cursor: str | None = Field(description=NEXT_CURSOR)


class EffectPage(Response):
    effects: list[EffectOut]
    next_cursor: str | None = Field(description=NEXT_CURSOR)
