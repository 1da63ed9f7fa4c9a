"""The effect state machine (SPEC §3).

    (none) ──record──▶ pending ──▶ completed
                          │  ├───▶ failed ──reopen──▶ pending
                          │  └───▶ unknown ──▶ completed | failed   (probe evidence)
                          │                └──reopen──▶ pending     (retry, same key)

``completed`` is final: a completed effect is only ever replayed.  Every change is
fenced by the *caller's* attempt and generation, which need not be the effect's own: a
new attempt resolves or retries what an earlier one left ``pending``/``unknown``.

One exception (SPEC §3.7, "an answer seen is an answer kept"): the attempt that
forwarded an effect may record its *outcome* after it was fenced - its agent was
killed and the lease released, or its lease taken over - as long as nobody else has
touched the effect since.  Fencing stops forwarding; the upstream's answer to a
request already sent is evidence about the outside world, and dropping it would leave
a later attempt to guess (CANNOT DETERMINE) what had in fact happened exactly once.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sidecar.domain.leases import fence
from sidecar.domain.model import (
    JSON,
    Effect,
    EffectEvent,
    EffectState,
    RecordedResponse,
    TaskState,
)
from sidecar.errors import EffectAbandoned, EffectExists, InvalidTransition

ALLOWED: dict[EffectState, frozenset[EffectState]] = {
    EffectState.PENDING: frozenset(
        {EffectState.COMPLETED, EffectState.FAILED, EffectState.UNKNOWN}
    ),
    EffectState.UNKNOWN: frozenset(
        {EffectState.PENDING, EffectState.COMPLETED, EffectState.FAILED}
    ),
    EffectState.FAILED: frozenset({EffectState.PENDING}),
    EffectState.COMPLETED: frozenset(),
}

# What the upstream's answer (or its absence) makes of a forwarded effect.
OUTCOMES = frozenset({EffectState.COMPLETED, EffectState.FAILED, EffectState.UNKNOWN})

# Events that annotate an effect without changing its state.
# ``blocked``: an attempt was refused because the effect waits for a human (once per attempt).
# ``ran_again``: a SQL effect completed in the log ran again, since its target database
# held no record of it (the database was made again, or its effect_sidecar.effects emptied).
NOTES = frozenset({"replayed", "probed", "divergent", "waited", "blocked", "ran_again"})

# A human's ``abandoned`` resolution (SPEC §3.10) is kept without a state of its own: the
# effect is ``failed``, its detail says who abandoned it and why, and its recorded
# response carries this header.  A failed effect is otherwise sent again; an abandoned one
# never leaves ``failed`` (see :func:`abandonment`).
ABANDONED_HEADER = "x-sidecar-abandoned-by"
ABANDONED_DETAIL = "abandoned by "


def record_pending(
    state: TaskState | None,
    existing: Effect | None,
    *,
    task: str,
    key: str,
    kind: str,
    rule: str,
    attempt_id: str,
    generation: int,
    fingerprint: str,
    idempotency_key: str | None,
    request: JSON,
    now: datetime,
) -> tuple[Effect, EffectEvent]:
    """Log a new effect as ``pending`` (before it is forwarded)."""
    fence(state, task, attempt_id, generation)
    if existing is not None:
        raise EffectExists(existing)
    effect = Effect(
        task=task,
        key=key,
        state=EffectState.PENDING,
        kind=kind,
        rule=rule,
        origin_attempt_id=attempt_id,
        attempt_id=attempt_id,
        generation=generation,
        fingerprint=fingerprint,
        idempotency_key=idempotency_key,
        request=request,
        created_at=now,
        updated_at=now,
    )
    return effect, EffectEvent(task, key, "pending", attempt_id, generation, now)


def transition(
    state: TaskState | None,
    effect: Effect | None,
    *,
    task: str,
    key: str,
    to: EffectState,
    attempt_id: str,
    generation: int,
    now: datetime,
    response: RecordedResponse | None = None,
    detail: str | None = None,
) -> tuple[Effect, EffectEvent]:
    """Move an effect to ``to`` on behalf of the task's current holder (or, for an
    outcome, of the attempt that forwarded it: see the module's docstring)."""
    if not is_own_outcome(effect, to, attempt_id, generation):
        fence(state, task, attempt_id, generation)
    if effect is None:
        raise InvalidTransition(f"task {task} has no effect {key!r}")
    if (abandoned := abandonment(effect)) is not None:
        raise abandoned
    if to not in ALLOWED[effect.state]:
        raise InvalidTransition(
            f"task {task}: effect {key!r} cannot go from {effect.state.value} to {to.value}"
        )
    if to is EffectState.COMPLETED and response is None:
        raise InvalidTransition(f"task {task}: completing {key!r} needs the response")
    # Built directly rather than with dataclasses.replace, which costs several times
    # more: every effect's outcome comes through here.
    updated = Effect(
        effect.task,
        effect.key,
        to,
        effect.kind,
        effect.rule,
        effect.origin_attempt_id,
        attempt_id,
        generation,
        effect.fingerprint,
        effect.idempotency_key,
        effect.request,
        effect.created_at,
        now,
        response if response is not None else effect.response,
        detail,
    )
    return updated, EffectEvent(task, key, to.value, attempt_id, generation, now, detail)


