"""A real migration tool (alembic) killed part-way through a multi-revision upgrade.

Each revision runs in a transaction of its own (``transaction_per_migration``), so a
SIGKILL leaves the earlier revisions committed and the one in flight rolled back - in the
database and in the sidecar's records alike.  The rerun, a new attempt of the same task,
must apply each revision exactly once and report success: nothing that rolled back may
be replayed, nothing that committed may run again.
"""

from __future__ import annotations

import sys

import pytest

from tests.acceptance.pgwire.conftest import AGENTS, events
from tests.support.postgres import PostgresWorld

pytestmark = pytest.mark.acceptance

ALEMBIC = [sys.executable, "-m", "alembic", "-c", str(AGENTS / "alembic.ini"), "upgrade", "head"]


def test_alembic_killed_inside_a_revision_then_rerun_applies_each_revision_once(
    world: PostgresWorld,
) -> None:
    first = world.agent("worker-a", "env", "MIGRATION_PAUSE_IN=0002", *ALEMBIC)
    first.wait_for("^paused in 0002", timeout=60)
    first.kill_group()
    # 0001 committed; 0002's statements ran but their transaction died with the agent.
    assert world.value("SELECT version_num FROM alembic_version") == "0001"
    assert (
        world.value("SELECT count(*) FROM pg_indexes WHERE indexname = 'customers_by_email'") == 0
    )

    second = world.agent("worker-b", *ALEMBIC)
    assert second.proc.wait(timeout=60) == 0
    assert any("Running upgrade 0001 -> 0002" in line for line in second.lines)
    assert any("Running upgrade 0002 -> 0003" in line for line in second.lines)
    assert not any("-> 0001" in line for line in second.lines)

    assert world.value("SELECT version_num FROM alembic_version") == "0003"
    assert (
        world.value(
            "SELECT count(*) FROM information_schema.columns"
            " WHERE table_name = 'customers' AND column_name = 'email'"
        )
        == 1
    )
    assert (
        world.value("SELECT count(*) FROM pg_indexes WHERE indexname = 'customers_by_email'") == 1
    )
    assert world.value("SELECT to_regclass('invoices') IS NOT NULL") is True

    # The effect log agrees with the database: everything completed exactly once, the
    # statements of 0002 by the second attempt after the first one's rolled back.
    effects = world.settled_effects()
    assert all(effect["state"] == "completed" for effect in effects)
    recorded = world.recorded()
    assert {effect["key"] for effect in effects} == set(recorded)
    rerun = [e for e in effects if "pending" in events(e)[1:]]
    assert {e["request"]["statement"].split()[0] for e in rerun} == {"ALTER", "CREATE"}


def test_alembic_rerun_after_success_changes_nothing(world: PostgresWorld) -> None:
    assert world.agent("worker-a", *ALEMBIC).proc.wait(timeout=60) == 0
    before = world.rows("SELECT * FROM effect_sidecar.effects ORDER BY key")
    second = world.agent("worker-b", *ALEMBIC)
    assert second.proc.wait(timeout=60) == 0
    assert not any("Running upgrade" in line for line in second.lines)
    assert world.rows("SELECT * FROM effect_sidecar.effects ORDER BY key") == before
    assert world.value("SELECT version_num FROM alembic_version") == "0003"


def test_upgrade_downgrade_upgrade_in_one_attempt_applies_each_step_and_a_resume_changes_nothing(
    world: PostgresWorld,
) -> None:
    """SPEC §3.9: the second upgrade's CREATE TABLE is the same text as the first one's;
    it must run, not be answered from the first one's record."""
    alembic = " ".join(ALEMBIC[:-2])
    script = f"{alembic} upgrade head && {alembic} downgrade base && {alembic} upgrade head"
    first = world.agent("worker-a", "sh", "-c", script)
    assert first.proc.wait(timeout=90) == 0, first.lines
    assert world.value("SELECT version_num FROM alembic_version") == "0003"
    assert world.value("SELECT to_regclass('invoices') IS NOT NULL") is True
    assert (
        world.value("SELECT count(*) FROM pg_indexes WHERE indexname = 'customers_by_email'") == 1
    )
    recorded = world.recorded()
    creates = [key for key, tag in recorded.items() if tag == "CREATE TABLE"]
    assert len(creates) == 5, recorded  # alembic_version once; customers, invoices twice

    second = world.agent("worker-b", "sh", "-c", script)
    assert second.proc.wait(timeout=90) == 0, second.lines
    assert world.value("SELECT version_num FROM alembic_version") == "0003"
    assert world.value("SELECT to_regclass('invoices') IS NOT NULL") is True
    assert world.recorded() == recorded
