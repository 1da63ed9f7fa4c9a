"""What every store backend promises, run against each of them (memory, SQLite, PostgreSQL)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from urllib.parse import parse_qs

import psycopg
import pytest

from sidecar.domain.model import EffectState, RecordedResponse
from sidecar.errors import (
    EffectExists,
    LeaseHeld,
    NotFound,
    StaleGeneration,
    StoreUnavailable,
    UnstorableValue,
)
from sidecar.store.base import EffectFilter, TaskFilter
from tests.conftest import StoreFactory


async def test_walkthrough_of_task_312(store, clock):
    a = await store.claim("312", "worker-a", 2)
    await store.append_checkpoint("312", a.attempt_id, a.generation, "READ_COMPLETE", {})
    with pytest.raises(LeaseHeld):
        await store.claim("312", "worker-b", 2)
    clock.advance(2)
    b = await store.claim("312", "worker-b", 2)
    assert b.generation == a.generation + 1
    assert b.last_checkpoint is not None
    assert b.last_checkpoint.stage == "READ_COMPLETE"
    with pytest.raises(StaleGeneration):
        await store.append_checkpoint("312", a.attempt_id, a.generation, "PATCH_GENERATED", {})
    written = await store.append_checkpoint("312", b.attempt_id, b.generation, "PATCH_APPLIED", {})
    assert written.seq == 2
    view = await store.task_view("312")
    assert [x.attempt_id for x in view.attempts] == [a.attempt_id, b.attempt_id]
    assert [c.stage for c in await store.checkpoints("312")] == ["READ_COMPLETE", "PATCH_APPLIED"]


async def test_refused_writes_are_kept_as_evidence(store, clock):
    a = await store.claim("312", "a", 1)
    clock.advance(1)
    b = await store.claim("312", "b", 1)
    for write in (
        store.append_checkpoint("312", a.attempt_id, a.generation, "X", {}),
        store.heartbeat("312", a.attempt_id, a.generation),
        store.release("312", a.attempt_id, a.generation),
    ):
        with pytest.raises(StaleGeneration):
            await write
    refused = await store.refusals("312")
    assert [r.operation for r in refused] == ["checkpoint", "heartbeat", "release"]
    assert {(r.generation, r.current_generation) for r in refused} == {(1, b.generation)}
    assert await store.checkpoints("312") == []


async def test_unknown_tasks_are_not_found(store):
    assert await store.task_view("nope") is None
    with pytest.raises(NotFound):
        await store.heartbeat("nope", "att-x", 1)


async def test_concurrent_claims_grant_exactly_one(store):
    results = await asyncio.gather(
        *(store.claim("312", f"w{i}", 30) for i in range(40)), return_exceptions=True
    )
    granted = [r for r in results if not isinstance(r, BaseException)]
    assert len(granted) == 1
    assert all(isinstance(r, LeaseHeld) for r in results if r is not granted[0])
    assert granted[0].generation == 1


async def test_concurrent_checkpoints_get_distinct_consecutive_numbers(store):
    a = await store.claim("312", "a", 30)
    written = await asyncio.gather(
        *(
            store.append_checkpoint("312", a.attempt_id, a.generation, f"S{i}", {"i": i})
            for i in range(100)
        )
    )
    assert sorted(c.seq for c in written) == list(range(1, 101))


async def test_a_takeover_in_the_same_batch_fences_the_writes_queued_after_it(store, clock):
    a = await store.claim("312", "a", 30)
    before, takeover, after = await asyncio.gather(
        store.append_checkpoint("312", a.attempt_id, a.generation, "BEFORE", {}),
        store.claim("312", "a", 30),  # same worker restarted: supersedes attempt a
        store.append_checkpoint("312", a.attempt_id, a.generation, "AFTER", {}),
        return_exceptions=True,
    )
    assert before.seq == 1
    assert takeover.previous_attempt_id == a.attempt_id
    assert isinstance(after, StaleGeneration)


async def test_effect_lifecycle_with_audit_trail(store, clock):
    a = await store.claim("312", "a", 30)
    kwargs = dict(
        kind="http",
        rule="github.pulls.create",
        fingerprint="sha256:1",
        idempotency_key=f"{a.attempt_id}:0011",
        request={"method": "POST", "url": "https://api.github.com/repos/o/r/pulls"},
    )
    pending = await store.record_pending("312", "pr#1", a.attempt_id, a.generation, **kwargs)
    assert pending.state is EffectState.PENDING
    with pytest.raises(EffectExists) as exists:
        await store.record_pending("312", "pr#1", a.attempt_id, a.generation, **kwargs)
    assert exists.value.existing.idempotency_key == f"{a.attempt_id}:0011"
    answer = RecordedResponse(201, (("content-type", "application/json"),), b'{"number": 1}')
    done = await store.transition_effect(
        "312", "pr#1", a.attempt_id, a.generation, EffectState.COMPLETED, response=answer
    )
    assert done.response == answer
    await store.note_effect("312", "pr#1", a.attempt_id, a.generation, "replayed")
    events = await store.effect_events("312")
    assert [e.event for e in events] == ["pending", "completed", "replayed"]
    assert (await store.effect("312", "pr#1")).response.body == b'{"number": 1}'
    assert (await store.task_view("312")).effect_counts == {"completed": 1}


async def test_a_new_attempt_retries_an_unknown_effect_with_the_first_key(store, clock):
    a = await store.claim("312", "a", 5)
    await store.record_pending(
        "312",
        "push",
        a.attempt_id,
        1,
        kind="git",
        rule="git.push",
        fingerprint="f",
        idempotency_key="k-1",
        request={},
    )
    await store.transition_effect("312", "push", a.attempt_id, 1, EffectState.UNKNOWN)
    clock.advance(5)
    b = await store.claim("312", "b", 5)
    retried = await store.transition_effect(
        "312", "push", b.attempt_id, b.generation, EffectState.PENDING
    )
    assert retried.idempotency_key == "k-1"
    assert retried.origin_attempt_id == a.attempt_id
    assert retried.attempt_id == b.attempt_id


async def test_everything_acknowledged_survives_a_reopen(open_store: StoreFactory, clock):
    first = await open_store()
    a = await first.claim("312", "a", 30)
    await first.append_checkpoint("312", a.attempt_id, 1, "READ_COMPLETE", {"files": 12})
    await first.record_pending(
        "312",
        "k",
        a.attempt_id,
        1,
        kind="http",
        rule="r",
        fingerprint="f",
        idempotency_key=None,
        request={"m": "POST"},
    )
    await first.close()
    again = await open_store()
    view = await again.task_view("312")
    assert view.state.lease.attempt_id == a.attempt_id
    assert [(c.stage, c.outputs) for c in await again.checkpoints("312")] == [
        ("READ_COMPLETE", {"files": 12})
    ]
    assert (await again.effect("312", "k")).state is EffectState.PENDING


async def test_list_tasks_summarises_every_task(store):
    for task in ("1", "2"):
        c = await store.claim(task, "a", 30)
        await store.append_checkpoint(task, c.attempt_id, c.generation, f"DONE-{task}", {})
    listed = await store.list_tasks()
    assert [(v.state.task, v.last_checkpoint.stage) for v in listed] == [
        ("1", "DONE-1"),
        ("2", "DONE-2"),
    ]


async def test_the_store_proves_itself_writable(backend, store, store_url):
    await store.check_writable()
    if backend == "memory":
        pytest.skip("a memory store keeps nothing durable: no storage could refuse a write")
    refuse_every_write(backend, store_url)
    with pytest.raises(StoreUnavailable):
        await store.check_writable()


def refuse_every_write(backend: str, store_url: str) -> None:
    """Make the store's database refuse every insert, update and delete from now on (a
    trigger on each of its tables), as a disk gone read-only or revoked rights would."""
    if backend == "sqlite":
        with contextlib.closing(sqlite3.connect(store_url.removeprefix("sqlite:///"))) as db:
            tables = db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            ).fetchall()
            for (table,) in tables:
                for verb in ("INSERT", "UPDATE", "DELETE"):
                    db.execute(
                        f'CREATE TRIGGER "refuse_{verb}_{table}" BEFORE {verb} ON "{table}"'
                        " BEGIN SELECT RAISE(ABORT, 'this store is read-only'); END"
                    )
            db.commit()
        return
    server, _, query = store_url.partition("?")
    schema = parse_qs(query)["schema"][0]
    with psycopg.connect(server, autocommit=True) as db:
        db.execute(
            f'CREATE FUNCTION "{schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS'
            " $$BEGIN RAISE EXCEPTION 'this store is read-only'; END$$"
        )
        tables = db.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
        ).fetchall()
        for (table,) in tables:
            db.execute(
                f'CREATE TRIGGER refuse BEFORE INSERT OR UPDATE OR DELETE ON "{schema}"."{table}"'
                f' FOR EACH STATEMENT EXECUTE FUNCTION "{schema}".refuse()'
            )


async def test_an_ended_attempt_remembers_until_when_its_lease_let_it_act(store, clock):
    a = await store.claim("312", "a", 10)
    expires = a.lease_expires_at
    clock.advance(30)
    b = await store.claim("312", "b", 10)
    old = await store.attempt(a.attempt_id)
    assert (old.end_reason.value, old.lease_until) == ("expired", expires)
    clock.advance(1)
    await store.release("312", b.attempt_id, b.generation)
    released = await store.attempt(b.attempt_id)
    assert (released.end_reason.value, released.lease_until) == ("released", clock.now())
    assert (await store.attempt("att-nope")) is None


async def test_a_write_fenced_before_it_reached_the_store_is_kept_with_the_others(store, clock):
    a = await store.claim("312", "a", 1)
    clock.advance(1)
    await store.claim("312", "b", 1)
    fenced = StaleGeneration("312", a.attempt_id, a.generation, 2, "superseded by generation 2")
    await store.note_refusal(fenced, "POST api.github.com/repos/acme/app/pulls: superseded")
    (kept,) = await store.refusals("312")
    assert (kept.operation, kept.attempt_id, kept.generation, kept.current_generation) == (
        "proxy",
        a.attempt_id,
        1,
        2,
    )
    assert kept.reason.startswith("POST api.github.com/repos/acme/app/pulls")


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_value_the_store_cannot_hold_fails_only_its_own_write(store, clock):
    """One client's unstorable write (here a generation beyond 64 bits, whose refusal
    the store keeps as evidence) shares a group-commit batch with good writes: only it is
    refused, and every other write of the batch commits."""
    claims = [await store.claim(f"t{i}", "w", 60) for i in range(20)]
    good = [
        store.append_checkpoint(c.task, c.attempt_id, c.generation, "STAGE", {"i": i})
        for i, c in enumerate(claims)
    ]
    poisoned = [store.heartbeat(c.task, c.attempt_id, 1 << 63) for c in claims[:5]]
    outcomes = await asyncio.gather(*good, *poisoned, return_exceptions=True)
    written, refused = outcomes[: len(good)], outcomes[len(good) :]
    assert all(not isinstance(w, BaseException) for w in written), written
    assert all(isinstance(r, UnstorableValue) for r in refused), refused
    for i, c in enumerate(claims):
        assert [x.outputs for x in await store.checkpoints(c.task)] == [{"i": i}]


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_lone_surrogate_already_stored_reads_back_replaced(store):
    """Written before the control API refused such values at the door: reads must still
    answer, with U+FFFD in its place."""
    a = await store.claim("312", "w", 60)
    await store.append_checkpoint("312", a.attempt_id, a.generation, "S", {"note": "x\udc00y"})
    (checkpoint,) = await store.checkpoints("312")
    assert checkpoint.outputs == {"note": "x\ufffdy"}


async def test_the_effect_log_reads_a_page_at_a_time_in_the_order_of_the_whole(store, clock):
    a = await store.claim("312", "a", 30)
    for n in range(7):
        if n == 4:
            clock.advance(1)  # three effects share a moment, then four share a later one
        await store.record_pending(
            "312",
            f"key-{6 - n}",  # keys sort against the order of recording
            a.attempt_id,
            a.generation,
            kind="http",
            rule="r",
            fingerprint="f",
            idempotency_key=None,
            request={},
        )
    whole = [e.key for e in await store.effects("312")]
    pages, after = [], None
    while True:
        page = await store.effects_page("312", after, 3)
        if not page:
            break
        pages.append([e.key for e in page])
        after = (page[-1].created_at, page[-1].key)
    assert [key for page in pages for key in page] == whole
    assert [len(page) for page in pages] == [3, 3, 1]
    trail = await store.effect_events_of([("312", key) for key in pages[0]])
    assert sorted({e.key for e in trail}) == sorted(pages[0])


async def test_checkpoints_read_a_page_at_a_time(store):
    a = await store.claim("312", "a", 30)
    for n in range(5):
        await store.append_checkpoint("312", a.attempt_id, a.generation, f"S{n}", {})
    first = await store.checkpoints_page("312", 0, 2)
    rest = await store.checkpoints_page("312", first[-1].seq, 10)
    assert [c.stage for c in first + rest] == ["S0", "S1", "S2", "S3", "S4"]


async def test_tasks_are_listed_newest_first_and_filtered(store, clock):
    for n, worker in enumerate(["a", "b", "a"]):
        await store.claim(f"t{n}", worker, 30)
        clock.advance(1)
    released = await store.claim("t3", "a", 30)
    await store.release("t3", released.attempt_id, released.generation)
    everything = TaskFilter()
    first = await store.tasks_page(everything, None, 2, clock.now())
    last = first[-1].state
    rest = await store.tasks_page(everything, (last.created_at, last.task), 10, clock.now())
    assert [v.state.task for v in first + rest] == ["t3", "t2", "t1", "t0"]
    leased_by_a = await store.tasks_page(TaskFilter("leased", "a"), None, 10, clock.now())
    assert [v.state.task for v in leased_by_a] == ["t2", "t0"]
    free = await store.tasks_page(TaskFilter("free"), None, 10, clock.now())
    assert [v.state.task for v in free] == ["t3"]
    clock.advance(60)  # every lease has run out
    free = await store.tasks_page(TaskFilter("free"), None, 10, clock.now())
    assert [v.state.task for v in free] == ["t3", "t2", "t1", "t0"]


async def test_effects_of_every_task_are_listed_by_state(store, clock):
    for task in ("t1", "t2"):
        a = await store.claim(task, "w", 30)
        for key in ("k1", "k2"):
            await store.record_pending(
                task, key, a.attempt_id, a.generation, kind="http", rule=f"r-{key}",
                fingerprint="f", idempotency_key=None, request={},
            )  # fmt: skip
            clock.advance(1)
        await store.transition_effect(task, "k1", a.attempt_id, a.generation, EffectState.UNKNOWN)
    waiting = await store.effects_across(EffectFilter(state="unknown"), None, 10)
    assert [(e.task, e.key) for e in waiting] == [("t2", "k1"), ("t1", "k1")]
    newest = await store.effects_across(EffectFilter(), None, 3)
    e = newest[-1]
    older = await store.effects_across(EffectFilter(), (e.created_at, e.task, e.key), 3)
    assert [(e.task, e.key) for e in newest + older] == [
        ("t2", "k2"), ("t2", "k1"), ("t1", "k2"), ("t1", "k1"),
    ]  # fmt: skip
    by_rule = await store.effects_across(EffectFilter(rule="r-k2", task="t1"), None, 10)
    assert [(e.task, e.key) for e in by_rule] == [("t1", "k2")]
    waiting_tasks = await store.tasks_page(TaskFilter("waiting"), None, 10, clock.now())
    assert [v.state.task for v in waiting_tasks] == ["t2", "t1"]
    assert waiting_tasks[0].effect_counts == {"unknown": 1, "pending": 1}