def abandonment(effect: Effect) -> EffectAbandoned | None:
    """The refusal later attempts get if a human abandoned ``effect``, else None."""
    response = effect.response
    if (
        effect.state is not EffectState.FAILED
        or effect.kind == "sql"
        or response is None
        or not (effect.detail or "").startswith(ABANDONED_DETAIL)
    ):
        return None
    by = dict(response.headers).get(ABANDONED_HEADER)
    if by is None:
        return None
    note = (effect.detail or "")[len(ABANDONED_DETAIL) + len(by) + 2 :]
    return EffectAbandoned(effect.task, effect.key, by, note)


def is_own_outcome(
    effect: Effect | None, to: EffectState, attempt_id: str, generation: int
) -> bool:
    """Whether this is the outcome of the caller's own forward, which no later write has
    overtaken: the effect is still pending (or unknown) as the caller itself left it."""
    return (
        effect is not None
        and to in OUTCOMES
        and effect.state in (EffectState.PENDING, EffectState.UNKNOWN)
        and effect.attempt_id == attempt_id
        and effect.generation == generation
    )


def note(
    state: TaskState | None,
    effect: Effect | None,
    *,
    task: str,
    key: str,
    event: str,
    attempt_id: str,
    generation: int,
    now: datetime,
    detail: str | None = None,
) -> EffectEvent:
    """Annotate an effect's audit trail (a replay, a probe, a divergent payload)."""
    fence(state, task, attempt_id, generation)
    if effect is None:
        raise InvalidTransition(f"task {task} has no effect {key!r}")
    if event not in NOTES:
        raise InvalidTransition(f"unknown effect event {event!r}; one of {sorted(NOTES)}")
    return EffectEvent(task, key, event, attempt_id, generation, now, detail)


def absence_proven_at(
    last_written: datetime,
    timeout_s: float,
    settle_s: float,
    *,
    first_try_ended: datetime | None = None,
    lease_until: datetime | None = None,
) -> datetime:
    """When a probe's "not found" becomes proof of absence (SPEC §3.5b, §3.8): once the
    first try can no longer land and the API has had ``settle_s`` to finish acting.

    The first try ended when its connection was seen to end (``first_try_ended``);
    otherwise no sidecar keeps a connection beyond ``timeout_s + settle_s`` after the
    effect was last written, and an earlier attempt sends nothing past its lease, whose
    last request may take ``timeout_s`` more (``lease_until``)."""
    timeout, settle = timedelta(seconds=timeout_s), timedelta(seconds=settle_s)
    ended = first_try_ended or last_written + timeout + settle
    if lease_until is not None:
        ended = max(ended, lease_until + timeout)
    return ended + settle
