"""Real client libraries through the sidecar's PostgreSQL port.

Pass-through first: whatever no rule concerns must behave exactly as it does against
the server itself - psycopg 3 (simple and extended protocol, pipeline mode), asyncpg
(prepared statements), COPY both ways, LISTEN/NOTIFY, cancelling a query.  Then the
exactly-once path as each client speaks it: a matched statement replayed to a new
attempt gets the recorded command tag and rows, in that client's protocol flavour.
"""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import psycopg
import pytest
from psycopg import errors

from sidecar.rules.packs import packs_dir
from tests.acceptance.pgwire.conftest import HERE
from tests.support.postgres import Attempt, PostgresWorld

pytestmark = pytest.mark.acceptance


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory, postgres_server: str
) -> Iterator[PostgresWorld]:
    rules = [packs_dir() / "postgres.yaml", HERE / "app-rules.yaml"]
    world = PostgresWorld.start(tmp_path_factory.mktemp("clients"), rules=rules)
    world.rows("CREATE TABLE items (id integer PRIMARY KEY, name text NOT NULL)")
    yield world
    world.close()


@pytest.fixture
def table(world: PostgresWorld, request: pytest.FixtureRequest) -> str:
    """A fresh table of this test's own."""
    name = "t_" + request.node.name.split("[")[0].removeprefix("test_")[:40]
    world.rows(f"DROP TABLE IF EXISTS {name}; CREATE TABLE {name} (id integer, name text)")
    return name


def connect(
    world: PostgresWorld, attempt: Attempt | None = None, **kw: object
) -> psycopg.Connection:
    options = {"options": attempt.pgoptions} if attempt else {}
    return psycopg.connect(world.client_url(), autocommit=True, **options, **kw)  # type: ignore[arg-type]


# ---- pass-through ----------------------------------------------------------------------


def test_psycopg_extended_protocol_with_parameters(world: PostgresWorld, table: str) -> None:
    with connect(world) as db:
        db.execute(f"INSERT INTO {table} VALUES (%s, %s)", (1, "one"))
        db.execute(f"INSERT INTO {table} VALUES (%s, %s)", (2, None))
        rows = db.execute(f"SELECT id, name FROM {table} WHERE id >= %s ORDER BY id", (1,))
        assert rows.fetchall() == [(1, "one"), (2, None)]


def test_psycopg_simple_protocol_with_several_statements(world: PostgresWorld, table: str) -> None:
    with connect(world, cursor_factory=psycopg.ClientCursor) as db:
        cursor = db.execute(
            f"INSERT INTO {table} VALUES (1, 'a'); INSERT INTO {table} VALUES (2, 'b');"
            f" SELECT count(*) FROM {table}"
        )
        assert cursor.statusmessage == "INSERT 0 1"
        assert cursor.nextset()
        assert cursor.nextset()
        assert cursor.fetchone() == (2,)


def test_psycopg_pipeline_mode_and_an_error_in_the_middle(world: PostgresWorld, table: str) -> None:
    with connect(world) as db:
        with db.pipeline():
            for n in range(200):
                db.execute(f"INSERT INTO {table} VALUES (%s, %s)", (n, f"n{n}"))
        assert db.execute(f"SELECT count(*) FROM {table}").fetchone() == (200,)
        with pytest.raises(errors.DivisionByZero), db.pipeline():  # noqa: PT012 - one batch
            db.execute(f"INSERT INTO {table} VALUES (%s, 'x')", (1000,))
            db.execute("SELECT 1/0")
            db.execute(f"INSERT INTO {table} VALUES (%s, 'y')", (1001,))
        # The connection carries on after the failed batch.
        assert db.execute("SELECT 41 + 1").fetchone() == (42,)


def test_prepared_statements_executed_many_times(world: PostgresWorld, table: str) -> None:
    with connect(world, prepare_threshold=0) as db:
        for n in range(20):
            db.execute(f"INSERT INTO {table} VALUES (%s, %s)", (n, str(n)), prepare=True)
        assert db.execute(f"SELECT sum(id) FROM {table}", prepare=True).fetchone() == (190,)


def test_copy_in_and_out(world: PostgresWorld, table: str) -> None:
    lines = "".join(f"{n}\tname {n}\n" for n in range(5000))
    with connect(world) as db:
        with db.cursor().copy(f"COPY {table} FROM STDIN") as copy:
            copy.write(lines)
        out = io.StringIO()
        with db.cursor().copy(f"COPY (SELECT * FROM {table} ORDER BY id) TO STDOUT") as copy:
            for chunk in copy:
                out.write(bytes(chunk).decode())
    assert out.getvalue() == lines


