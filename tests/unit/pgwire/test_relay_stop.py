"""A stopping relay (``Relay.stop``): the connections still open get a grace to end -
a statement running may finish and be answered - then are closed, and what was open on
them rolls back, its record with it.  Before, the relay waited for every agent to
disconnect, so an agent's idle connection kept ``sidecar serve`` from ever stopping.

The relay in process, a scratch database on the real PostgreSQL, psycopg as the agent."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from sidecar.rules import load_rules
from tests.support.pg_relay import Relay, new_attempt, records, relay_on, still_running


async def stopped_within(relay: Relay, grace_s: float) -> float:
    started = time.monotonic()
    await relay.server.stop(grace_s=grace_s)
    return time.monotonic() - started


async def test_an_idle_connection_is_closed_at_once(relay):
    async with await relay.connect(await new_attempt(relay.store)) as connection:
        assert await (await connection.execute("SELECT 1")).fetchone() == (1,)
        assert await stopped_within(relay, grace_s=10) < 1
        with pytest.raises(psycopg.OperationalError):
            await connection.execute("SELECT 1")


async def test_an_open_transaction_gets_the_grace_then_is_rolled_back(relay):
    """The agent may be about to commit: it is given the grace, not cut at once; after
    it, its transaction rolls back with the records made in it."""
    relay.database.rows("CREATE TABLE ledger (entry text)")
    async with await relay.connect(await new_attempt(relay.store)) as connection:
        await connection.execute("BEGIN")
        await connection.execute("INSERT INTO ledger VALUES ('uncommitted')")
        assert 0.5 <= await stopped_within(relay, grace_s=0.5) < 3
        with pytest.raises(psycopg.OperationalError):
            await connection.execute("COMMIT")
    assert relay.database.rows("SELECT entry FROM ledger") == []
    assert records(relay.database) == []


async def test_without_sql_rules_a_connection_only_copied_gets_the_grace(tmp_path, database):
    """With no SQL rule the relay copies bytes without framing them, so it cannot tell
    an idle connection from a busy one: each gets the grace."""
    async with (
        relay_on(tmp_path, load_rules([]), database) as relay,
        await relay.connect(None) as connection,
    ):
        assert await (await connection.execute("SELECT 1")).fetchone() == (1,)
        assert 0.5 <= await stopped_within(relay, grace_s=0.5) < 3
        with pytest.raises(psycopg.OperationalError):
            await connection.execute("SELECT 1")


async def test_a_statement_that_ends_within_the_grace_is_answered_and_recorded(relay):
    async with await relay.connect(await new_attempt(relay.store)) as connection:
        running = asyncio.ensure_future(
            connection.execute("/* sidecar:key=short-nap */ SELECT pg_sleep(0.5)")
        )
        await asyncio.sleep(0.2)  # on its way
        stopping = asyncio.ensure_future(relay.server.stop(grace_s=10))
        assert (await running).statusmessage == "SELECT 1"
        await stopping
    assert [(key, tag) for key, _, tag in records(relay.database)] == [("short-nap", "SELECT 1")]


async def test_a_statement_still_running_after_the_grace_is_cut_and_nothing_of_it_commits(relay):
    relay.database.rows("CREATE TABLE ledger (entry text)")
    async with await relay.connect(await new_attempt(relay.store)) as connection:
        await connection.execute("INSERT INTO ledger VALUES ('before')")
        running = asyncio.ensure_future(
            connection.execute(
                "/* sidecar:key=long-nap */ INSERT INTO ledger SELECT 'after' FROM pg_sleep(30)"
            )
        )
        await asyncio.sleep(0.3)
        took = await stopped_within(relay, grace_s=0.5)
        assert took < 3
        with pytest.raises(psycopg.OperationalError):
            await running
    # Cancelled on the server, not left to sleep on with its locks until it next writes.
    assert await still_running(relay.database, "pg_sleep(30)", within_s=5) == 0
    assert relay.database.rows("SELECT entry FROM ledger") == [("before",)]
    assert "long-nap" not in [key for key, _, _ in records(relay.database)]
