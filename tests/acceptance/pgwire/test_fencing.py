"""Fencing and refusals on the PostgreSQL path: a matched statement from a stale
generation, or from a connection bound to no task, gets an ErrorResponse with a clear
message and a SQLSTATE, and never runs.  Transactions the agent rolls back (or that fail
and answer COMMIT with ROLLBACK) leave nothing to replay."""

from __future__ import annotations

import json
import time
import urllib.request

import psycopg
import pytest
from psycopg import errors

from tests.acceptance.pgwire.conftest import events
from tests.support.postgres import Attempt, PostgresWorld

pytestmark = pytest.mark.acceptance

STALE_TTL_S = 1.0


def connect(
    world: PostgresWorld, attempt: Attempt | None = None, **kw: object
) -> psycopg.Connection:
    options = {"options": attempt.pgoptions} if attempt else {}
    return psycopg.connect(world.client_url(), **options, **kw)  # type: ignore[arg-type]


def take_over(world: PostgresWorld, task: str = "312") -> Attempt:
    """worker-a's short lease runs out; worker-b claims the task (generation + 1)."""
    time.sleep(STALE_TTL_S + 0.1)
    return world.claim(task, "worker-b")


def exists(world: PostgresWorld, table: str) -> bool:
    return bool(world.value("SELECT to_regclass(%s) IS NOT NULL", table))


@pytest.mark.parametrize("simple", [False, True], ids=["extended", "simple"])
def test_a_stale_generation_is_refused_and_its_statement_never_runs(
    world: PostgresWorld, simple: bool
) -> None:
    stale = world.claim("312", "worker-a", ttl_s=STALE_TTL_S)
    kw = {"cursor_factory": psycopg.ClientCursor} if simple else {}
    with connect(world, stale, autocommit=True, **kw) as db:
        take_over(world)
        with pytest.raises(psycopg.Error) as refused:
            db.execute("CREATE TABLE written_by_a (id integer)")
        assert refused.value.sqlstate == "ES409"
        assert "generation" in str(refused.value)
        # Reads are not effects: the stale worker may still look around.
        assert db.execute("SELECT 1").fetchone() == (1,)
    assert not exists(world, "written_by_a")
    task = world.effects()
    assert task == []  # nothing was logged for the stale attempt
    # ... but the refusal is in the audit trail, as an HTTP one is, and counted once.
    refused_writes = wait_for_refusals(world, 1)
    assert refused_writes[0]["attempt_id"] == stale.attempt_id
    assert "SQL on database" in refused_writes[0]["reason"]
    assert stale_writes_counted(world) == 1


def wait_for_refusals(world: PostgresWorld, count: int) -> list[dict[str, object]]:
    """The task's refused writes once ``count`` are there (they are kept in the background)."""
    deadline = time.monotonic() + 10
    while True:
        with urllib.request.urlopen(f"{world.control}/v1/tasks/312", timeout=10) as answer:
            found: list[dict[str, object]] = json.load(answer)["refused_writes"]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def stale_writes_counted(world: PostgresWorld) -> float:
    with urllib.request.urlopen(f"{world.control}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("sidecar_stale_writes_refused_total{")
    )


def test_a_stale_transaction_is_closed_at_the_takeover_and_rolled_back(
    world: PostgresWorld,
) -> None:
    world.rows("CREATE TABLE notes (body text)")
    stale = world.claim("312", "worker-a", ttl_s=STALE_TTL_S)
    with connect(world, stale) as db:
        db.execute("INSERT INTO notes VALUES ('unguarded write of a')")
        take_over(world)
        # Closed at the claim, not at its next statement: a stalled worker's open
        # transaction must not hold its locks against the attempt that took over.
        with pytest.raises(psycopg.Error) as refused:
            db.execute("CREATE TABLE written_by_a (id integer)")
        assert refused.value.sqlstate == "ES409"
        assert "no longer holds the lease" in str(refused.value)
        assert db.broken
    assert not exists(world, "written_by_a")
    assert world.value("SELECT count(*) FROM notes") == 0  # its whole transaction is gone


def test_a_frozen_stale_transaction_does_not_block_the_worker_that_took_over(
    world: PostgresWorld,
) -> None:
    world.rows("CREATE TABLE accounts (id integer PRIMARY KEY, balance integer)")
    world.rows("INSERT INTO accounts VALUES (1, 100)")
    stale = world.claim("312", "worker-a", ttl_s=STALE_TTL_S)
    db = connect(world, stale)
    try:
        db.execute("UPDATE accounts SET balance = 0 WHERE id = 1")  # holds the row lock
        current = take_over(world)  # ... and worker-a stalls: it sends nothing more
        with connect(world, current, autocommit=True) as taken_over:
            taken_over.execute("SET statement_timeout = '5s'")
            taken_over.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
        with pytest.raises(psycopg.Error):
            db.commit()  # worker-a comes back: its transaction is gone
    finally:
        db.close()
    assert world.value("SELECT balance FROM accounts WHERE id = 1") == 101


def test_a_connection_bound_to_no_task_cannot_run_matched_statements(
    world: PostgresWorld,
) -> None:
    with connect(world, autocommit=True) as db:
        with pytest.raises(psycopg.Error) as refused:
            db.execute("CREATE TABLE unbound (id integer)")
        assert refused.value.sqlstate == "ES428"
        assert "sidecar exec" in str(refused.value)
        assert db.execute("SELECT 2").fetchone() == (2,)  # everything else goes through
    assert not exists(world, "unbound")


def test_a_task_nobody_holds_is_refused(world: PostgresWorld) -> None:
    with psycopg.connect(world.client_url(), options="-c sidecar.task=999", autocommit=True) as db:
        with pytest.raises(psycopg.Error) as refused:
            db.execute("CREATE TABLE nobody (id integer)")
        assert refused.value.sqlstate == "ES428"
    assert not exists(world, "nobody")


def test_a_rolled_back_transaction_leaves_nothing_to_replay(world: PostgresWorld) -> None:
    attempt = world.claim("312")
    with connect(world, attempt) as db:
        db.execute("CREATE TABLE drafts (id integer)")
        db.rollback()
        db.execute("CREATE TABLE drafts (id integer)")  # runs: nothing was recorded
        db.commit()
    assert exists(world, "drafts")
    (effect,) = world.settled_effects()
    assert events(effect) == ["pending", "failed", "pending", "completed"]
    assert world.recorded() == {effect["key"]: "CREATE TABLE"}


def test_commit_of_a_failed_transaction_answers_rollback_and_records_nothing(
    world: PostgresWorld,
) -> None:
    attempt = world.claim("312")
    with connect(world, attempt) as db:
        db.execute("CREATE TABLE halfway (id integer)")
        with pytest.raises(errors.DivisionByZero):
            db.execute("SELECT 1/0")
        db.commit()  # psycopg sends COMMIT; the server answers ROLLBACK
    assert not exists(world, "halfway")
    assert world.recorded() == {}
    (effect,) = world.settled_effects()
    assert effect["state"] == "failed"

    with connect(world, world.claim("312")) as db:  # the next attempt runs it for real
        db.execute("CREATE TABLE halfway (id integer)")
        db.commit()
    assert exists(world, "halfway")
