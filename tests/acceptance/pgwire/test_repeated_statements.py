"""The same statement twice in one attempt runs twice (SPEC §3.9); a resumed attempt
repeating the work from the top meets the same ordinals and is answered from the records.

A migration that widens a column behind a view must drop and re-create the view: psql
runs ``CREATE VIEW v ...`` twice.  Keyed by text alone, the second was answered from the
first one's record inside the same attempt, psql printed ``CREATE VIEW`` and exited 0,
and the view did not exist.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.postgres import PostgresWorld

pytestmark = pytest.mark.acceptance

WIDEN = """\
CREATE TABLE c (id int, email text);
CREATE VIEW v AS SELECT email FROM c;
/* sidecar:key=first-row */ INSERT INTO c VALUES (1, 'a@example.com');
BEGIN;
DROP VIEW v;
ALTER TABLE c ALTER COLUMN email TYPE varchar(320);
CREATE VIEW v AS SELECT email FROM c;
COMMIT;
/* sidecar:key=second-row */ INSERT INTO c VALUES (2, 'b@example.com');
"""


def psql(path: Path) -> list[str]:
    return ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-f", str(path)]


def test_a_view_dropped_and_created_again_in_one_attempt_exists_and_a_resume_changes_nothing(
    world: PostgresWorld, tmp_path: Path
) -> None:
    script = tmp_path / "widen.sql"
    script.write_text(WIDEN)
    first = world.agent("worker-a", *psql(script))
    assert first.wait(timeout=60) == 0
    assert first.lines == [
        "CREATE TABLE", "CREATE VIEW", "INSERT 0 1", "BEGIN", "DROP VIEW", "ALTER TABLE",
        "CREATE VIEW", "COMMIT", "INSERT 0 1",
    ]  # fmt: skip
    assert world.value("SELECT count(*) FROM pg_views WHERE viewname = 'v'") == 1
    assert (
        world.value(
            "SELECT data_type FROM information_schema.columns"
            " WHERE table_name = 'v' AND column_name = 'email'"
        )
        == "character varying"
    )

    # The agent is run again from the top as a new attempt: every statement is answered
    # from its record - the second CREATE VIEW from the second one's.
    second = world.agent("worker-b", *psql(script))
    assert second.wait(timeout=60) == 0
    assert second.lines == first.lines
    assert world.value("SELECT count(*) FROM c") == 2
    assert world.value("SELECT count(*) FROM pg_views WHERE viewname = 'v'") == 1
    recorded = world.recorded()
    assert sorted(recorded.values()).count("CREATE VIEW") == 2
    views = [key for key, tag in recorded.items() if tag == "CREATE VIEW"]
    assert any(key.endswith(" #2") for key in views), views


def test_pgbench_initialised_twice_in_one_attempt_succeeds_both_times(world: PostgresWorld) -> None:
    """``pgbench -i`` drops and creates its tables: a second run in the same attempt is
    new work (once, its CREATE TABLEs were answered from the first run's records and
    its COPY hit tables that did not exist)."""
    twice = "pgbench -i -s 1 -q && pgbench -i -s 1 -q"
    agent = world.agent("worker-a", "sh", "-c", twice)
    assert agent.wait(timeout=120) == 0, agent.lines
    assert world.value("SELECT count(*) FROM pgbench_branches") == 1
    assert world.value("SELECT count(*) FROM pgbench_accounts") == 100_000
