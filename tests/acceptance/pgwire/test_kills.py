"""Kill tests for SQL effects: a real SIGKILL at each point of the exactly-once flow.

After every restart the database must hold each effect exactly once, and the sidecar's
effect log must agree with it.  The agent is a psycopg script applying a migration in
one explicit transaction (agents/migrate.py); the sidecar is killed at its failpoints
(``sql.after_statement``: the statement ran, its transaction not committed, the agent
not answered; ``sql.after_commit``: statement and record committed, the agent not
answered); the upstream connection is cut from the server's side.
"""

from __future__ import annotations

import random
import sys
import time

import pytest

from tests.acceptance.pgwire.conftest import AGENTS, MakeWorld, events
from tests.support.postgres import PostgresWorld

pytestmark = pytest.mark.acceptance

SCHEMA = """
CREATE TABLE orders (id serial PRIMARY KEY, total integer NOT NULL);
CREATE TABLE order_statuses (name text NOT NULL);
INSERT INTO orders (total) VALUES (10), (20);
"""
MIGRATE = [sys.executable, str(AGENTS / "migrate.py")]
PROTOCOLS = ["extended", "simple", "pipeline"]


def migrated_once(world: PostgresWorld) -> None:
    """The outside world and the effect log both say: applied exactly once."""
    assert (
        world.value(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'orders' AND column_name = 'status'"
        )
        == 1
    )
    assert world.value("SELECT count(*) FROM pg_indexes WHERE indexname = 'orders_by_status'") == 1
    assert world.value("SELECT count(*) FROM order_statuses") == 3
    recorded = world.recorded()
    assert sorted(recorded.values()) == ["ALTER TABLE", "CREATE INDEX", "INSERT 0 3"]
    effects = world.settled_effects()
    assert {e["key"]: e["state"] for e in effects} == dict.fromkeys(recorded, "completed")


def finish(world: PostgresWorld, *args: str) -> list[str]:
    agent = world.agent("worker-b", *MIGRATE, *args)
    assert agent.proc.wait(timeout=60) == 0
    return agent.lines


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_agent_killed_right_after_its_commit_is_answered_from_the_record(
    world: PostgresWorld, protocol: str
) -> None:
    world.rows(SCHEMA)
    first = world.agent("worker-a", *MIGRATE, "--protocol", protocol, "--pause-after-commit")
    first.wait_for("^committed", timeout=60)
    first.kill_group()

    lines = finish(world, "--protocol", protocol)
    # The rerun's statements were answered from the records, RETURNING rows included.
    assert lines == ["applied new,paid,shipped", "committed", "done"]
    migrated_once(world)
    for effect in world.settled_effects():
        assert events(effect)[:2] == ["pending", "completed"]
        assert "replayed" in events(effect)


def test_agent_killed_before_its_commit_leaves_nothing_to_replay(world: PostgresWorld) -> None:
    world.rows(SCHEMA)
    first = world.agent("worker-a", *MIGRATE, "--pause-before-commit")
    first.wait_for("^applied", timeout=60)
    first.kill_group()
    assert world.value("SELECT count(*) FROM order_statuses") == 0

    assert finish(world) == ["applied new,paid,shipped", "committed", "done"]
    migrated_once(world)
    for effect in world.settled_effects():
        assert "replayed" not in events(effect)  # the rerun ran them: nothing had committed
        assert events(effect)[-1] == "completed"


@pytest.mark.parametrize("protocol", ["extended", "simple"])
def test_sidecar_killed_between_the_statement_and_relaying_it(
    make_world: MakeWorld, protocol: str
) -> None:
    world = make_world(sidecar_env={"SIDECAR_FAILPOINTS": "sql.after_statement"})
    world.rows(SCHEMA)
    first = world.agent("worker-a", *MIGRATE, "--protocol", protocol)
    assert first.proc.wait(timeout=60) != 0  # its connection died with the sidecar
    assert world.sidecar is not None
    assert world.sidecar.proc.wait(timeout=10) == -9
    # The server rolled the statement back with its record: nothing happened yet.
    assert world.value("SELECT count(*) FROM order_statuses") == 0

    world.start_sidecar()
    assert finish(world, "--protocol", protocol)[-1] == "done"
    migrated_once(world)
    (altered,) = [e for e in world.settled_effects() if "ALTER" in e["request"]["statement"]]
    # Logged pending by the dead try, settled by the database: no record, so run again.
    assert events(altered) == ["pending", "unknown", "pending", "completed"]


