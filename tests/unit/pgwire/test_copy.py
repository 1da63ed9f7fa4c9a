"""COPY matched by a rule (``sidecar.pgwire.exactly_once``, ``sidecar.pgwire.session``).

A ``COPY ... FROM STDIN`` sent as a simple query (as psql, psycopg and asyncpg send it)
is recorded like any statement, in the same transaction as its record: its first run
streams the agent's rows to the server; a later attempt is asked for its rows with the
recorded CopyInResponse, which are swallowed, and gets the recorded ``COPY n``.  A COPY
whose rows the sidecar cannot carry (TO STDOUT, FROM STDIN by the extended protocol, a
COPY beside other statements in one query) is refused with a clear error before anything
runs, instead of leaving the agent and the server waiting for each other; a COPY on the
server's own files or programs is recorded and replayed like any statement.

The relay in process, a scratch database on the real PostgreSQL, psycopg as the agent;
each exchange under a timeout, so a hang fails the test instead of stalling the suite."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path

import asyncpg
import psycopg
import pytest
from psycopg import generators

from sidecar.domain.model import EffectState
from sidecar.pgwire import messages
from sidecar.pgwire.codec import BackendReader, Message, message, startup_packet
from sidecar.rules import RuleSet
from sidecar.rules.sql import Statement
from tests.support.pg_relay import Relay, new_attempt, records, rules_of, still_running
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
LOAD = "COPY parts (id, name) FROM STDIN"
IDLE = psycopg.pq.TransactionStatus.IDLE


class Stopped(Exception):
    """The agent gives up in the middle of its rows (psycopg then sends CopyFail)."""


@pytest.fixture
def rules(tmp_path: Path) -> RuleSet:
    return rules_of(tmp_path, RULES)


@pytest.fixture(autouse=True)
def parts(database: ScratchDatabase) -> None:
    database.rows("CREATE TABLE parts (id int, name text)")


async def copy_in(
    connection: psycopg.AsyncConnection,
    rows: Iterable[tuple[object, ...]] = ROWS,
    statement: str = LOAD,
) -> int:
    """The agent loads ``rows`` with psycopg's COPY; the count its server answered."""
    cursor = connection.cursor()
    async with cursor.copy(statement) as copy:
        for row in rows:
            await copy.write_row(row)
    return cursor.rowcount


async def attempt_loads(relay: Relay, worker: str, rows: Iterable[tuple[object, ...]]) -> int:
    attempt = await new_attempt(relay.store, worker)
    async with asyncio.timeout(20), await relay.connect(attempt) as connection:
        loaded = await copy_in(connection, rows)
        assert connection.info.transaction_status == IDLE
        return loaded


def stored_parts(relay: Relay) -> list[tuple[object, ...]]:
    return relay.database.rows("SELECT id, name FROM parts ORDER BY id")


async def logged(relay: Relay) -> list[str]:
    """What the effect log says of the one effect: its events in order."""
    (key,) = await relay.effects()
    return [event for event, _ in await relay.events(key)]


async def test_a_copy_from_stdin_loads_once_and_the_next_attempt_is_answered_from_its_record(
    relay,
):
    assert await attempt_loads(relay, "worker-a", ROWS) == 3
    assert await attempt_loads(relay, "worker-b", ROWS) == 3  # as if it had loaded them
    assert stored_parts(relay) == ROWS
    assert [tag for _, _, tag in records(relay.database)] == ["COPY 3"]
    assert await logged(relay) == ["pending", "completed", "replayed"]


async def test_asyncpgs_copy_of_records_loads_once_too(relay):
    tags = []
    for worker in ("worker-a", "worker-b"):
        attempt = await new_attempt(relay.store, worker)
        settings = {"sidecar.task": "312", "sidecar.attempt": attempt}
        url = f"postgresql://postgres@127.0.0.1:{relay.port}/{relay.database.name}"
        async with asyncio.timeout(20):
            connection = await asyncpg.connect(url, ssl=False, server_settings=settings)
            try:
                tags.append(await connection.copy_records_to_table("parts", records=ROWS))
            finally:
                await connection.close()
    assert tags == ["COPY 3", "COPY 3"]
    assert stored_parts(relay) == ROWS
    assert await logged(relay) == ["pending", "completed", "replayed"]


