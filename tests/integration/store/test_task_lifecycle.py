"""A task marked done, reopened, and pruned: the same commands on every store."""

from __future__ import annotations

from datetime import timedelta

import pytest

from sidecar.domain.model import AttemptEnd, EffectState, RecordedResponse
from sidecar.errors import LeaseHeld, NotFound, StaleGeneration, TaskIsDone
from sidecar.store.base import TaskFilter

DAY = timedelta(days=1)


async def _worked(store, task, *, effect_state=EffectState.COMPLETED, release=True):
    """A claim, a checkpoint and one effect; released unless told otherwise."""
    a = await store.claim(task, "worker-a", 60)
    await store.append_checkpoint(task, a.attempt_id, a.generation, "PLAN", {"n": 1})
    await store.record_pending(
        task, "k1", a.attempt_id, a.generation, kind="http", rule="r",
        fingerprint="f", idempotency_key=None, request={},
    )  # fmt: skip
    if effect_state is not EffectState.PENDING:
        answer = RecordedResponse(201, (), b"{}") if effect_state is EffectState.COMPLETED else None
        await store.transition_effect(
            task, "k1", a.attempt_id, a.generation, effect_state, response=answer
        )
    if release:
        await store.release(task, a.attempt_id, a.generation)
    return a


async def _names(store, state, clock):
    views = await store.tasks_page(TaskFilter(state=state), None, 100, clock.now())
    return sorted(v.state.task for v in views)


async def test_the_holder_marks_its_task_done_and_claims_are_refused(store, clock):
    a = await store.claim("312", "worker-a", 60)
    state = await store.mark_done("312", "worker-a", "merged", (a.attempt_id, a.generation))
    assert state.done is not None
    assert state.done.note == "merged"
    assert state.lease.released_at == clock.now()
    view = await store.task_view("312")
    assert view.state.done == state.done
    assert view.attempts[0].end_reason is AttemptEnd.RELEASED
    with pytest.raises(TaskIsDone) as refused:
        await store.claim("312", "worker-b", 60)
    assert refused.value.code == "task_done"
    # the holder's token writes nothing more
    with pytest.raises(StaleGeneration):
        await store.heartbeat("312", a.attempt_id, a.generation)


async def test_an_operator_marks_done_only_when_no_lease_is_live(store, clock):
    a = await store.claim("312", "worker-a", 60)
    with pytest.raises(LeaseHeld):
        await store.mark_done("312", "alice")
    clock.advance(61)  # expired, never released
    state = await store.mark_done("312", "alice", "gave up")
    assert state.done.by == "alice"
    attempt = (await store.task_view("312")).attempts[0]
    assert attempt.end_reason is AttemptEnd.EXPIRED
    with pytest.raises(StaleGeneration):
        await store.append_checkpoint("312", a.attempt_id, a.generation, "LATE", {})
    again = await store.mark_done("312", "bob", "twice")  # no-op
    assert again.done.by == "alice"


async def test_a_stale_token_is_refused_and_kept(store):
    a = await store.claim("312", "worker-a", 60)
    await store.claim("312", "worker-a", 60)
    with pytest.raises(StaleGeneration):
        await store.mark_done("312", "worker-a", None, (a.attempt_id, a.generation))
    assert (await store.task_view("312")).state.done is None
    assert [r.operation for r in await store.refusals("312")] == ["task.done"]


async def test_unknown_task(store):
    with pytest.raises(NotFound):
        await store.mark_done("nope", "alice")
    with pytest.raises(NotFound):
        await store.reopen("nope", "alice", "x")


async def test_reopen_lets_a_claim_through_and_is_kept(store, clock):
    await _worked(store, "312")
    await store.mark_done("312", "alice", "done")
    state = await store.reopen("312", "bob", "one more PR")
    assert state.done is None
    assert state.reopened.by == "bob"
    assert state.reopened.note == "one more PR"
    b = await store.claim("312", "worker-b", 60)
    assert b.generation == 2
    assert b.last_checkpoint.stage == "PLAN"
    view = await store.task_view("312")
    assert view.state.reopened.by == "bob"
    assert view.state.done is None


