"""Settling an effect by hand (SPEC §3.10): the reads that judge whether anyone can still
land it, then one :class:`~sidecar.store.commands.ResolveEffect` that re-checks the effect
and writes the resolution with its audit line in one transaction.

What is read first only grows more permissive with time (an ended attempt stays ended,
its ``lease_until`` fixed); the effect itself is re-checked inside the transaction, so a
new attempt that took it up meanwhile makes the resolution refused, not lost.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from sidecar.domain import settling
from sidecar.domain.model import Attempt, Effect
from sidecar.errors import NotFound
from sidecar.rules import RuleSet
from sidecar.rules.model import Rule
from sidecar.store.base import Store
from sidecar.store.commands import ResolveEffect

#: rule name -> how long after its sender ended a request of it may still land.
type Landing = Callable[[str], timedelta]

_DEFAULT_TIMEOUT_S = float(Rule.model_fields["timeout_s"].default)
_DEFAULT_SETTLE_S = float(Rule.model_fields["settle_s"].default)


def _window(timeout_s: float, settle_s: float) -> timedelta:
    # The connection is kept timeout_s + settle_s; the API may act settle_s after it closed.
    return timedelta(seconds=timeout_s + 2 * settle_s)


def landing_of(rules: RuleSet | None) -> Landing:
    """Each rule's own window; for a rule not loaded here (renamed, or a store read
    without the sidecar's rules), the longest of the loaded ones and the defaults."""
    known = {rule.name: _window(rule.timeout_s, rule.settle_s) for rule in rules or ()}
    longest = max([_window(_DEFAULT_TIMEOUT_S, _DEFAULT_SETTLE_S), *known.values()])
    return lambda name: known.get(name, longest)


async def resolve_effect(
    store: Store, task: str, key: str, resolution: settling.Resolution, landing: Landing
) -> Effect:
    """Settle ``task``'s effect ``key`` as ``resolution`` says; NotFound, or
    NotWaitingForAHuman when it is settled already or could still land."""
    effect = await store.effect(task, key)
    if effect is None:
        if await store.task_view(task) is None:
            raise NotFound(f"task {task} has never been claimed")
        raise NotFound(f"task {task} has no effect {key!r} (see `sidecar effects {task}`)")
    settling.refuse_unless_waiting(effect)
    events = await store.effect_events_of([(task, key)])
    attempts: dict[str, Attempt | None] = {
        attempt_id: await store.attempt(attempt_id)
        for attempt_id in sorted(settling.forwarders(effect, events))
    }
    not_before = settling.settled_from(effect, attempts, landing(effect.rule))
    return await store.execute(
        ResolveEffect(task, key, resolution, not_before, seen_at=effect.updated_at)
    )