async def test_a_replay_swallows_whatever_rows_the_agent_sends(relay):
    """The key is the statement's, not its rows': the n-th load of the same COPY in a
    task is one effect, whatever a later attempt would load with it."""
    await attempt_loads(relay, "worker-a", ROWS)
    assert await attempt_loads(relay, "worker-b", [(7, "cog")] * 1000) == 3
    assert stored_parts(relay) == ROWS


async def test_rows_larger_than_any_buffer_are_streamed_in_full(relay):
    many = [(n, "x" * 200) for n in range(40_000)]  # about 8 MiB of rows
    assert await attempt_loads(relay, "worker-a", many) == 40_000
    assert relay.database.rows("SELECT count(*), sum(id) FROM parts") == [
        (40_000, sum(range(40_000)))
    ]


async def test_rows_sent_faster_than_the_server_takes_them_wait_and_arrive_whole(relay):
    """A trigger slows the server down (5 ms a row): the agent's rows fill the sockets'
    buffers and pile up in the sidecar past its backlog, the agent is read no further
    until they are sent, then again - none is lost or sent twice."""
    relay.database.rows(
        "CREATE FUNCTION slowly() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN PERFORM pg_sleep(0.005); RETURN NEW; END$$;"
        " CREATE TRIGGER slowly BEFORE INSERT ON parts FOR EACH ROW EXECUTE FUNCTION slowly()"
    )
    rows = [(n, "y" * 100_000) for n in range(120)]  # 12 MB: more than sockets hold
    async with asyncio.timeout(60):
        assert await attempt_loads(relay, "worker-a", rows) == 120
    assert relay.database.rows("SELECT count(*), sum(id), min(length(name)) FROM parts") == [
        (120, sum(range(120)), 100_000)
    ]


async def test_a_binary_copy_is_asked_for_again_in_binary_on_replay(relay):
    statement = "COPY parts (id, name) FROM STDIN (FORMAT BINARY)"
    for worker in ("worker-a", "worker-b"):
        attempt = await new_attempt(relay.store, worker)
        async with asyncio.timeout(20), await relay.connect(attempt) as connection:
            cursor = connection.cursor()
            async with cursor.copy(statement) as copy:
                copy.set_types(["int4", "text"])
                for row in ROWS:
                    await copy.write_row(row)
            assert cursor.rowcount == 3
    assert stored_parts(relay) == ROWS
    assert await logged(relay) == ["pending", "completed", "replayed"]


async def test_inside_the_agents_transaction_the_load_counts_only_if_it_commits(relay):
    attempt = await new_attempt(relay.store)
    async with asyncio.timeout(20), await relay.connect(attempt) as connection:
        await connection.execute("BEGIN")
        await copy_in(connection)
        await connection.execute("ROLLBACK")
        assert stored_parts(relay) == []
        assert records(relay.database) == []
        await connection.execute("BEGIN")
        assert await copy_in(connection) == 3  # run again: nothing of the first committed
        await connection.execute("COMMIT")
    assert stored_parts(relay) == ROWS
    assert list((await relay.effects()).values()) == [EffectState.COMPLETED]


async def test_the_agent_failing_its_copy_loads_and_records_nothing(relay):
    attempt = await new_attempt(relay.store)
    async with asyncio.timeout(20), await relay.connect(attempt) as connection:

        def then_stop() -> Iterable[tuple[object, ...]]:
            yield from ROWS
            raise Stopped

        with pytest.raises(Stopped):
            await copy_in(connection, then_stop())
        assert connection.info.transaction_status == IDLE
        assert await copy_in(connection) == 3  # the same connection goes on
    assert stored_parts(relay) == ROWS
    assert [tag for _, _, tag in records(relay.database)] == ["COPY 3"]


