"""A human settles what the sidecar cannot (SPEC §3.10).

An effect whose outcome is unknown and that no probe can check (``on_unknown: block``,
CANNOT DETERMINE) waits for a human, who looks at the outside world and resolves it:

* ``completed`` - it happened; later attempts are answered with the evidence the human
  gives (a response ``{status, headers, body}``), exactly as a recorded answer is replayed;
* ``failed`` - it did not happen; the next attempt sends it again, with the *first*
  idempotency key (the path of any failed effect);
* ``abandoned`` - it must not happen; later attempts get 409 ``effect_abandoned``.  The
  effect is ``failed`` with a marker (see :func:`sidecar.domain.effects.abandonment`):
  the state set is the schema's, and a failed effect is what the agent would have met
  had the write been refused.

Only an effect nobody can still land may be settled: a ``pending``/``unknown`` effect
whose every forwarding attempt has ended, and whose last possible request has had the
rule's ``timeout_s`` and twice ``settle_s`` to arrive and be acted upon (a connection is
kept ``timeout_s + settle_s`` and the API may act ``settle_s`` after it closes).  SQL
effects are not settled by hand: the relay's record in the agent's own database decides
whether a statement ran.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sidecar.domain.effects import ABANDONED_DETAIL, ABANDONED_HEADER, abandonment
from sidecar.domain.model import (
    Attempt,
    Effect,
    EffectEvent,
    EffectState,
    RecordedResponse,
    TaskState,
)
from sidecar.errors import InvalidRequest, NotFound, NotWaitingForAHuman

RESOLVED = "resolved"  # the audit event of a resolution
# Headers a given answer may not set: the proxy frames the body itself.
_FRAMING = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})


class Outcome(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    ABANDONED = "abandoned"


@dataclass(frozen=True, slots=True)
class Resolution:
    """What a human found, and who they are."""

    outcome: Outcome
    by: str
    note: str
    response: RecordedResponse | None = None


def evidence(status: int, headers: Mapping[str, str] | None, body: Any) -> RecordedResponse:
    """The answer later attempts get for a ``completed`` resolution.

    ``body``: a string is sent as that text (``text/plain`` unless a Content-Type is
    given), any other JSON value as JSON (``application/json``), None as no body."""
    kept = [(n, v) for n, v in (headers or {}).items() if n.lower() not in _FRAMING]
    named = {n.lower() for n, _ in kept}
    if body is None:
        raw = b""
    elif isinstance(body, str):
        raw = body.encode()
        if "content-type" not in named:
            kept.append(("content-type", "text/plain; charset=utf-8"))
    else:
        raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        if "content-type" not in named:
            kept.append(("content-type", "application/json"))
    return RecordedResponse(status, tuple(kept), raw)


def forwarders(effect: Effect, events: Iterable[EffectEvent]) -> set[str]:
    """The attempts that may have sent ``effect``: each ``pending`` line of its trail
    (a first record or a reopening) and the attempt that first recorded it."""
    found = {e.attempt_id for e in events if e.key == effect.key and e.event == "pending"}
    found.add(effect.origin_attempt_id)
    if effect.state is EffectState.PENDING:
        found.add(effect.attempt_id)
    return found


def settled_from(
    effect: Effect, attempts: Mapping[str, Attempt | None], landing: timedelta
) -> datetime:
    """From when no request of ``effect`` can still land: the last end of the attempts
    that sent it plus ``landing``.  Refused while one of them has not ended."""
    latest: datetime | None = None
    for attempt_id, attempt in sorted(attempts.items()):
        if attempt is None or attempt.ended_at is None or attempt.lease_until is None:
            raise NotWaitingForAHuman(
                effect.task,
                effect.key,
                effect.state.value,
                f"task {effect.task}: effect {effect.key!r} is {effect.state.value} and attempt "
                f"{attempt_id}, which sent it, has not ended: its request may still land. "
                "Resolve it once that attempt is over (its agent exited and the lease was "
                "released, or another attempt claimed the task)",
            )
        until = max(attempt.lease_until, attempt.ended_at) + landing
        latest = until if latest is None else max(latest, until)
    assert latest is not None  # an effect has at least the attempt that recorded it
    return latest


def resolve(
    state: TaskState | None,
    effect: Effect | None,
    resolution: Resolution,
    *,
    task: str,
    key: str,
    now: datetime,
    not_before: datetime,
    seen_at: datetime,
) -> tuple[Effect, EffectEvent]:
    """Settle ``effect`` as ``resolution`` says, if it waits for a human.

    ``not_before`` is when no request of it can still land (:func:`settled_from`, judged
    from what was read at ``seen_at``, the effect's ``updated_at`` then): if the effect
    changed since, it is refused so that the caller looks again."""
    if state is None:
        raise NotFound(f"task {task} has never been claimed")
    if effect is None:
        raise NotFound(f"task {task} has no effect {key!r}")
    refuse_unless_waiting(effect)
    if effect.updated_at != seen_at:
        raise NotWaitingForAHuman(
            task,
            key,
            effect.state.value,
            f"task {task}: effect {key!r} changed while it was being resolved "
            f"(now {effect.state.value}); look at it again",
        )
    who = f"{resolution.by}: {resolution.note}"
    response = resolution.response
    match resolution.outcome:
        case Outcome.COMPLETED:
            if response is None:
                if effect.kind != "git":
                    why = "outcome completed needs the response later attempts are answered with"
                    raise InvalidRequest(
                        f"{why}: {{status, headers?, body?}}",
                        errors=[{"loc": ["response"], "msg": why, "type": "missing"}],
                    )
                response = RecordedResponse(200)  # a push is answered from its own refs
            to, detail = EffectState.COMPLETED, f"resolved completed by {who}"
            said = f"completed by {who} (evidence: status {response.status})"
        case Outcome.FAILED:
            to, detail, response = EffectState.FAILED, f"resolved failed by {who}", None
            said = f"failed by {who} (the next attempt sends it again"
            said += ", with the first idempotency key)" if effect.idempotency_key else ")"
        case Outcome.ABANDONED:
            to, detail = EffectState.FAILED, f"{ABANDONED_DETAIL}{who}"
            body = json.dumps({"abandoned_by": resolution.by, "note": resolution.note}).encode()
            headers = ((ABANDONED_HEADER, resolution.by), ("content-type", "application/json"))
            response = RecordedResponse(409, headers, body)
            said = f"abandoned by {who} (later attempts are refused: effect_abandoned)"
    if now < not_before:
        wait = (not_before - now).total_seconds()
        raise NotWaitingForAHuman(
            task,
            key,
            effect.state.value,
            f"task {task}: a request of effect {key!r} could still land until "
            f"{not_before.isoformat()} (its rule's timeout_s plus twice settle_s after the "
            f"attempt that sent it ended); resolve it after that, in {wait:.1f}s",
            retry_after_s=wait,
        )
    updated = replace(
        effect,
        state=to,
        updated_at=now,
        response=response if response is not None else effect.response,
        detail=detail,
    )
    event = EffectEvent(task, key, RESOLVED, effect.attempt_id, effect.generation, now, said)
    return updated, event


def refuse_unless_waiting(effect: Effect) -> None:
    """Raise :class:`NotWaitingForAHuman` unless ``effect``'s state lets a human settle it."""
    why: str | None = None
    if effect.kind == "sql":
        why = (
            "it is a SQL statement: the relay's record in the agent's database decides "
            "whether it ran, and the next attempt replays or runs it from that"
        )
    elif (abandoned := abandonment(effect)) is not None:
        why = f"it was abandoned already by {abandoned.by}"
    elif effect.state is EffectState.COMPLETED:
        why = "it is completed: later attempts are answered with its recorded response"
    elif effect.state is EffectState.FAILED:
        why = "it failed definitively: the next attempt sends it again"
    if why is not None:
        raise NotWaitingForAHuman(
            effect.task,
            effect.key,
            effect.state.value,
            f"task {effect.task}: effect {effect.key!r} is not waiting for a human: {why}",
        )
