"""A recorded statement in a transaction the agent prepares for a two-phase commit
(``PREPARE TRANSACTION``): neither committed nor rolled back when the connection's
transaction ends, so the effect log says unknown, not completed; COMMIT PREPARED or
ROLLBACK PREPARED decides, and the record in the database tells the next attempt -
answered from it, or the statement run again.

Prepared transactions are off on a default server (``max_prepared_transactions = 0``),
so these run against a private cluster with them on (``tests/support/pgcluster.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.domain.model import EffectState
from tests.support.pg_relay import new_attempt
from tests.support.pgcluster import private_cluster
from tests.support.postgres import ScratchDatabase

INSERT = "INSERT INTO ledger VALUES ('pay invoice 7')"


@pytest.fixture
def database(tmp_path: Path) -> Iterator[ScratchDatabase]:
    cluster = private_cluster(
        tmp_path / "pg",
        hba=["host all all 127.0.0.1/32 trust"],
        settings={"max_prepared_transactions": "4"},
    )
    try:
        cluster.sql("CREATE ROLE postgres SUPERUSER LOGIN")
        scratch = ScratchDatabase.create(f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres")
        scratch.rows("CREATE TABLE ledger (entry text)")
        yield scratch
    finally:
        cluster.stop()


async def prepare(relay, attempt: str) -> None:
    """The agent records its INSERT in a transaction it prepares as 'pay-7'."""
    async with await relay.connect(attempt) as connection:
        await connection.execute("BEGIN")
        assert (await connection.execute(INSERT)).statusmessage == "INSERT 0 1"
        await connection.execute("PREPARE TRANSACTION 'pay-7'")


async def test_a_prepared_statement_is_unknown_until_committed_then_replayed(relay):
    first = await new_attempt(relay.store)
    await prepare(relay, first)
    ((key, state),) = (await relay.effects()).items()
    assert state is EffectState.UNKNOWN  # not completed: it may yet roll back
    (event,) = [e for e in await relay.store.effect_events("312") if e.event == "unknown"]
    assert event.detail is not None
    assert "PREPARE TRANSACTION" in event.detail

    relay.database.rows("COMMIT PREPARED 'pay-7'")
    again = await new_attempt(relay.store, "worker-b")
    assert await relay.run(again, INSERT) == ["INSERT 0 1"]  # from the record
    assert relay.database.rows("SELECT entry FROM ledger") == [("pay invoice 7",)]
    assert (await relay.effects())[key] is EffectState.COMPLETED
    assert [name for name, _ in await relay.events(key)][-1] == "replayed"


async def test_a_prepared_statement_rolled_back_runs_again_on_the_next_attempt(relay):
    first = await new_attempt(relay.store)
    await prepare(relay, first)
    relay.database.rows("ROLLBACK PREPARED 'pay-7'")
    assert relay.database.rows("SELECT entry FROM ledger") == []

    again = await new_attempt(relay.store, "worker-b")
    assert await relay.run(again, INSERT) == ["INSERT 0 1"]
    assert relay.database.rows("SELECT entry FROM ledger") == [("pay invoice 7",)]
    ((key, state),) = (await relay.effects()).items()
    assert state is EffectState.COMPLETED
    assert [name for name, _ in await relay.events(key)] == [
        "pending",
        "unknown",
        "pending",
        "completed",
    ]