async def test_a_replay_the_agent_fails_is_an_error_as_the_server_would_give(relay):
    await attempt_loads(relay, "worker-a", ROWS)
    attempt = await new_attempt(relay.store, "worker-b")
    async with asyncio.timeout(20), await relay.connect(attempt) as connection:
        await connection.execute("BEGIN")

        def stop_at_once() -> Iterable[tuple[object, ...]]:
            raise Stopped
            yield  # a generator

        with pytest.raises(Stopped):
            await copy_in(connection, stop_at_once())
        # As after PostgreSQL's own "COPY from stdin failed": the transaction is failed.
        with pytest.raises(psycopg.errors.InFailedSqlTransaction):
            await connection.execute("SELECT 1")
        await connection.execute("ROLLBACK")
        assert await copy_in(connection) == 3  # and the replay, asked again, answers
    assert stored_parts(relay) == ROWS


async def test_a_row_the_server_refuses_fails_the_load_and_records_nothing(relay):
    attempt = await new_attempt(relay.store)
    async with asyncio.timeout(20), await relay.connect(attempt) as connection:
        with pytest.raises(psycopg.errors.InvalidTextRepresentation):
            await copy_in(connection, [(1, "bolt"), ("one", "nut"), *[(5, "x")] * 5000])
        assert connection.info.transaction_status == IDLE
        assert await (await connection.execute("SELECT count(*) FROM parts")).fetchone() == (0,)
    assert records(relay.database) == []
    assert list((await relay.effects()).values()) == [EffectState.FAILED]


async def test_a_copy_to_stdout_is_refused_before_anything_runs(relay):
    relay.database.rows("INSERT INTO parts VALUES (1, 'bolt')")
    attempt = await new_attempt(relay.store)
    async with asyncio.timeout(20), await relay.connect(attempt) as connection:
        with pytest.raises(psycopg.Error, match=r"rule load\.copy matches this COPY TO") as no:
            async with connection.cursor().copy("COPY parts TO STDOUT") as copy:
                assert [row async for row in copy] == []
        assert no.value.sqlstate == "ES422"
        assert connection.info.transaction_status == IDLE
    assert records(relay.database) == []
    assert await relay.effects() == {}  # not even logged pending: it never started


async def test_a_copy_from_stdin_by_the_extended_protocol_is_refused_with_the_way_out(relay):
    """(psycopg, psql and asyncpg never send one: libpq's PQsendQueryParams does.)"""
    attempt = await new_attempt(relay.store)
    async with asyncio.timeout(20), await relay.connect(attempt) as connection:
        pgconn = connection.pgconn
        pgconn.send_query_params(LOAD.encode(), None)
        results = await connection.wait(generators.execute(pgconn))
        assert [r.status for r in results] == [psycopg.pq.ExecStatus.FATAL_ERROR]
        error = results[0].error_message.decode()
        assert "sent by the extended protocol" in error
        assert "as a simple query" in error
        assert results[0].error_field(psycopg.pq.DiagnosticField.SQLSTATE) == b"ES422"
        assert connection.info.transaction_status == IDLE
    assert stored_parts(relay) == []


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


async def test_a_copy_on_the_servers_side_is_recorded_once_and_replayed(relay):
    load = "COPY parts FROM PROGRAM 'printf \"1\\tbolt\\n2\\tnut\\n\"'"
    first = await relay.run(await new_attempt(relay.store), load)
    again = await relay.run(await new_attempt(relay.store, "worker-b"), load)
    assert first == again == ["COPY 2"]
    assert stored_parts(relay) == [(1, "bolt"), (2, "nut")]
    assert [tag for _, _, tag in records(relay.database)] == ["COPY 2"]


