"""COPY under a rule that records it, as psql users run it, through ``sidecar serve``.

psql's ``\\copy`` streams the rows through the connection (``COPY ... FROM STDIN``): the
first attempt of a task loads them, in one transaction with the statement's record; the
next attempt sends them again and is answered ``COPY n`` from the record, nothing loaded
twice.  Killed at any point - the agent in the middle of its rows, the sidecar in the
middle of them, after the statement ran, after it committed - the table holds the rows
once when the task is done, and no server backend is left waiting for rows.  A COPY on
the server's side runs once per task too.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from sidecar.rules.packs import packs_dir
from sidecar.testing.processes import Child
from tests.acceptance.pgwire.conftest import MakeWorld, events
from tests.support.postgres import TASK, PostgresWorld, ScratchDatabase

pytestmark = pytest.mark.acceptance

RULES = """
version: 1
rules:
  - name: load.parts
    description: Loading the parts list happens once per task.
    match: {sql: {kind: [COPY], regex: "\\\\bparts\\\\b"}}
    effect: non_idempotent
"""
RESTORE_RULES = """
version: 1
rules:
  - name: restore.copy
    description: Loading a table's rows from a dump happens once per task.
    match: {sql: {kind: [COPY]}}
    effect: non_idempotent
"""
PARTS = [(1, "bolt"), (2, "nut")]
LOAD = "\\copy parts FROM 'parts.tsv'"
# The rows, then a stall in the middle of the COPY: psql is still sending when killed.
STALLING = "\\copy parts FROM PROGRAM 'printf \"1\\tbolt\\n\"; touch streaming; sleep 60'"


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    path = tmp_path / "copy-rules.yaml"
    path.write_text(RULES)
    return path


def world_with_parts(make_world: MakeWorld, rules: Path, **kwargs: object) -> PostgresWorld:
    made = make_world(rules=[rules], **kwargs)
    made.rows("CREATE TABLE parts (id int, name text)")
    return made


@pytest.fixture
def world(make_world: MakeWorld, rules: Path) -> PostgresWorld:
    return world_with_parts(make_world, rules)


def write_parts(cwd: Path) -> None:
    """The rows psql's \\copy reads: parts.tsv in ``cwd``."""
    (cwd / "parts.tsv").write_text("".join(f"{n}\t{name}\n" for n, name in PARTS))


