"""The resume checklist's decisions, as pure functions of what was read and probed.

Nothing here reads a store or the network: :mod:`sidecar.resume.checklist` gathers the
facts, these functions say what they mean.  Each mirrors what the proxy's effect guard
(:mod:`sidecar.proxy.guard`) will do when the next attempt's agent makes the request
again, so that "safe to resume" is a prediction of that flow, not a second policy:

* ``completed`` - replayed from the log;
* ``failed`` - sent again (with the first idempotency key); abandoned ones are refused;
* ``pending``/``unknown`` - by the rule's ``on_unknown``: ``probe`` (found: replayed from
  the evidence; not found: sent again once the first try can no longer land), ``retry``
  (sent again), ``block`` (CANNOT DETERMINE: a human settles it); a ``cache`` rule's
  model call is asked again; a SQL statement is decided by its record in the agent's
  own database.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sidecar.domain.effects import abandonment
from sidecar.domain.effects import absence_proven_at as proven_after_settling
from sidecar.domain.model import Effect, EffectState, TaskState
from sidecar.resume.model import EXIT_CODES, EffectCheck, Found, Next, Probed, Verdict
from sidecar.rules import EffectKind, OnUnknown
from sidecar.rules.model import Rule
from sidecar.rules.sql import NO_TRANSACTION

_UNSETTLED = (EffectState.PENDING, EffectState.UNKNOWN)


def lease_is_live(state: TaskState, now: datetime) -> bool:
    return state.lease is not None and state.lease.is_live(now)


def wants_probe(effect: Effect, rule: Rule | None) -> bool:
    """Whether the next attempt's guard would probe this effect (so resume does too)."""
    return (
        effect.state in _UNSETTLED
        and effect.kind != "sql"
        and rule is not None
        and rule.effect is not EffectKind.CACHE
        and rule.on_unknown is OnUnknown.PROBE
    )


def absence_proven_at(effect: Effect, rule: Rule, lease_until: datetime | None) -> datetime:
    """When a probe's "not found" becomes proof, as the guard reckons it for a sidecar
    that did not see the first try end (:func:`sidecar.domain.effects.absence_proven_at`)."""
    return proven_after_settling(
        effect.updated_at, rule.timeout_s, rule.settle_s, lease_until=lease_until
    )


def judge(
    effect: Effect,
    rule: Rule | None,
    probed: Probed | None,
    *,
    now: datetime,
    lease_until: datetime | None,
) -> EffectCheck:
    """What the next attempt does with ``effect``, given what probing it now said
    (``probed`` is None when it was not probed: see :func:`wants_probe`)."""
    found, evidence, next_, why, until = _decide(effect, rule, probed, now, lease_until)
    return EffectCheck(
        key=effect.key,
        rule=effect.rule,
        kind=effect.kind,
        state=effect.state.value,
        attempt_id=effect.attempt_id,
        generation=effect.generation,
        found=found,
        evidence=evidence,
        next=next_,
        why=why,
        wait_until=until,
    )


type _Decision = tuple[Found, str, Next, str, datetime | None]


def _decide(
    effect: Effect,
    rule: Rule | None,
    probed: Probed | None,
    now: datetime,
    lease_until: datetime | None,
) -> _Decision:
    if effect.state not in _UNSETTLED:
        return _settled(effect)
    if effect.kind == "sql":
        return _sql(effect)
    if rule is None or probed is None or not wants_probe(effect, rule):
        return _without_probe(effect, rule)
    return _probed(effect, rule, probed, now, lease_until)


def _without_probe(effect: Effect, rule: Rule | None) -> _Decision:
    """A pending/unknown effect that no probe settles: its rule's policy decides."""
    if rule is None:
        return (
            Found.CANNOT_PROBE,
            f"rule {effect.rule} is not among the rules loaded",
            Next.HUMAN,
            "no rule says how to settle it: a human decides",
            None,
        )
    if rule.effect is EffectKind.CACHE:
        return (
            Found.NOT_PROBED,
            "a cached model call",
            Next.SEND,
            "a model call is safe to ask again",
            None,
        )
    if rule.on_unknown is OnUnknown.RETRY:
        key = f", with the first idempotency key ({rule.idempotency_header})"
        again = key if rule.idempotency_header and effect.idempotency_key else ""
        return (
            Found.CANNOT_PROBE,
            f"rule {rule.name} has no probe",
            Next.SEND,
            f"sent again{again}: the rule declares a retry safe (on_unknown: retry)",
            None,
        )
    why = "has no probe (on_unknown: block)"
    if rule.on_unknown is OnUnknown.PROBE:
        why = "has a probe, but it was not run"
    return (Found.CANNOT_PROBE, f"rule {rule.name} {why}", Next.HUMAN, _HUMAN, None)