async def test_a_copy_the_text_did_not_show_ends_in_an_error_not_a_hang(relay, monkeypatch):
    """Should a COPY from the agent ever pass the text's check, the server asking the
    sidecar for rows is answered with CopyFail: the statement fails, with the sidecar's
    reason, and nothing of it or its record commits."""
    monkeypatch.setattr(Statement, "copies_through_connection", lambda self: False)
    monkeypatch.setattr(Statement, "copies_from_agent", lambda self: False)
    attempt = await new_attempt(relay.store)
    async with asyncio.timeout(20), await relay.connect(attempt) as connection:
        with pytest.raises(psycopg.Error, match="cannot stream rows through the connection"):
            await copy_in(connection)
        assert connection.info.transaction_status == IDLE
        assert await (await connection.execute("SELECT 1")).fetchone() == (1,)
    assert stored_parts(relay) == []
    assert records(relay.database) == []


class RawAgent:
    """An agent speaking the protocol byte by byte: what no client library would send."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.backend = BackendReader()

    @classmethod
    async def connect(cls, relay: Relay) -> RawAgent:
        attempt = await new_attempt(relay.store)
        options = f"-c sidecar.task=312 -c sidecar.attempt={attempt}"
        agent = cls(*await asyncio.open_connection("127.0.0.1", relay.port))
        user = {"user": "postgres", "database": relay.database.name, "options": options}
        agent.writer.write(startup_packet(user))
        await agent.until_ready()
        return agent

    async def until_ready(self) -> list[Message]:
        answers: list[Message] = []
        while not answers or answers[-1].kind != b"Z":
            data = await self.reader.read(65536)
            assert data, "the sidecar closed the connection"
            answers += self.backend.feed(data)
        return answers

    async def start_copy(self) -> None:
        """Send the COPY; until the sidecar asks for its rows (CopyInResponse)."""
        self.writer.write(messages.query(LOAD))
        asked: list[Message] = []
        while not asked:
            asked = self.backend.feed(await self.reader.read(65536))
        assert [m.kind for m in asked] == [b"G"]


async def test_a_message_no_copy_takes_among_the_rows_fails_the_load_and_is_answered_after(
    relay,
):
    """A client that sends a Query in the middle of its rows: the COPY fails, as
    PostgreSQL fails it ("unexpected message type 0x51 during COPY"), nothing loads, and
    the Query is answered after it - nothing the agent sent is lost."""
    async with asyncio.timeout(20):
        agent = await RawAgent.connect(relay)
        try:
            await agent.start_copy()
            agent.writer.write(message(b"d", b"1\tbolt\n") + messages.query("SELECT 41 + 1"))
            answers = await agent.until_ready()
            assert [m.kind for m in answers] == [b"E", b"Z"]
            assert b"unexpected message type 0x51 during COPY" in answers[0].raw
            answers = await agent.until_ready()
            assert [m.kind for m in answers] == [b"T", b"D", b"C", b"Z"]
            assert answers[1].raw.endswith(b"42")
        finally:
            agent.writer.close()
    assert stored_parts(relay) == []
    assert records(relay.database) == []


async def test_garbage_among_the_rows_ends_the_connection_and_the_servers_copy(relay):
    """A message length no client sends (2 GiB) in the middle of the rows: the sidecar
    ends the agent's connection with a FATAL error and fails the server's COPY; nothing
    loads and no backend is left waiting for rows."""
    async with asyncio.timeout(20):
        agent = await RawAgent.connect(relay)
        try:
            await agent.start_copy()
            agent.writer.write(message(b"d", b"1\tbolt\n") + b"d\x7f\xff\xff\xff" + b"x" * 64)
            # A FATAL error naming the length, as PostgreSQL's own, and the connection closed.
            (fatal,) = agent.backend.feed(await agent.reader.read())
            assert fatal.kind == b"E"
            assert b"FATAL" in fatal.raw
            assert b"2147483647" in fatal.raw
        finally:
            agent.writer.close()
        assert await still_running(relay.database, "COPY parts", within_s=5) == 0
    assert stored_parts(relay) == []
    assert records(relay.database) == []
