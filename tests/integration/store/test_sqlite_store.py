"""SQLite specifics: schema and migrations agree, and the store fails closed."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from contextlib import closing
from pathlib import Path

import pytest

from sidecar.errors import ConfigError, StoreUnavailable
from sidecar.store import create_store, sqlfiles
from sidecar.store.sqlite import OneThread, SQLiteStore
from sidecar.store.sqlite_writer import statements


def _schema_of(path: Path) -> dict[str, object]:
    """Tables, columns, indexes and foreign keys, independent of how they were created.

    (ALTER TABLE rewrites the stored CREATE text differently from a fresh CREATE, so the
    SQL text of sqlite_master is not comparable; the structure is.)
    """
    with closing(sqlite3.connect(path)) as db:
        tables = [
            name
            for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        return {
            table: {
                "columns": sorted(
                    (name, kind, notnull, default, pk)
                    for _, name, kind, notnull, default, pk in db.execute(
                        f"PRAGMA table_info({table})"
                    )
                ),
                "indexes": sorted(
                    (unique, [c[2] for c in db.execute(f"PRAGMA index_info('{index}')")])
                    for _, index, unique, *_ in db.execute(f"PRAGMA index_list({table})")
                ),
                "foreign_keys": sorted(
                    tuple(fk[2:5]) for fk in db.execute(f"PRAGMA foreign_key_list({table})")
                ),
            }
            for table in tables
        }


def test_schema_sql_and_the_migrations_build_the_same_database(tmp_path):
    fresh, migrated = tmp_path / "fresh.db", tmp_path / "migrated.db"
    with closing(sqlite3.connect(fresh)) as db:
        db.executescript(sqlfiles.read("sqlite", "schema.sql"))
    with closing(sqlite3.connect(migrated)) as db:
        for migration in sqlfiles.migrations("sqlite"):
            db.executescript(migration.sql)
    assert _schema_of(fresh) == _schema_of(migrated)
    assert "attempts" in _schema_of(fresh)


async def test_an_older_store_is_upgraded_in_place_and_keeps_its_data(tmp_path):
    path = tmp_path / "e.db"
    first = sqlfiles.migrations("sqlite")[0]
    with closing(sqlite3.connect(path)) as db:
        db.executescript(first.sql)
        db.execute("INSERT INTO tasks VALUES ('312', 1, 0, 1, 1)")
        db.execute("INSERT INTO attempts VALUES ('att-old', '312', 1, 'a', 1, NULL, NULL)")
        db.execute("PRAGMA user_version=1")
        db.commit()
    async with create_store(f"sqlite:///{path}") as store:
        assert (await store.info()).schema_version == sqlfiles.migrations("sqlite")[-1].version
        old = await store.attempt("att-old")
    assert old is not None
    assert old.worker == "a"
    assert old.lease_until is None


async def test_a_new_store_is_stamped_with_the_latest_version(tmp_path):
    async with create_store(f"sqlite:///{tmp_path}/e.db") as store:
        info = await store.info()
    latest = sqlfiles.migrations("sqlite")[-1].version
    assert info.schema_version == latest
    with closing(sqlite3.connect(tmp_path / "e.db")) as db:
        assert db.execute("PRAGMA user_version").fetchone() == (latest,)
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_a_store_from_a_newer_sidecar_is_refused(tmp_path):
    path = tmp_path / "e.db"
    with closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA user_version=999")
    with pytest.raises(ConfigError, match="newer"):
        await create_store(f"sqlite:///{path}").open()


async def test_read_only_open_never_creates_a_store(tmp_path):
    with pytest.raises(StoreUnavailable, match="no store"):
        await create_store(f"sqlite:///{tmp_path}/absent.db", read_only=True).open()
    assert not (tmp_path / "absent.db").exists()


async def test_writes_fail_closed_while_the_file_is_locked_and_resume_after(tmp_path):
    path = tmp_path / "e.db"
    store = SQLiteStore(f"sqlite:///{path}", busy_timeout_s=0.2)
    await store.open()
    try:
        claim = await store.claim("312", "a", 60)
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        with pytest.raises(StoreUnavailable, match="cannot record"):
            await store.append_checkpoint("312", claim.attempt_id, 1, "LOCKED_OUT", {})
        with pytest.raises(StoreUnavailable):
            await store.check_writable()
        blocker.execute("ROLLBACK")
        blocker.close()
        written = await store.append_checkpoint("312", claim.attempt_id, 1, "AFTER", {})
        assert written.seq == 1, "the refused write left no trace"
        assert [c.stage for c in await store.checkpoints("312")] == ["AFTER"]
    finally:
        await store.close()


async def test_writes_queued_behind_a_failed_batch_are_all_answered(tmp_path):
    path = tmp_path / "e.db"
    store = SQLiteStore(f"sqlite:///{path}", busy_timeout_s=0.2)
    await store.open()
    try:
        claim = await store.claim("312", "a", 60)
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        results = await asyncio.gather(
            *(store.append_checkpoint("312", claim.attempt_id, 1, f"S{i}", {}) for i in range(20)),
            return_exceptions=True,
        )
        blocker.execute("ROLLBACK")
        blocker.close()
        assert all(isinstance(r, StoreUnavailable) for r in results)
    finally:
        await store.close()


def test_scripts_split_into_completestatements():
    script = "CREATE TABLE a (x TEXT);\n-- a note; with a semicolon\nINSERT INTO a VALUES (';');\n"
    assert statements(script) == [
        "CREATE TABLE a (x TEXT);",
        "-- a note; with a semicolon\nINSERT INTO a VALUES (';');",
    ]
    with pytest.raises(ValueError, match="incomplete"):
        statements("CREATE TABLE a (x TEXT")


@pytest.mark.parametrize(
    "url", ["sqlite://", "sqlite:/x.db", "postgresql://127.0.0.1:5432", "redis://"]
)
def test_unsupported_urls_are_a_config_error(url):
    with pytest.raises(ConfigError):
        create_store(url)


async def test_the_effect_log_is_readable_by_its_owner_only(tmp_path):
    """SPEC §7: requests and recorded answers are in these files (once 0644 in a 0755
    directory, readable by every user of the node)."""
    data = tmp_path / "data"
    store = create_store(f"sqlite:///{data}/effects.db")
    await store.open()
    try:
        claim = await store.claim("312", "w", 60)
        await store.append_checkpoint("312", claim.attempt_id, claim.generation, "S", {})
        files = [data / name for name in ("effects.db", "effects.db-wal", "effects.db-shm")]
        assert all(file.exists() for file in files)
        assert {oct(file.stat().st_mode & 0o777) for file in files} == {"0o600"}
        assert oct(data.stat().st_mode & 0o777) == "0o700"
    finally:
        await store.close()


async def test_the_writer_thread_runs_calls_in_order_on_one_thread_and_answers_each():
    thread = OneThread("test-writer")
    try:
        seen: list[tuple[int, int]] = []

        def work(n: int) -> int:
            seen.append((n, threading.get_ident()))
            return n * 10

        assert await asyncio.gather(*(thread.call(work, n) for n in range(20))) == [
            n * 10 for n in range(20)
        ]
        assert [n for n, _ in seen] == list(range(20))
        assert len({ident for _, ident in seen}) == 1
        assert seen[0][1] != threading.get_ident()

        def fail() -> None:
            raise sqlite3.OperationalError("disk I/O error")

        with pytest.raises(sqlite3.OperationalError, match="disk I/O error"):
            await thread.call(fail)
        assert await thread.call(work, 99) == 990, "the thread still serves after a failure"
    finally:
        thread.stop()


async def test_a_writer_call_cancelled_before_it_starts_does_not_run():
    thread = OneThread("test-writer")
    try:
        started, release = threading.Event(), threading.Event()
        ran: list[str] = []

        def block() -> str:
            started.set()
            release.wait(5)
            return "blocked"

        first = thread.call(block)
        await asyncio.to_thread(started.wait, 5)
        cancelled = thread.call(ran.append, "cancelled")
        after = thread.call(ran.append, "after")
        cancelled.cancel()
        release.set()
        assert await first == "blocked"
        await after
        assert ran == ["after"]
    finally:
        thread.stop()


def test_stopping_the_writer_thread_runs_what_was_queued_first():
    thread = OneThread("test-writer")
    ran: list[int] = []
    loop_closed = threading.Event()

    async def queue_then_stop() -> list[asyncio.Future[object]]:
        # The first call holds the thread until the loop is closed, so that none of the
        # calls can be answered while it is open (else which are is up to the scheduler).
        return [thread.call(loop_closed.wait), *(thread.call(ran.append, n) for n in range(5))]

    futures = asyncio.run(queue_then_stop())
    loop_closed.set()
    thread.stop()
    assert ran == [0, 1, 2, 3, 4]
    assert not thread._thread.is_alive()
    assert all(not f.done() for f in futures)  # no one was left to answer: no error either


async def test_the_store_writes_from_one_writer_thread(tmp_path):
    store = SQLiteStore(f"sqlite:///{tmp_path}/s.db")
    await store.open()
    try:
        claim = await store.claim("t", "w", 60)
        written = await asyncio.gather(
            *(
                store.append_checkpoint("t", claim.attempt_id, claim.generation, "S", {"n": n})
                for n in range(10)
            )
        )
        assert sorted(c.seq for c in written) == list(range(1, 11))
        assert store._writer_thread is not None
        writer = store._writer_thread._thread
        assert writer.name == "sqlite-writer"
        assert writer.is_alive()
    finally:
        await store.close()
    assert not writer.is_alive(), "closing the store ends its writer thread"