def _settled(effect: Effect) -> _Decision:
    """A completed or failed effect: the log answers, nothing is probed."""
    if effect.state is EffectState.COMPLETED:
        status = effect.response.status if effect.response is not None else "-"
        return (
            Found.NOT_PROBED,
            f"completed in the log (status {status})",
            Next.REPLAY,
            "answered from the log, not sent",
            None,
        )
    if (abandoned := abandonment(effect)) is not None:
        return (
            Found.NOT_PROBED,
            f"abandoned by {abandoned.by}",
            Next.REFUSE,
            "a human abandoned it: refused (409 effect_abandoned)",
            None,
        )
    again = ", with the first idempotency key" if effect.idempotency_key else ""
    return (
        Found.NOT_PROBED,
        f"failed definitively ({effect.detail or 'no detail'})",
        Next.SEND,
        f"sent again{again}",
        None,
    )


_HUMAN = (
    "CANNOT DETERMINE: refused (409 effect_unknown) until a human settles it with "
    "`sidecar effects resolve`"
)


def _probed(
    effect: Effect, rule: Rule, probed: Probed, now: datetime, lease_until: datetime | None
) -> _Decision:
    if probed.found is Found.FOUND:
        return (
            Found.FOUND,
            probed.evidence,
            Next.REPLAY,
            "its probe finds it and answers from that evidence (X-Sidecar-Effect: "
            "probed); not sent",
            None,
        )
    if probed.found is not Found.NOT_FOUND:
        return (
            Found.CANNOT_PROBE,
            probed.evidence,
            Next.HUMAN,
            f"{_HUMAN} (or the probe works when asked again)",
            None,
        )
    if rule.idempotency_header and effect.idempotency_key:
        # The guard sends it again at once: the API dedupes on the key it got first.
        return (
            Found.NOT_FOUND,
            probed.evidence,
            Next.SEND,
            f"sent again with the first idempotency key ({rule.idempotency_header})",
            None,
        )
    proven = absence_proven_at(effect, rule, lease_until)
    if now < proven:
        return (
            Found.WAIT,
            f"{probed.evidence}; its first try could still land until {proven.isoformat()}",
            Next.WAIT,
            f"wait until {proven.isoformat()}: only then is 'not found' proof "
            "(CANNOT DETERMINE for now)",
            proven,
        )
    return (
        Found.NOT_FOUND,
        probed.evidence,
        Next.SEND,
        "sent again: absent, and its first try can no longer land",
        None,
    )


def _sql(effect: Effect) -> _Decision:
    statement = str(effect.request.get("statement", ""))
    if NO_TRANSACTION.search(statement.strip()):
        return (
            Found.BY_RECORD,
            "ran outside a transaction, so it has no record in the database",
            Next.SEND,
            "run again (the one SQL window a crash leaves)",
            None,
        )
    return (
        Found.BY_RECORD,
        "its record commits with the statement in the agent's database, or neither does",
        Next.DATABASE,
        "replayed if its record is in the database, run if not: no human needed",
        None,
    )


def verdict(
    *, done: bool, held: bool, writable: bool, effects: Sequence[EffectCheck]
) -> tuple[Verdict, int]:
    """The checklist's outcome: the first condition that stops a resume wins."""
    if done:
        found = Verdict.NOT_RESUMABLE
    elif held:
        found = Verdict.LEASE_HELD
    elif not writable:
        found = Verdict.STORE_UNAVAILABLE
    elif any(e.next in (Next.HUMAN, Next.WAIT) for e in effects):
        found = Verdict.CANNOT_DETERMINE
    else:
        found = Verdict.SAFE
    return found, EXIT_CODES[found]