def psql(world: PostgresWorld, command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """psql through the sidecar, as one new attempt of the task."""
    write_parts(cwd)
    attempt = world.claim(TASK)
    env = os.environ | world.agent_env() | {"PGOPTIONS": attempt.pgoptions}
    return subprocess.run(
        ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-c", command],
        env=env, cwd=cwd, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def next_attempt_loads(world: PostgresWorld, cwd: Path) -> None:
    """psql under `sidecar exec` as the task's next attempt (once the killed one's lease
    has run out): it loads the rows, or is answered from the record."""
    write_parts(cwd)
    agent = world.agent("worker-b", "psql", "-X", "-v", "ON_ERROR_STOP=1", "-c", LOAD, cwd=cwd)
    assert agent.proc.wait(timeout=60) == 0
    assert agent.lines == ["COPY 2"]


def stalled_agent(world: PostgresWorld, cwd: Path) -> Child:
    """psql under `sidecar exec`, in the middle of its COPY's rows once this returns."""
    agent = world.agent("worker-a", "psql", "-X", "-v", "ON_ERROR_STOP=1", "-c", STALLING, cwd=cwd)
    deadline = time.monotonic() + 30
    while not (cwd / "streaming").exists() or not copies_running(world):
        assert agent.proc.poll() is None, "psql ended before its COPY was under way"
        assert time.monotonic() < deadline, "psql's COPY never started on the server"
        time.sleep(0.05)
    return agent


def copies_running(world: PostgresWorld) -> int:
    """Server backends running a COPY on the world's database."""
    return int(
        world.value(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND query ILIKE 'COPY%' AND state <> 'idle'"
        )
    )


def no_copy_left_running(world: PostgresWorld) -> None:
    deadline = time.monotonic() + 10
    while copies_running(world):
        assert time.monotonic() < deadline, "a server backend still waits for COPY rows"
        time.sleep(0.05)


def loaded_once(world: PostgresWorld) -> None:
    assert world.rows("SELECT id, name FROM parts ORDER BY id") == PARTS
    assert list(world.recorded().values()) == ["COPY 2"]


def test_psqls_copy_loads_once_and_the_next_attempt_is_answered_from_the_record(
    world: PostgresWorld, tmp_path: Path
) -> None:
    first, again = psql(world, LOAD, tmp_path), psql(world, LOAD, tmp_path)
    assert (first.returncode, again.returncode) == (0, 0), first.stderr + again.stderr
    assert first.stdout == again.stdout == "COPY 2\n"
    loaded_once(world)
    (effect,) = world.settled_effects()
    assert events(effect) == ["pending", "completed", "replayed"]


def test_the_agent_killed_in_the_middle_of_its_rows_loads_nothing_and_leaves_no_copy_open(
    world: PostgresWorld, tmp_path: Path
) -> None:
    stalled_agent(world, tmp_path).kill_group()
    no_copy_left_running(world)
    assert world.rows("SELECT * FROM parts") == []
    assert world.recorded() == {}

    next_attempt_loads(world, tmp_path)
    loaded_once(world)


def test_the_sidecar_killed_in_the_middle_of_the_rows_loads_nothing(
    world: PostgresWorld, tmp_path: Path
) -> None:
    agent = stalled_agent(world, tmp_path)
    assert world.kill_sidecar() == -9
    no_copy_left_running(world)  # the server saw its connection go, and rolled back
    assert world.rows("SELECT * FROM parts") == []
    agent.kill_group()  # (psql learns of it only when its program gives it more rows)

    world.start_sidecar()
    next_attempt_loads(world, tmp_path)
    loaded_once(world)


@pytest.mark.parametrize(
    ("failpoint", "committed"), [("sql.after_statement", False), ("sql.after_commit", True)]
)
def test_the_sidecar_killed_after_the_copy_ran_loads_the_rows_once(
    make_world: MakeWorld, rules: Path, tmp_path: Path, failpoint: str, committed: bool
) -> None:
    world = world_with_parts(make_world, rules, sidecar_env={"SIDECAR_FAILPOINTS": failpoint})
    killed = psql(world, LOAD, tmp_path)
    assert killed.returncode != 0  # the sidecar died before answering
    assert world.sidecar is not None
    assert world.sidecar.proc.wait(timeout=10) == -9
    assert world.value("SELECT count(*) FROM parts") == (2 if committed else 0)

    world.start_sidecar()
    done = psql(world, LOAD, tmp_path)
    assert (done.returncode, done.stdout) == (0, "COPY 2\n"), done.stderr
    loaded_once(world)
    (effect,) = world.settled_effects()
    assert events(effect)[-1] == ("replayed" if committed else "completed")


def test_a_copy_the_server_runs_is_loaded_once_per_task(
    world: PostgresWorld, tmp_path: Path
) -> None:
    load = "COPY parts FROM PROGRAM 'printf \"1\\tbolt\\n2\\tnut\\n\"'"
    first, again = psql(world, load, tmp_path), psql(world, load, tmp_path)
    assert (first.returncode, again.returncode) == (0, 0)
    assert first.stdout == again.stdout == "COPY 2\n"
    loaded_once(world)


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    """pg_dump's plain SQL of a database with two tables of 3,000 rows (one referencing
    the other): what psql -f restores, each table's rows in a COPY ... FROM stdin."""
    source = ScratchDatabase.create(prefix="es_dump")
    try:
        source.rows(
            "CREATE TABLE items (id int PRIMARY KEY, name text);"
            " INSERT INTO items SELECT g, 'item ' || g FROM generate_series(1, 3000) g;"
            " CREATE TABLE tags (item int REFERENCES items, tag text);"
            " INSERT INTO tags SELECT g, 't' || g % 7 FROM generate_series(1, 3000) g"
        )
        path = tmp_path / "dump.sql"
        with path.open("w") as out:
            subprocess.run(["pg_dump", "--no-owner", source.url], stdout=out, check=True)
    finally:
        source.drop()
    return path


@pytest.fixture
def restore_world(make_world: MakeWorld, rules: Path) -> PostgresWorld:
    """The shipped postgres pack (DDL once per task) and a rule recording every COPY."""
    path = rules.with_name("restore-rules.yaml")
    path.write_text(RESTORE_RULES)
    return make_world(rules=[packs_dir() / "postgres.yaml", path])


def restored_once(world: PostgresWorld) -> None:
    assert world.value("SELECT count(*) FROM items") == 3000
    assert world.value("SELECT count(*) FROM tags") == 3000
    assert sorted(tag for tag in world.recorded().values() if tag.startswith("COPY")) == [
        "COPY 3000",
        "COPY 3000",
    ]


def restore(world: PostgresWorld, dump: Path, worker: str) -> Child:
    return world.agent(worker, "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-f", str(dump))


def test_a_pg_dump_restored_by_two_attempts_is_restored_once(
    restore_world: PostgresWorld, dump: Path
) -> None:
    for worker in ("worker-a", "worker-b"):
        assert restore(restore_world, dump, worker).proc.wait(timeout=60) == 0
    restored_once(restore_world)
    effects = restore_world.settled_effects()
    assert len(effects) == 6  # CREATE TABLE, COPY and ALTER TABLE ... ADD CONSTRAINT, twice
    assert all(events(effect) == ["pending", "completed", "replayed"] for effect in effects)


def test_a_restore_killed_in_the_middle_of_a_copy_is_finished_by_the_next_attempt(
    restore_world: PostgresWorld, dump: Path, tmp_path: Path
) -> None:
    # The dump fed to psql up to the middle of the first table's rows, then a stall.
    lines = dump.read_text().splitlines(keepends=True)
    middle = next(i for i, line in enumerate(lines) if line.startswith("COPY ")) + 1500
    head = tmp_path / "head.sql"
    head.write_text("".join(lines[:middle]))
    feed = f"cat {head}; touch {tmp_path / 'streaming'}; sleep 60"
    first = restore_world.agent(
        "worker-a", "sh", "-c", f"({feed}) | psql -X -q -v ON_ERROR_STOP=1 -f -"
    )
    deadline = time.monotonic() + 30
    while not (tmp_path / "streaming").exists() or not copies_running(restore_world):
        assert first.proc.poll() is None, "psql ended before its COPY was under way"
        assert time.monotonic() < deadline, "the restore's COPY never started on the server"
        time.sleep(0.05)
    first.kill_group()
    no_copy_left_running(restore_world)
    assert restore_world.value("SELECT count(*) FROM items") == 0  # the table, made once

    assert restore(restore_world, dump, "worker-b").proc.wait(timeout=60) == 0
    restored_once(restore_world)
