"""The relay's background effect-log writes land before the attempt's lease is released.

After a statement commits, its ``completed`` is written in the background (held back a
moment to share a commit). An agent that exits at once is followed by ``sidecar exec``
releasing the lease; the release route waits for those writes, so the next attempt finds
the outcome - and one that still comes later is kept (SPEC §3.7).
"""

from __future__ import annotations

from datetime import UTC, datetime

from sidecar.domain.model import EffectState
from sidecar.errors import StoreUnavailable
from sidecar.pgwire.mirror import Done, LogMirror, Mirrors
from sidecar.recording.bindings import Binding, Bindings
from sidecar.recording.recorder import Recorder
from sidecar.rules.matcher import SqlRuleMatch
from sidecar.rules.model import Rule
from sidecar.rules.sql import Statement
from sidecar.runtime.clock import SystemClock
from sidecar.runtime.metrics import Metrics

KEY = "seed-order-statuses"
DDL = {"name": "postgres.ddl", "match": {"sql": {"kind": ["CREATE"]}}, "effect": "non_idempotent"}


async def ran_and_committed(store, mirrors: Mirrors) -> tuple[str, int]:
    """Attempt 1 ran the statement and its transaction committed just now: the effect is
    pending in the log, its completion held back in the connection's mirror."""
    claim = await store.claim("312", "worker-a", 60)
    await store.record_pending(
        "312", KEY, claim.attempt_id, claim.generation,
        kind="sql", rule="postgres.dml", fingerprint="sha256:x", idempotency_key=None,
        request={"database": "shop_312"},
    )  # fmt: skip
    binding = Binding(
        "312", claim.attempt_id, claim.generation, "worker-a", datetime.now(UTC), 60, "default"
    )
    recorder = Recorder(store, Bindings(store, SystemClock()), Metrics())
    mirror = LogMirror(recorder, "shop_312", mirrors)
    mirror.ended(Done(binding, KEY, "postgres.dml", "INSERT 0 3"), committed=True)
    return claim.attempt_id, claim.generation


async def test_a_release_waits_for_the_connections_held_back_writes(make_client, memory_store):
    mirrors = Mirrors()
    client = await make_client(before_release=lambda task, attempt_id: mirrors.settle())
    attempt_id, generation = await ran_and_committed(memory_store, mirrors)

    released = await client.post(
        "/v1/tasks/312/release", json={"attempt_id": attempt_id, "generation": generation}
    )

    assert released.status == 200
    effect = await memory_store.effect("312", KEY)
    assert effect.state is EffectState.COMPLETED
    assert effect.attempt_id == attempt_id


async def test_a_completion_landing_after_the_release_is_still_kept(make_client, memory_store):
    """SPEC §3.7: without the wait, the statement's outcome arrives after the release and
    is recorded all the same (the outcome of the attempt's own statement is never fenced)."""
    mirrors = Mirrors()
    client = await make_client()
    attempt_id, generation = await ran_and_committed(memory_store, mirrors)

    await client.post(
        "/v1/tasks/312/release", json={"attempt_id": attempt_id, "generation": generation}
    )
    await mirrors.settle()

    effect = await memory_store.effect("312", KEY)
    assert effect.state is EffectState.COMPLETED, "kept although the lease was released"
    assert effect.attempt_id == attempt_id


async def test_a_short_store_blip_does_not_fail_the_statement(memory_store):
    """SPEC §3.4 on the SQL path too: logging a statement pending is retried within the
    recorder's bound, exactly as an HTTP effect's is (once, it failed at the first blip)."""
    claim = await memory_store.claim("312", "worker-a", 60)
    real = memory_store.record_pending
    blips = [StoreUnavailable("locked for a moment")]

    async def flaky(*args, **kwargs):
        if blips:
            raise blips.pop()
        return await real(*args, **kwargs)

    memory_store.record_pending = flaky
    recorder = Recorder(memory_store, Bindings(memory_store, SystemClock()), Metrics())
    binding = Binding(
        "312", claim.attempt_id, claim.generation, "worker-a", datetime.now(UTC), 60, "pg"
    )
    match = SqlRuleMatch(Rule.model_validate(DDL), True)
    statement = Statement.of("CREATE TABLE t (id int)")
    mirror = LogMirror(recorder, "shop_312")
    assert await mirror.pending(binding, match, "sql:t", statement) is None
    assert blips == []
    assert (await memory_store.effect("312", "sql:t")).state is EffectState.PENDING