@pytest.mark.parametrize("protocol", ["extended", "simple"])
def test_sidecar_killed_after_the_commit_before_answering_the_agent(
    make_world: MakeWorld, protocol: str
) -> None:
    world = make_world(sidecar_env={"SIDECAR_FAILPOINTS": "sql.after_commit"})
    world.rows(SCHEMA)
    first = world.agent("worker-a", *MIGRATE, "--protocol", protocol)
    assert first.proc.wait(timeout=60) != 0
    assert world.sidecar is not None
    assert world.sidecar.proc.wait(timeout=10) == -9
    assert world.value("SELECT count(*) FROM order_statuses") == 3  # it did commit

    world.start_sidecar()
    lines = finish(world, "--protocol", protocol)
    assert lines == ["applied new,paid,shipped", "committed", "done"]
    migrated_once(world)
    for effect in world.settled_effects():
        assert "replayed" in events(effect)


def test_upstream_connection_cut_mid_transaction(world: PostgresWorld) -> None:
    world.rows(SCHEMA)
    first = world.agent("worker-a", *MIGRATE, "--pause-before-commit")
    first.wait_for("^applied", timeout=60)
    # The server ends the agent's backend (a failover, an admin, a network cut).
    (cut,) = world.rows(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND state = 'idle in transaction'"
    )
    assert cut == (True,)
    first.kill_group()  # it would only learn of it on its next statement
    assert world.value("SELECT count(*) FROM order_statuses") == 0

    assert finish(world)[-1] == "done"
    migrated_once(world)


# ---- one statement on its own (autocommit): its record travels with it -----------------

INSERT_STATUSES = (
    "/* sidecar:key=seed-order-statuses */ "
    "INSERT INTO order_statuses (name) VALUES ('new'), ('paid'), ('shipped') RETURNING name"
)


def psql(world: PostgresWorld, worker: str) -> tuple[int, str]:
    """psql sending the INSERT as one simple Query, outside a transaction: its exit code
    and what it printed."""
    argv = ["psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", INSERT_STATUSES]
    agent = world.agent(worker, *argv)
    code = agent.wait(timeout=60)
    return code, "\n".join(agent.lines)


@pytest.mark.parametrize(
    ("failpoint", "committed"), [("sql.after_statement", 0), ("sql.after_commit", 3)]
)
def test_sidecar_killed_around_a_lone_statement_it_sent_with_its_record(
    make_world: MakeWorld, failpoint: str, committed: int
) -> None:
    world = make_world(sidecar_env={"SIDECAR_FAILPOINTS": failpoint})
    world.rows(SCHEMA)
    code, _ = psql(world, "worker-a")
    assert code != 0  # its connection died with the sidecar
    assert world.sidecar is not None
    assert world.sidecar.proc.wait(timeout=10) == -9
    # Killed after the statement ran: the server rolled it back with its record. Killed
    # after the commit: both are there, and the agent was never answered.
    assert world.value("SELECT count(*) FROM order_statuses") == committed

    world.start_sidecar()
    code, printed = psql(world, "worker-b")
    # The rows it returned, as the first try's statement returned them.
    assert (code, printed) == (0, "new\npaid\nshipped\nINSERT 0 3")
    assert world.value("SELECT count(*) FROM order_statuses") == 3
    assert list(world.recorded().values()) == ["INSERT 0 3"]
    (effect,) = world.settled_effects()
    assert effect["state"] == "completed"
    assert events(effect)[-1] == ("completed" if committed == 0 else "replayed")


STEPS = 25
# One keyed INSERT after another, each on its own outside a transaction (psycopg sends a
# statement with no parameters as a simple Query); it prints each step as it is answered.
STEPPER = f"""
import os, sys, time, psycopg
with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as db:
    for step in range({STEPS}):
        tag = db.execute(
            f"/* sidecar:key=step-{{step}} */ INSERT INTO steps (step) VALUES ({{step}})"
        ).statusmessage
        print(step, tag, flush=True)
        time.sleep(0.005)
"""


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_sidecar_killed_at_a_random_instant_neither_loses_nor_repeats_a_lone_statement(
    make_world: MakeWorld, seed: int
) -> None:
    rng = random.Random(seed)
    world = make_world()
    world.rows("CREATE TABLE steps (step integer NOT NULL)")
    first = world.agent("worker-a", sys.executable, "-c", STEPPER)
    # Once a random step is answered, at a random instant of the steps after it.
    first.wait_for(rf"^{rng.randrange(STEPS - 5)} INSERT", timeout=60)
    time.sleep(rng.uniform(0, 0.008))
    world.kill_sidecar()
    assert first.wait(timeout=60) != 0  # its connection died with the sidecar
    assert 0 < len(first.lines) < STEPS
    world.start_sidecar()
    again = world.agent("worker-b", sys.executable, "-c", STEPPER)
    assert again.wait(timeout=60) == 0
    assert again.lines == [f"{step} INSERT 0 1" for step in range(STEPS)]
    # Each step once in the database, and once in the records: replayed or run, never both.
    assert world.rows("SELECT step, count(*) FROM steps GROUP BY step ORDER BY step") == [
        (step, 1) for step in range(STEPS)
    ]
    assert sorted(world.recorded()) == sorted(f"step-{step}" for step in range(STEPS))
    assert {e["state"] for e in world.settled_effects()} == {"completed"}