def test_a_large_result_set(world: PostgresWorld) -> None:
    with connect(world) as db:
        rows = db.execute("SELECT n, repeat('x', 100) FROM generate_series(1, 50000) n").fetchall()
    assert len(rows) == 50000
    assert rows[-1] == (50000, "x" * 100)


def test_listen_notify_between_two_connections(world: PostgresWorld) -> None:
    with connect(world) as listener, connect(world) as sender:
        listener.execute("LISTEN jobs")
        sender.execute("NOTIFY jobs, 'job 7 is ready'")
        got = next(listener.notifies(timeout=5))
    assert (got.channel, got.payload) == ("jobs", "job 7 is ready")


def test_cancelling_a_running_query_reaches_the_server(world: PostgresWorld) -> None:
    with connect(world) as db:
        threading.Timer(0.5, db.cancel).start()
        started = time.monotonic()
        with pytest.raises(errors.QueryCanceled):
            db.execute("SELECT pg_sleep(30)")
        assert time.monotonic() - started < 10
        assert db.execute("SELECT 1").fetchone() == (1,)


def test_asyncpg_prepared_statements_and_a_transaction(world: PostgresWorld, table: str) -> None:
    async def scenario() -> list[asyncpg.Record]:
        db = await asyncpg.connect(world.client_url(), ssl=False)
        try:
            insert = await db.prepare(f"INSERT INTO {table} VALUES ($1, $2)")
            async with db.transaction():
                for n in range(10):
                    await insert.fetch(n, f"row {n}")
            select = await db.prepare(f"SELECT id, name FROM {table} WHERE id < $1 ORDER BY id")
            return list(await select.fetch(3))
        finally:
            await db.close()

    assert [tuple(r) for r in asyncio.run(scenario())] == [(0, "row 0"), (1, "row 1"), (2, "row 2")]


def test_psql_runs_a_script_through_it(world: PostgresWorld, tmp_path: Path) -> None:
    script = tmp_path / "report.sql"
    script.write_text("SELECT 'count=' || count(*) FROM items;\n\\echo done\n")
    psql = world.direct("psql", "-X", "-At", "-f", str(script))
    psql.wait(timeout=30)  # the direct run: the same output as through the sidecar
    env_through = world.agent_env()
    through = world.direct(
        "env", *[f"{k}={v}" for k, v in env_through.items()], "psql", "-X", "-At", "-f", str(script)
    )
    assert through.wait(timeout=30) == 0
    assert through.lines == psql.lines == ["count=0", "done"]


# ---- exactly once, as each client speaks it --------------------------------------------

KEYED_INSERT = (
    "/* sidecar:key=create-{table} */ INSERT INTO {table} (id, name)"
    " VALUES (1, 'first'), (2, 'second') RETURNING id, name"
)


def test_psycopg_replay_returns_the_recorded_rows(world: PostgresWorld, table: str) -> None:
    task = f"clients-{table}"
    sql = KEYED_INSERT.format(table=table)
    with connect(world, world.claim(task)) as db:
        first = db.execute(sql).fetchall()
    with connect(world, world.claim(task)) as db:  # the next attempt
        again = db.execute(sql)
        assert again.fetchall() == first == [(1, "first"), (2, "second")]
        assert again.statusmessage == "INSERT 0 2"
    assert world.value(f"SELECT count(*) FROM {table}") == 2


def test_simple_protocol_replay_returns_the_recorded_rows(world: PostgresWorld, table: str) -> None:
    task = f"clients-{table}"
    sql = KEYED_INSERT.format(table=table)
    with connect(world, world.claim(task), cursor_factory=psycopg.ClientCursor) as db:
        first = db.execute(sql).fetchall()
    with connect(world, world.claim(task), cursor_factory=psycopg.ClientCursor) as db:
        assert db.execute(sql).fetchall() == first
    assert world.value(f"SELECT count(*) FROM {table}") == 2


