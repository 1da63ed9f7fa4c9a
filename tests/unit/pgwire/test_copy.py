"""COPY matched by a rule (``sidecar.pgwire.exactly_once``): a COPY whose rows go through
the connection (FROM STDIN, TO STDOUT) cannot be recorded - a record keeps a command tag
and rows, not a COPY stream - so it is refused with a clear error before anything runs,
instead of leaving the agent and the server waiting for each other; a COPY on the
server's own files or programs is recorded and replayed like any statement.

The relay in process, a scratch database on the real PostgreSQL, psycopg as the agent;
each exchange under a timeout, so a hang fails the test instead of stalling the suite."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

from sidecar.rules import RuleSet
from sidecar.rules.sql import Statement
from tests.support.pg_relay import new_attempt, records, rules_of
from tests.support.postgres import ScratchDatabase

RULES = """
rules:
  - name: load.copy
    match: {sql: {kind: [COPY]}}
    effect: non_idempotent
  - name: pg.ddl
    match: {sql: {kind: [CREATE]}}
    effect: non_idempotent
"""
ROWS = [(1, "bolt"), (2, "nut"), (3, "gear")]


@pytest.fixture
def rules(tmp_path: Path) -> RuleSet:
    return rules_of(tmp_path, RULES)


@pytest.fixture(autouse=True)
def parts(database: ScratchDatabase) -> None:
    database.rows("CREATE TABLE parts (id int, name text)")


async def copy_in(connection: psycopg.AsyncConnection) -> None:
    async with connection.cursor().copy("COPY parts (id, name) FROM STDIN") as copy:
        for row in ROWS:
            await copy.write_row(row)


async def test_a_recorded_copy_from_stdin_is_refused_before_anything_runs(relay):
    attempt = await new_attempt(relay.store)
    async with asyncio.timeout(20), await relay.connect(attempt) as connection:
        with pytest.raises(psycopg.Error, match=r"rule load\.copy matches this COPY") as refused:
            await copy_in(connection)
        assert refused.value.sqlstate == "ES422"
        assert "load the rows with INSERT" in str(refused.value)
        # The connection goes on, idle: nothing was left open on the server.
        assert connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert await (await connection.execute("SELECT count(*) FROM parts")).fetchone() == (0,)
    assert records(relay.database) == []
    assert await relay.effects() == {}  # not even logged pending: it never started


async def test_a_recorded_copy_to_stdout_is_refused_too(relay):
    relay.database.rows("INSERT INTO parts VALUES (1, 'bolt')")
    attempt = await new_attempt(relay.store)
    async with asyncio.timeout(20), await relay.connect(attempt) as connection:
        with pytest.raises(psycopg.Error) as refused:
            async with connection.cursor().copy("COPY parts TO STDOUT") as copy:
                assert [row async for row in copy] == []
        assert refused.value.sqlstate == "ES422"
    assert records(relay.database) == []


async def test_a_copy_in_one_query_with_a_recorded_statement_is_refused_whole(relay):
    """psql -c "CREATE TABLE ...; COPY ... FROM STDIN" sends both in one Query: the rows
    would come in the middle of the sidecar's own requests, so none of it runs."""
    attempt = await new_attempt(relay.store)
    async with asyncio.timeout(20), await relay.connect(attempt) as connection:
        with pytest.raises(psycopg.Error, match="Send the COPY in a query of its own") as refused:
            await connection.execute("CREATE TABLE bins (id int); COPY parts FROM STDIN")
        assert refused.value.sqlstate == "ES422"
        assert await (await connection.execute("SELECT 1")).fetchone() == (1,)
    assert relay.database.value("SELECT to_regclass('bins') IS NULL")
    assert records(relay.database) == []


async def test_inside_the_agents_transaction_the_refusal_fails_the_transaction(relay):
    """As any refusal does: what the agent did before it in the transaction cannot
    commit without the COPY it meant to go with it."""
    attempt = await new_attempt(relay.store)
    async with asyncio.timeout(20), await relay.connect(attempt) as connection:
        await connection.execute("BEGIN")
        await connection.execute("INSERT INTO parts VALUES (9, 'spring')")
        with pytest.raises(psycopg.Error) as refused:
            await copy_in(connection)
        assert refused.value.sqlstate == "ES422"
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            await connection.execute("SELECT 1")
        await connection.execute("ROLLBACK")
    assert relay.database.rows("SELECT * FROM parts") == []


async def test_a_copy_on_the_servers_side_is_recorded_once_and_replayed(relay):
    load = "COPY parts FROM PROGRAM 'printf \"1\\tbolt\\n2\\tnut\\n\"'"
    first = await relay.run(await new_attempt(relay.store), load)
    again = await relay.run(await new_attempt(relay.store, "worker-b"), load)
    assert first == again == ["COPY 2"]
    assert relay.database.rows("SELECT id, name FROM parts ORDER BY id") == [
        (1, "bolt"),
        (2, "nut"),
    ]
    assert [tag for _, _, tag in records(relay.database)] == ["COPY 2"]


async def test_a_copy_the_text_did_not_show_ends_in_an_error_not_a_hang(relay, monkeypatch):
    """Should a COPY from the agent ever pass the text's check, the server asking the
    sidecar for rows is answered with CopyFail: the statement fails, with the sidecar's
    reason, and nothing of it or its record commits."""
    monkeypatch.setattr(Statement, "copies_through_connection", lambda self: False)
    attempt = await new_attempt(relay.store)
    async with asyncio.timeout(20), await relay.connect(attempt) as connection:
        with pytest.raises(psycopg.Error, match="cannot stream rows through the connection"):
            await copy_in(connection)
        assert connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert await (await connection.execute("SELECT 1")).fetchone() == (1,)
    assert relay.database.rows("SELECT * FROM parts") == []
    assert records(relay.database) == []