async def test_the_state_filter_knows_done(store, clock):
    await _worked(store, "t-done")
    await store.mark_done("t-done", "alice")
    await _worked(store, "t-free")
    await store.claim("t-leased", "w", 60)
    await _worked(store, "t-waiting", effect_state=EffectState.UNKNOWN)
    assert await _names(store, "done", clock) == ["t-done"]
    assert await _names(store, "free", clock) == ["t-free", "t-waiting"]
    assert await _names(store, "leased", clock) == ["t-leased"]
    assert await _names(store, "waiting", clock) == ["t-waiting"]


async def _everything(store, task):
    view = await store.task_view(task)
    return (
        view,
        await store.checkpoints(task),
        await store.effects(task),
        await store.effect_events(task),
        await store.refusals(task),
    )


async def test_prune_deletes_ended_tasks_but_never_waiting_or_live_ones(store, clock):
    old = await _worked(store, "old-done")
    await store.claim("old-done", "worker-a", 60)  # supersede nothing: released, so a new one
    view = await store.task_view("old-done")
    await store.mark_done(
        "old-done", "worker-a", None, (view.state.lease.attempt_id, view.state.generation)
    )
    await store.note_refusal(
        StaleGeneration("old-done", old.attempt_id, old.generation, 2, "x"), "late"
    )
    await _worked(store, "old-free")
    await _worked(store, "old-waiting", effect_state=EffectState.UNKNOWN)
    await _worked(store, "old-pending", effect_state=EffectState.PENDING, release=False)
    await store.claim("old-live", "worker-l", 60 * 86400 * 40)
    clock.advance(31 * 86400)
    await _worked(store, "recent")
    cutoff = clock.now() - 30 * DAY

    names = await store.stale_tasks(cutoff, None, 100)
    assert names == ["old-done", "old-free", "old-live", "old-pending", "old-waiting"]
    assert await store.stale_tasks(cutoff, "old-free", 2) == ["old-live", "old-pending"]

    before = {n: await _everything(store, n) for n in [*names, "recent"]}
    dry = {n: await store.prune_task(n, cutoff, dry_run=True) for n in names}
    assert {n: p.kept for n, p in dry.items()} == {
        "old-done": None,
        "old-free": None,
        "old-live": "its lease is live",
        "old-pending": "an effect's outcome is not known yet (pending)",
        "old-waiting": "an effect waits for a human",
    }
    assert dry["old-done"].rows == {
        "effect_events": 2, "effects": 1, "checkpoints": 1, "fence_refusals": 1,
        "attempts": 2, "leases": 1, "tasks": 1,
    }  # fmt: skip
    assert not any(p.deleted for p in dry.values())
    assert {n: await _everything(store, n) for n in before} == before  # dry run: nothing went

    pruned = {n: await store.prune_task(n, cutoff) for n in names}
    assert sorted(n for n, p in pruned.items() if p.deleted) == ["old-done", "old-free"]
    for gone in ("old-done", "old-free"):
        assert await _everything(store, gone) == (None, [], [], [], [])
    for kept in ("old-live", "old-pending", "old-waiting", "recent"):
        assert await _everything(store, kept) == before[kept]
    assert await store.stale_tasks(cutoff, None, 100) == ["old-live", "old-pending", "old-waiting"]
    # the name can be used afresh
    fresh = await store.claim("old-done", "worker-z", 60)
    assert fresh.generation == 1
    assert fresh.last_checkpoint is None


async def test_prune_keeps_a_pending_effect_even_without_a_lease(store, clock):
    a = await _worked(store, "t", effect_state=EffectState.PENDING, release=False)
    clock.advance(120)
    await store.mark_done("t", "alice")  # the lease expired
    assert a.attempt_id
    clock.advance(31 * 86400)
    found = await store.prune_task("t", clock.now() - 30 * DAY)
    assert found.kept == "an effect's outcome is not known yet (pending)"
    assert not found.deleted
    assert (await store.task_view("t")) is not None


async def test_prune_keeps_a_task_updated_after_the_cutoff(store, clock):
    await _worked(store, "t")
    found = await store.prune_task("t", clock.now() - DAY)
    assert found.kept == "updated since the cutoff"
    assert not found.deleted
