"""A plain migration script with no bookkeeping of its own, run twice by `psql -f`.

The seed's most dangerous case: the agent applied its migration, died before it could
note that, and its next attempt applies it again.  Straight to the server the second
run fails and duplicates the seed rows; through the sidecar, as two attempts of task
312, the second run succeeds and changes nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.pgwire.conftest import events
from tests.support.postgres import PostgresWorld

pytestmark = pytest.mark.acceptance

SCHEMA = """
CREATE TABLE orders (id serial PRIMARY KEY, total integer NOT NULL);
CREATE TABLE order_statuses (name text NOT NULL);
INSERT INTO orders (total) VALUES (10), (20);
"""

MIGRATION = """\
-- 0042: orders get a status
ALTER TABLE orders ADD COLUMN status text NOT NULL DEFAULT 'new';
CREATE INDEX orders_by_status ON orders (status);
/* sidecar:key=seed-order-statuses */
INSERT INTO order_statuses (name) VALUES ('new'), ('paid'), ('shipped');
"""


@pytest.fixture
def migration(world: PostgresWorld, tmp_path: Path) -> Path:
    world.rows(SCHEMA)
    path = tmp_path / "0042_order_status.sql"
    path.write_text(MIGRATION)
    return path


def psql(migration: Path) -> list[str]:
    return ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-f", str(migration)]


def status_columns(world: PostgresWorld) -> int:
    return int(
        world.value(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'orders' AND column_name = 'status'"
        )
    )


def test_without_the_sidecar_a_second_run_fails_or_duplicates_the_seed_rows(
    world: PostgresWorld, migration: Path
) -> None:
    assert world.direct(*psql(migration)).proc.wait(timeout=30) == 0
    # Stopping at the first error, the rerun fails ...
    assert world.direct(*psql(migration)).proc.wait(timeout=30) == 3
    # ... and going on past errors (psql's default), it duplicates the seed rows.
    assert world.direct("psql", "-X", "-f", str(migration)).proc.wait(timeout=30) == 0
    assert world.value("SELECT count(*) FROM order_statuses") == 6


def test_through_the_sidecar_the_second_attempt_succeeds_and_changes_nothing(
    world: PostgresWorld, migration: Path
) -> None:
    first = world.agent("worker-a", *psql(migration))
    assert first.wait(timeout=60) == 0
    schema_after_first = world.rows(
        "SELECT table_name, column_name FROM information_schema.columns"
        " WHERE table_schema = 'public' ORDER BY 1, 2"
    )
    second = world.agent("worker-b", *psql(migration))
    assert second.wait(timeout=60) == 0

    # The outside world: the schema changed once, the seed rows are there once.
    assert status_columns(world) == 1
    assert world.value("SELECT count(*) FROM pg_indexes WHERE indexname = 'orders_by_status'") == 1
    assert world.value("SELECT count(*) FROM order_statuses") == 3
    assert (
        world.rows(
            "SELECT table_name, column_name FROM information_schema.columns"
            " WHERE table_schema = 'public' ORDER BY 1, 2"
        )
        == schema_after_first
    )
    # The agent saw what it saw the first time: psql echoes the recorded command tags.
    assert first.lines == second.lines == ["ALTER TABLE", "CREATE INDEX", "INSERT 0 3"]

    # Each statement recorded once in the target database, with its command tag ...
    assert sorted(world.recorded().values()) == ["ALTER TABLE", "CREATE INDEX", "INSERT 0 3"]
    assert "seed-order-statuses" in world.recorded()
    # ... and in the effect log: recorded by the first attempt, replayed to the second.
    effects = world.settled_effects()
    assert len(effects) == 3
    for effect in effects:
        assert effect["kind"] == "sql"
        assert effect["state"] == "completed"
        assert events(effect)[:2] == ["pending", "completed"]
        assert "replayed" in events(effect)
    attempts = {effect["attempt_id"] for effect in effects}
    assert len(attempts) == 1  # the first attempt's effects, replayed to the second