def test_asyncpg_replay_returns_the_recorded_rows(world: PostgresWorld, table: str) -> None:
    task = f"clients-{table}"
    sql = KEYED_INSERT.format(table=table)

    async def run(attempt: Attempt) -> list[tuple[object, ...]]:
        settings = {"sidecar.task": attempt.task, "sidecar.attempt": attempt.attempt_id}
        db = await asyncpg.connect(world.client_url(), ssl=False, server_settings=settings)
        try:
            statement = await db.prepare(sql)
            return [tuple(r) for r in await statement.fetch()]
        finally:
            await db.close()

    first = asyncio.run(run(world.claim(task)))
    again = asyncio.run(run(world.claim(task)))
    assert again == first == [(1, "first"), (2, "second")]
    assert world.value(f"SELECT count(*) FROM {table}") == 2


def test_the_same_statement_twice_in_one_attempt_runs_twice_and_the_next_replays_both(
    world: PostgresWorld, table: str
) -> None:
    """SPEC §3.9: the second run inside one attempt is new work (here it fails, as it
    would without the sidecar); a new attempt from the top is answered from the records."""
    task = f"clients-{table}"
    add = f"ALTER TABLE {table} ADD COLUMN note text"
    drop = f"ALTER TABLE {table} DROP COLUMN note"
    with connect(world, world.claim(task)) as db:
        for sql in (add, drop, add):
            assert db.execute(sql).statusmessage == "ALTER TABLE"
        with pytest.raises(psycopg.errors.DuplicateColumn):
            db.execute(add)  # really run: the column is there
    with connect(world, world.claim(task)) as db:
        for sql in (add, drop, add):  # the next attempt, from the top: all replayed
            assert db.execute(sql).statusmessage == "ALTER TABLE"
    columns = "SELECT count(*) FROM information_schema.columns WHERE table_name = %s"
    assert world.value(columns + " AND column_name = 'note'", table) == 1
    effects = world.settled_effects(task)
    done = [e for e in effects if e["state"] == "completed"]
    assert len(done) == 3, effects  # add, drop, add #2 - replayed to the next attempt
    assert all([e["event"] for e in effect["events"]][-1] == "replayed" for effect in done)
    (failed,) = [e for e in effects if e["state"] != "completed"]
    assert (failed["key"].endswith(" #3"), failed["state"]) == (True, "failed")


def test_the_same_statement_with_new_parameters_is_a_new_effect(world: PostgresWorld) -> None:
    task = "clients-ledger"
    world.rows("CREATE TABLE ledger_entries (id integer, amount integer)")
    insert = "INSERT INTO ledger_entries VALUES (%s, 100)"
    with connect(world, world.claim(task)) as db:
        for n in (1, 2):
            db.execute(insert, (n,))
    with connect(world, world.claim(task)) as db:  # the next attempt: replayed
        for n in (1, 2, 2):  # ... and the second 2 is a second run: new work
            db.execute(insert, (n,))
        for n in (3, 4):  # a keyed comment names the effect, whatever the parameters
            db.execute("/* sidecar:key=opening-entry */ " + insert, (n,))
    assert world.rows("SELECT id FROM ledger_entries ORDER BY id") == [(1,), (2,), (2,), (3,)]
    with connect(world, world.claim(task)) as db:  # once more from the top: all replayed
        for n in (1, 2, 2):
            db.execute(insert, (n,))
        db.execute("/* sidecar:key=opening-entry */ " + insert, (3,))
    assert world.rows("SELECT id FROM ledger_entries ORDER BY id") == [(1,), (2,), (2,), (3,)]


@pytest.mark.parametrize("simple", [False, True], ids=["extended", "simple"])
def test_a_statement_that_cannot_run_in_a_transaction_still_runs_once(
    world: PostgresWorld, table: str, simple: bool
) -> None:
    task = f"clients-{table}-{simple}"
    index = f"{table}_by_name_{int(simple)}"
    sql = f"CREATE INDEX CONCURRENTLY {index} ON {table} (name)"
    kw = {"cursor_factory": psycopg.ClientCursor} if simple else {}
    with connect(world, world.claim(task), **kw) as db:
        assert db.execute(sql).statusmessage == "CREATE INDEX"
    with connect(world, world.claim(task), **kw) as db:  # the next attempt: replayed
        assert db.execute(sql).statusmessage == "CREATE INDEX"
    assert world.value("SELECT count(*) FROM pg_indexes WHERE indexname = %s", index) == 1
    (effect,) = world.settled_effects(task)
    assert [e["event"] for e in effect["events"]] == ["pending", "completed", "replayed"]
