"""Every store keeps how an attempt's agent ended, as its worker reported on release."""

from __future__ import annotations

import pytest

from sidecar.domain.model import AgentExit, AttemptEnd
from sidecar.errors import StaleGeneration


async def _attempt(store, task, attempt_id):
    view = await store.task_view(task)
    return next(a for a in view.attempts if a.attempt_id == attempt_id)


@pytest.mark.parametrize(
    ("end", "how"),
    [
        (AgentExit(exit_code=0), "exit 0"),
        (AgentExit(exit_code=3), "exit 3"),
        (AgentExit(signal="SIGKILL"), "killed by SIGKILL"),
        (AgentExit(exit_code=127, error="command not found"), "command not found (127)"),
    ],
)
async def test_a_release_keeps_how_the_agent_ended(store, end, how):
    a = await store.claim("312", "worker-a", 60)
    await store.release("312", a.attempt_id, a.generation, end)
    kept = await _attempt(store, "312", a.attempt_id)
    assert kept.end_reason is AttemptEnd.RELEASED
    assert kept.exit == end
    assert kept.how() == how
    assert (await store.attempt(a.attempt_id)).exit == end


async def test_a_release_without_an_end_says_released(store):
    a = await store.claim("312", "worker-a", 60)
    await store.release("312", a.attempt_id, a.generation)
    kept = await _attempt(store, "312", a.attempt_id)
    assert kept.exit is None
    assert kept.how() == "released"


async def test_the_first_report_wins_and_a_repeated_release_changes_nothing(store):
    a = await store.claim("312", "worker-a", 60)
    await store.release("312", a.attempt_id, a.generation, AgentExit(exit_code=3))
    await store.release("312", a.attempt_id, a.generation, AgentExit(exit_code=0))
    assert (await _attempt(store, "312", a.attempt_id)).how() == "exit 3"


async def test_a_lost_lease_is_kept_though_the_release_is_refused(store):
    a = await store.claim("312", "worker-a", 60)
    b = await store.claim("312", "worker-a", 60)  # the same worker again: supersedes a
    lost = AgentExit(signal="SIGTERM", lease_lost=True)
    with pytest.raises(StaleGeneration):
        await store.release("312", a.attempt_id, a.generation, lost)
    old = await _attempt(store, "312", a.attempt_id)
    assert old.end_reason is AttemptEnd.SUPERSEDED
    assert old.exit == lost
    assert old.how() == "lease lost"
    current = await _attempt(store, "312", b.attempt_id)
    assert current.exit is None
    assert current.how(current=True) == "current"


async def test_a_forged_token_cannot_say_how_another_attempt_ended(store):
    a = await store.claim("312", "worker-a", 60)
    b = await store.claim("312", "worker-a", 60)
    with pytest.raises(StaleGeneration):  # a's id with b's generation: not an attempt
        await store.release("312", a.attempt_id, b.generation, AgentExit(exit_code=9))
    with pytest.raises(StaleGeneration):
        await store.release("312", b.attempt_id, a.generation, AgentExit(exit_code=9))
    view = await store.task_view("312")
    assert [x.exit for x in view.attempts] == [None, None]
    assert [x.how() for x in view.attempts] == ["superseded", None]
