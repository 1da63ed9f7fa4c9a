"""Exactly-once SQL (``sidecar.pgwire.exactly_once``): a statement a rule records runs
once per task - its record is written in the agent's database in the same transaction as
the statement, and a later attempt that sends it again is answered from that record.

In-process (``tests/support/pg_relay.py``): the relay as ``sidecar serve`` assembles it, a
SQLite store in ``tmp_path``, a scratch database on the real PostgreSQL, psycopg as the agent.
Assertions are on the database (rows that exist, statements that ran) and the effect log."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from sidecar.domain.model import EffectState
from sidecar.pgwire.exactly_once import PgEffects
from sidecar.rules import load_rules
from sidecar.rules.sql import Statement
from sidecar.runtime.metrics import Metrics
from tests.support.pg_relay import new_attempt, records, relay_on, still_running

# ---- a statement runs once per task --------------------------------------------------


async def test_a_recorded_statement_sent_again_by_a_later_attempt_is_answered_from_its_record(
    relay,
):
    first = await new_attempt(relay.store)
    assert await relay.run(first, "CREATE TABLE customers (id int)") == ["CREATE TABLE"]
    second = await new_attempt(relay.store, "worker-b")
    # Run again it would fail ("relation already exists"); replayed it answers as it did.
    assert await relay.run(second, "CREATE TABLE customers (id int)") == ["CREATE TABLE"]
    ((key, recorded_by, tag),) = records(relay.database)
    assert (recorded_by, tag) == (first, "CREATE TABLE")
    assert (await relay.effects()) == {key: EffectState.COMPLETED}
    events = await relay.events(key)
    assert ("replayed", second) in events


async def test_rows_a_statement_returned_are_replayed_not_made_again(relay):
    relay.database.rows("CREATE TABLE ledger (id serial PRIMARY KEY, entry text)")
    insert = "INSERT INTO ledger (entry) VALUES ('pay invoice 7') RETURNING id, entry"

    async def inserted(attempt_id: str) -> list[tuple[int, str]]:
        async with await relay.connect(attempt_id) as connection:
            return await (await connection.execute(insert)).fetchall()

    first = await inserted(await new_attempt(relay.store))
    again = await inserted(await new_attempt(relay.store, "worker-b"))
    assert first == again == [(1, "pay invoice 7")]
    assert relay.database.rows("SELECT id, entry FROM ledger") == [(1, "pay invoice 7")]


async def test_a_record_the_effect_log_never_saw_is_replayed_and_the_connection_goes_on(
    relay, tmp_path, rules
):
    """Another sidecar, with an effect log of its own (or this one's, lost), meets the
    record of a statement it is sent again: the statement does not run a second time."""
    relay.database.rows("CREATE TABLE ledger (id serial PRIMARY KEY, entry text)")
    insert = "INSERT INTO ledger (entry) VALUES ('pay invoice 7') RETURNING id, entry"
    async with await relay.connect(await new_attempt(relay.store)) as connection:
        first = await (await connection.execute(insert)).fetchall()
    (tmp_path / "other").mkdir()
    async with relay_on(tmp_path / "other", rules, relay.database) as other:
        async with await other.connect(await new_attempt(other.store, "worker-b")) as connection:
            again = await (await connection.execute(insert)).fetchall()
            # The transaction the record failed in is gone: the connection is idle, and
            # the sidecar left none of its prepared statements behind on the server.
            assert connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            prepared = await connection.execute(
                "SELECT count(*) FROM pg_prepared_statements WHERE name LIKE '__effect_sidecar%'"
            )
            assert await prepared.fetchone() == (0,)
            later = await connection.execute("INSERT INTO ledger (entry) VALUES ('new')")
            assert later.statusmessage == "INSERT 0 1"
        key = records(relay.database)[0][0]
        assert (await other.effects())[key] is EffectState.COMPLETED
        assert [event for event, _ in await other.events(key)][-1] == "replayed"
    assert first == again == [(1, "pay invoice 7")]
    # The statement sent behind the failed record never ran: not even its id was taken.
    assert relay.database.rows("SELECT id, entry FROM ledger ORDER BY id") == [
        (1, "pay invoice 7"),
        (2, "new"),
    ]


@pytest.mark.parametrize("how", ["alone", "extended", "in a transaction"])
async def test_a_database_made_again_under_the_same_name_gets_the_records_table_again(relay, how):
    """An agent resets its database between runs (DROP DATABASE, CREATE DATABASE): the
    first statement recorded on a new connection to it is recorded, not refused because
    the sidecar remembered the table of the database that was dropped."""
    relay.database.rows("CREATE TABLE ledger (entry text)")
    attempt = await new_attempt(relay.store)
    assert await relay.run(attempt, "INSERT INTO ledger VALUES ('first')") == ["INSERT 0 1"]
    relay.database.drop()
    with psycopg.connect(relay.database.admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{relay.database.name}"')
    relay.database.rows("CREATE TABLE ledger (entry text)")
    async with await relay.connect(attempt) as connection:
        assert await asyncio.wait_for(_insert(connection, how, "again"), 10) == "INSERT 0 1"
    assert relay.database.rows("SELECT entry FROM ledger") == [("again",)]
    assert len(records(relay.database)) == 1


async def test_a_statement_the_log_completed_that_runs_again_in_a_new_database_is_told(relay):
    """The next attempt of a task meets a database made again since its first ran the
    statement there: no record, so the statement runs again - the database is the truth -
    and the log, which keeps the effect completed by the first, says it ran again."""
    first = await new_attempt(relay.store)
    assert await relay.run(first, "CREATE TABLE t1 (id int)") == ["CREATE TABLE"]
    relay.database.drop()
    with psycopg.connect(relay.database.admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{relay.database.name}"')
    again = await new_attempt(relay.store, "worker-b")
    assert await relay.run(again, "CREATE TABLE t1 (id int)") == ["CREATE TABLE"]
    assert relay.database.value("SELECT to_regclass('t1') IS NOT NULL")
    ((key, state),) = (await relay.effects()).items()
    assert state is EffectState.COMPLETED
    assert await relay.events(key) == [
        ("pending", first),
        ("completed", first),
        ("ran_again", again),
    ]
    (note,) = [e for e in await relay.store.effect_events("312") if e.event == "ran_again"]
    assert note.detail is not None
    assert note.detail.startswith(f"CREATE TABLE: ran again in database {relay.database.name}")


async def _insert(connection: psycopg.AsyncConnection, how: str, entry: str) -> str:
    """INSERT ``entry`` as the agent sends it: ``alone`` (a simple Query outside a
    transaction), ``extended`` (with a parameter) or ``in a transaction`` of its own."""
    if how == "extended":
        return (await connection.execute("INSERT INTO ledger VALUES (%s)", [entry])).statusmessage
    text = f"INSERT INTO ledger VALUES ('{entry}')"
    if how == "alone":
        return (await connection.execute(text)).statusmessage
    async with connection.transaction():
        return (await connection.execute(text)).statusmessage


async def _prepared(connection: psycopg.AsyncConnection) -> list[tuple[str]]:
    """The statements of the sidecar's own the server still holds for this connection."""
    found = await connection.execute(
        "SELECT name FROM pg_prepared_statements WHERE name LIKE '__effect_sidecar%'"
    )
    return await found.fetchall()


@pytest.mark.parametrize("how", ["alone", "extended", "in a transaction"])
@pytest.mark.parametrize(
    ("refused", "trigger"),
    [("the record", "BEFORE INSERT"), ("its completion", "BEFORE UPDATE")],
)
async def test_a_record_the_server_refuses_fails_its_statement_and_the_connection_goes_on(
    relay, how, refused, trigger
):
    """The server refuses the statement's record, or to complete it with the answer once
    the statement ran (a trigger; a full disk, a lock timeout): the statement fails, rolled
    back with its record, the connection is idle and goes on, and none of the statements
    the sidecar prepared for its own requests is left on the server."""
    relay.database.rows("CREATE TABLE ledger (entry text)")
    attempt = await new_attempt(relay.store)
    await relay.run(attempt, "INSERT INTO ledger VALUES ('first')")  # the records' table made
    relay.database.rows(
        "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN RAISE EXCEPTION 'no room'; END$$;"
        f" CREATE TRIGGER refuse {trigger} ON effect_sidecar.effects"
        " FOR EACH ROW EXECUTE FUNCTION refuse()"
    )
    async with await relay.connect(attempt) as connection:
        with pytest.raises(psycopg.Error, match="no room"):
            await asyncio.wait_for(_insert(connection, how, "second"), 10)
        assert connection.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        if how != "extended":  # (there the Close messages go with the next statement)
            assert await _prepared(connection) == []
        relay.database.rows("DROP TRIGGER refuse ON effect_sidecar.effects")
        assert await _insert(connection, how, "second") == "INSERT 0 1"
        assert await _prepared(connection) == []
    assert relay.database.rows("SELECT entry FROM ledger ORDER BY entry") == [
        ("first",),
        ("second",),
    ]


async def test_statements_no_rule_records_pass_through_every_time(relay):
    relay.database.rows("CREATE TABLE notes (entry text)")
    for worker in ("worker-a", "worker-b"):
        attempt = await new_attempt(relay.store, worker)
        assert await relay.run(attempt, "INSERT INTO notes VALUES ('hi')", "SELECT 1") == [
            "INSERT 0 1",
            "SELECT 1",
        ]
    assert relay.database.value("SELECT count(*) FROM notes") == 2
    assert records(relay.database) == []


async def test_the_same_statement_repeated_in_one_attempt_is_one_effect_per_repetition(relay):
    relay.database.rows("CREATE TABLE ledger (entry text)")
    entry = "INSERT INTO ledger VALUES ('tick')"
    first = await new_attempt(relay.store)
    await relay.run(first, entry, entry)
    assert relay.database.value("SELECT count(*) FROM ledger") == 2
    # A resumed attempt repeats the work from the top: the first two are replayed, the
    # third is new.
    second = await new_attempt(relay.store, "worker-b")
    await relay.run(second, entry, entry, entry)
    assert relay.database.value("SELECT count(*) FROM ledger") == 3
    keys = [key for key, _, _ in records(relay.database)]
    assert len(keys) == len(set(keys)) == 3
    assert keys[1] == f"{keys[0]} #2"


async def test_parameters_are_part_of_what_makes_an_effect_the_same(relay):
    relay.database.rows("CREATE TABLE ledger (entry text)")
    for worker in ("worker-a", "worker-b"):
        attempt = await new_attempt(relay.store, worker)
        async with await relay.connect(attempt) as connection:  # extended protocol
            for entry in ("one", "two"):
                await connection.execute("INSERT INTO ledger VALUES (%s)", (entry,))
    assert sorted(relay.database.rows("SELECT entry FROM ledger")) == [("one",), ("two",)]
    assert len(records(relay.database)) == 2


async def test_a_keyed_comment_names_the_effect_whatever_the_statement(relay):
    relay.database.rows("CREATE TABLE seeds (n int)")
    first = await new_attempt(relay.store)
    await relay.run(first, "/* sidecar:key=seed */ INSERT INTO seeds VALUES (1)")
    second = await new_attempt(relay.store, "worker-b")
    await relay.run(second, "/* sidecar:key=seed */ INSERT INTO seeds VALUES (2)")
    assert relay.database.rows("SELECT n FROM seeds") == [(1,)]
    assert [key for key, _, _ in records(relay.database)] == ["seed"]


# ---- the record shares the statement's transaction ----------------------------------


async def test_a_statement_rolled_back_by_the_agent_leaves_no_record_and_runs_again(relay):
    relay.database.rows("CREATE TABLE ledger (entry text)")
    attempt = await new_attempt(relay.store)
    async with await relay.connect(attempt) as connection:
        await connection.execute("BEGIN")
        await connection.execute("INSERT INTO ledger VALUES ('draft')")
        await connection.execute("ROLLBACK")
    assert records(relay.database) == []
    async with await relay.connect(attempt) as connection:
        await connection.execute("BEGIN")
        await connection.execute("INSERT INTO ledger VALUES ('draft')")
        await connection.execute("COMMIT")
    assert relay.database.rows("SELECT entry FROM ledger") == [("draft",)]
    ((key, _, tag),) = records(relay.database)
    assert tag == "INSERT 0 1"
    assert (await relay.effects())[key] is EffectState.COMPLETED


async def test_a_statement_that_fails_leaves_no_record_and_may_be_sent_again(relay):
    attempt = await new_attempt(relay.store)
    alter = "ALTER TABLE invoices ADD COLUMN paid boolean"
    async with await relay.connect(attempt) as connection:
        with pytest.raises(psycopg.errors.UndefinedTable):
            await connection.execute(alter)
        await connection.execute("CREATE TABLE invoices (id int)")
        await connection.execute(alter)
    assert relay.database.rows(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'invoices'"
        " ORDER BY ordinal_position"
    ) == [("id",), ("paid",)]
    assert [tag for _, _, tag in records(relay.database)] == ["CREATE TABLE", "ALTER TABLE"]


async def test_several_statements_of_one_query_are_recorded_together(relay):
    both = "CREATE TABLE a (x int); CREATE TABLE b (x int)"
    first = await new_attempt(relay.store)
    async with await relay.connect(first) as connection:
        await connection.execute(both, prepare=False)
    second = await new_attempt(relay.store, "worker-b")
    async with await relay.connect(second) as connection:
        await connection.execute(both, prepare=False)  # replayed whole: no "already exists"
    assert len(records(relay.database)) == 2


async def test_a_statement_that_cannot_run_in_a_transaction_still_runs_once(relay):
    relay.database.rows("CREATE TABLE big (x int)")
    index = "CREATE INDEX CONCURRENTLY big_x ON big (x)"
    first = await new_attempt(relay.store)
    assert await relay.run(first, index) == ["CREATE INDEX"]
    second = await new_attempt(relay.store, "worker-b")
    assert await relay.run(second, index) == ["CREATE INDEX"]
    assert relay.database.value("SELECT count(*) FROM pg_indexes WHERE indexname = 'big_x'") == 1
    assert records(relay.database) == [], "kept in the effect log only"
    (state,) = (await relay.effects()).values()
    assert state is EffectState.COMPLETED


async def test_a_notification_that_comes_while_a_recorded_statement_runs_reaches_the_agent(
    relay,
):
    """PostgreSQL sends a LISTENing session its notifications when a transaction ends:
    here at the sidecar's COMMIT of the statement's transaction, among the answers to a
    request of the sidecar's own.  They are the agent's all the same."""
    async with await relay.connect(await new_attempt(relay.store)) as agent:
        await agent.execute("LISTEN jobs")
        running = asyncio.ensure_future(agent.execute("/* sidecar:key=nap */ SELECT pg_sleep(0.5)"))
        await asyncio.sleep(0.2)
        relay.database.rows("NOTIFY jobs, 'job 7 is ready'")
        await running
        async with asyncio.timeout(5):
            got = await anext(aiter(agent.notifies()))
    assert (got.channel, got.payload) == ("jobs", "job 7 is ready")


async def test_a_setting_the_sidecars_commit_changes_back_is_told_to_the_agents_client(relay):
    """A SET LOCAL in a query the sidecar wraps in its transaction ends with that
    transaction: the server reports the setting back at the sidecar's COMMIT, and the
    agent's client, which keeps track of it, must hear it (its TimeZone stayed Tokyo)."""
    async with await relay.connect(await new_attempt(relay.store)) as agent:
        before = agent.info.parameter_status("TimeZone")
        await agent.execute(
            "SET LOCAL TimeZone = 'Asia/Tokyo'; /* sidecar:key=tz */ CREATE TABLE tz (x int)"
        )
        assert agent.info.parameter_status("TimeZone") == before
        assert await (await agent.execute("SHOW TimeZone")).fetchone() == (before,)


# ---- who may act ---------------------------------------------------------------------


async def test_a_stale_attempts_statement_is_refused_and_never_runs(relay):
    stale = await new_attempt(relay.store)
    await new_attempt(relay.store, "worker-b")
    async with await relay.connect(stale) as connection:
        with pytest.raises(psycopg.Error) as refused:
            await connection.execute("CREATE TABLE late (x int)")
        assert refused.value.sqlstate == "ES409"
    assert relay.database.value("SELECT to_regclass('late') IS NULL")
    assert records(relay.database) == []


async def test_a_statement_running_when_its_attempt_is_fenced_is_cancelled_on_the_server(relay):
    """Its connection is closed at the takeover; the server, which notices that only when
    the statement next reads or writes it, is asked to cancel it, so its locks go now."""
    relay.database.rows("CREATE TABLE ledger (entry text)")
    async with await relay.connect(await new_attempt(relay.store)) as stale:
        running = asyncio.ensure_future(
            stale.execute(
                "/* sidecar:key=slow */ INSERT INTO ledger SELECT 'late' FROM pg_sleep(30)"
            )
        )
        await asyncio.sleep(0.3)
        await new_attempt(relay.store, "worker-b")
        with pytest.raises(psycopg.Error, match="no longer holds the lease"):
            await running
    assert await still_running(relay.database, "pg_sleep(30)", within_s=5) == 0
    assert relay.database.rows("SELECT entry FROM ledger") == []


async def test_a_connection_bound_to_no_task_may_read_but_not_record(relay):
    async with await relay.connect(None) as connection:
        assert await (await connection.execute("SELECT 41 + 1")).fetchone() == (42,)
        with pytest.raises(psycopg.Error, match="no task is bound to this connection") as refused:
            await connection.execute("CREATE TABLE orphan (x int)")
        assert refused.value.sqlstate == "ES428"
    assert relay.database.value("SELECT to_regclass('orphan') IS NULL")


async def test_after_a_refusal_the_connection_goes_on(relay):
    """A refusal awaits nothing: the engine is done at once, and the agent is read again."""
    async with asyncio.timeout(20), await relay.connect(None) as connection:
        for _ in range(3):
            with pytest.raises(psycopg.Error, match="no task is bound"):
                await connection.execute("CREATE TABLE orphan (x int)")
            assert await (await connection.execute("SELECT 7")).fetchone() == (7,)


async def test_messages_sent_with_a_guarded_statement_wait_for_it_and_keep_their_order(relay):
    """A pipeline: the statement the engine runs, then reads and another guarded statement,
    in one write - each answered in turn, the statements recorded."""
    attempt = await new_attempt(relay.store)
    async with asyncio.timeout(20), await relay.connect(attempt) as connection:
        async with connection.pipeline():
            cursors = [
                await connection.execute("CREATE TABLE piped (x int)"),
                await connection.execute("SELECT 1"),
                await connection.execute("CREATE TABLE piped_too (x int)"),
                await connection.execute("SELECT count(*) FROM piped"),
            ]
        assert [c.statusmessage for c in cursors] == [
            "CREATE TABLE", "SELECT 1", "CREATE TABLE", "SELECT 1"
        ]  # fmt: skip
        assert await cursors[3].fetchone() == (0,)
    assert [tag for _, _, tag in records(relay.database)] == ["CREATE TABLE", "CREATE TABLE"]


async def test_large_transfers_either_way_arrive_whole(relay):
    """Megabytes both ways, more than a socket buffers: the relay stops reading one side
    while the other has not taken what it sent, and nothing is lost or reordered."""
    relay.database.rows("CREATE TABLE bulk (n int, pad text)")
    rows = 6000
    async with asyncio.timeout(60), await relay.connect(None) as connection:
        async with connection.cursor().copy("COPY bulk (n, pad) FROM STDIN") as copy:
            for n in range(rows):
                await copy.write_row((n, "x" * 1000))
        cursor = await connection.execute("SELECT n, pad FROM bulk ORDER BY n")
        got = await cursor.fetchall()
    assert [n for n, _ in got] == list(range(rows))
    assert all(pad == "x" * 1000 for _, pad in got)


# ---- what every connection's engine shares -------------------------------------------


def test_a_first_look_lets_only_statements_no_rule_can_record_pass_unparsed(rules):
    shared = PgEffects(rules, None, None, Metrics())
    assert not shared.might_guard(b"SELECT * FROM ledger")
    assert not shared.might_guard(b"  update ledger set x = 1;")
    assert shared.might_guard(b"create table t (x int)")
    assert shared.might_guard(b"insert into notes values (1)"), "a kind a rule names: look closer"
    assert shared.might_guard(b"/* hello */ select 1"), "a leading comment: look closer"
    assert shared.might_guard(b"select 1; drop table t"), "several statements: look closer"
    assert not shared.guards("insert into notes values (1)"), "... and the closer look says no"
    assert shared.guards("select 1; drop table t")


# Texts near the edges of the first look: each one it lets pass must be one no rule records.
EDGES = [
    "SELECT 1;",
    "SELECT 1 ;  ;\n",
    "select 1;\t",
    "  Create TABLE t (x int)",
    "\n\tdrop table t",
    "CREATEX foo",
    "creates",
    "INSERTED",
    "inserting into ledger",
    "insert into ledger values (1)",
    "SELECT ';'",
    "select 1; ",
    "select 1;;select 2",
    "select 1; /* x */ drop table t",
    "select 1 -- trailing comment",
    "-- leading\nCREATE TABLE t (x int)",
    "/*c*/DROP TABLE t",
    "select '/* sidecar:key=k */'",
    "SELECT 1 /* sidecar:key=k1 */",
    "(SELECT 1)",
    "",
    "   ",
    ";",
    "WITH x AS (SELECT 1) INSERT INTO ledger SELECT * FROM x",
    "alter table ledger add column y int;",
]


@pytest.mark.parametrize("text", EDGES)
def test_what_the_first_look_lets_pass_no_rule_records(rules, text):
    shared = PgEffects(rules, None, None, Metrics())
    if not shared.might_guard(text.encode()):
        assert not any(match for _, match in shared.classify(text)), text


def test_the_first_look_judges_a_lone_statement_by_its_whole_first_word(rules):
    shared = PgEffects(rules, None, None, Metrics())
    assert not shared.might_guard(b"CREATEX foo"), "a longer word is not the kind"
    assert not shared.might_guard(b"SELECT 1 ;  ;\n"), "empty statements after it do not count"
    assert shared.might_guard(b"\n\t  Drop TABLE t"), "any case, after any spacing"
    assert shared.might_guard(b"SELECT 1 /* sidecar:key=k1 */"), "a keyed comment anywhere"


def test_with_only_keyed_comment_rules_no_keyword_is_worth_a_closer_look(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n  - name: k\n    match: {sql: {comment: true}}\n    effect: non_idempotent\n"
    )
    shared = PgEffects(load_rules([path]), None, None, Metrics())
    assert not shared.might_guard(b"CREATE TABLE t (x int)")
    assert not shared.might_guard(b"")
    assert shared.might_guard(b"CREATE TABLE t (x int) /* sidecar:key=t */")


def test_a_text_is_classified_once_and_only_recording_rules_count(rules):
    shared = PgEffects(rules, None, None, Metrics())
    text = "INSERT INTO ledger VALUES (1); SELECT 1"
    classified = shared.classify(text)
    assert shared.classify(text) is classified
    assert [(s.kind, m.rule.name if m else None) for s, m in classified] == [
        ("INSERT", "pg.ledger"),
        ("SELECT", None),
    ]
    assert shared.match(Statement.of("DROP TABLE t")).rule.name == "pg.ddl"


def test_a_rule_with_no_statement_kind_makes_every_statement_worth_a_closer_look(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n  - name: any.audit\n    match: {sql: {regex: audit}}\n"
        "    effect: non_idempotent\n"
    )
    shared = PgEffects(load_rules([path]), None, None, Metrics())
    assert shared.might_guard(b"SELECT 1")
    assert shared.guards("UPDATE audit SET seen = true")
    assert not shared.guards("SELECT 1")


async def test_statements_refused_on_the_extended_protocol_leave_nothing_prepared(relay):
    """A statement the sidecar refuses (here: its attempt was taken over) has the server
    fail the agent's transaction with a request of the sidecar's own, whose prepared
    statement the server keeps: its Close goes with the sidecar's next request."""
    relay.database.rows("CREATE TABLE ledger (entry text)")
    stale = await new_attempt(relay.store)
    await relay.run(stale, "INSERT INTO ledger VALUES ('first')")  # the records' table made
    await new_attempt(relay.store, "worker-b")
    async with await relay.connect(stale) as connection:
        for entry in ("a", "b", "c", "d"):
            with pytest.raises(psycopg.Error) as refused:
                await _insert(connection, "extended", entry)
            assert refused.value.sqlstate == "ES409"
            assert len(await _prepared(connection)) == 1  # the last refusal's, no more
        with pytest.raises(psycopg.Error) as refused:  # a simple Query closes it first
            await _insert(connection, "alone", "e")
        assert refused.value.sqlstate == "ES409"
        assert await _prepared(connection) == []
    assert relay.database.rows("SELECT entry FROM ledger") == [("first",)]
