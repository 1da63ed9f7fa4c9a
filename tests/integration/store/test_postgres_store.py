"""What only the shared PostgreSQL store has to prove: several stores (as on several
nodes) on one database act as one, migrations run once, and outages fail closed.

The behaviour every store shares runs on PostgreSQL too, in test_store_behaviour.py and
test_lease_fencing_properties.py (the ``backend`` fixture).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg
import pytest

from sidecar.errors import LeaseHeld, StaleGeneration, StoreUnavailable
from sidecar.store import Store, create_store, sqlfiles
from sidecar.store.postgres import redacted, split_url
from tests.conftest import drop_schema, scratch_schema
from tests.support.pgcluster import free_port

type Nodes = Callable[[int], Awaitable[list[Store]]]


@pytest.fixture
def schema(postgres_server: str) -> AsyncIterator[str]:
    name = scratch_schema()
    yield name
    drop_schema(postgres_server, name)


@pytest.fixture
async def nodes(postgres_server: str, schema: str) -> AsyncIterator[Nodes]:
    """Opens n separate stores on one schema, each with its own pool, as n nodes would."""
    opened: list[Store] = []

    async def open_nodes(n: int) -> list[Store]:
        stores = [create_store(f"{postgres_server}?schema={schema}") for _ in range(n)]
        await asyncio.gather(*(s.open() for s in stores))
        opened.extend(stores)
        return stores

    yield open_nodes
    for store in opened:
        await store.close()


async def test_stores_opening_together_on_a_fresh_schema_migrate_it_once(nodes, postgres_server):
    stores = await nodes(4)
    assert {(await s.info()).schema_version for s in stores} == {
        sqlfiles.migrations("postgresql")[-1].version
    }
    a = await stores[0].claim("312", "a", 30)
    assert (await stores[3].task_view("312")).state.generation == a.generation


async def test_claims_racing_from_several_nodes_grant_exactly_one(nodes):
    stores = await nodes(3)
    results = await asyncio.gather(
        *(s.claim("312", f"w{i}-{n}", 30) for n, s in enumerate(stores) for i in range(15)),
        return_exceptions=True,
    )
    granted = [r for r in results if not isinstance(r, BaseException)]
    assert len(granted) == 1
    assert all(isinstance(r, LeaseHeld) for r in results if r is not granted[0])


async def test_a_takeover_on_one_node_fences_the_other_nodes_writes(nodes):
    node_a, node_b = await nodes(2)
    a = await node_a.claim("312", "a", 0.2)
    await asyncio.sleep(0.25)
    b = await node_b.claim("312", "b", 30)
    assert b.generation == a.generation + 1
    with pytest.raises(StaleGeneration):
        await node_a.append_checkpoint("312", a.attempt_id, a.generation, "PUSHED", {})
    with pytest.raises(StaleGeneration):
        await node_a.record_pending(
            "312", "POST /pulls", a.attempt_id, a.generation, kind="http", rule="r",
            fingerprint="f", idempotency_key=None, request={},
        )  # fmt: skip
    assert await node_b.checkpoints("312") == []
    assert await node_b.effects("312") == []
    refused = await node_b.refusals("312")
    assert [(r.operation, r.generation, r.current_generation) for r in refused] == [
        ("checkpoint", 1, 2),
        ("effect.record", 1, 2),
    ]


async def test_checkpoints_from_several_nodes_get_distinct_consecutive_numbers(nodes):
    stores = await nodes(3)
    a = await stores[0].claim("312", "a", 30)
    written = await asyncio.gather(
        *(
            stores[i % 3].append_checkpoint("312", a.attempt_id, a.generation, f"S{i}", {})
            for i in range(90)
        )
    )
    assert sorted(c.seq for c in written) == list(range(1, 91))


async def test_dead_pooled_connections_are_replaced_before_a_write_needs_them(
    nodes, postgres_server
):
    (store,) = await nodes(1)
    a = await store.claim("312", "a", 30)
    with psycopg.connect(postgres_server, autocommit=True) as admin:
        killed = admin.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = 'effect-sidecar' AND pid <> pg_backend_pid()"
        ).fetchone()
    assert killed is not None
    assert killed[0] >= 1
    written = await store.append_checkpoint("312", a.attempt_id, a.generation, "AFTER", {})
    assert written.seq == 1


async def test_an_unreachable_server_is_store_unavailable_and_keeps_the_password_out():
    url = f"postgresql://agent:s3cret@127.0.0.1:{free_port()}/test"
    store = create_store(url)
    with pytest.raises(StoreUnavailable) as refused:
        await store.open()
    assert "s3cret" not in refused.value.detail
    assert "***" in store.url


async def test_read_only_inspection_never_creates_the_schema(postgres_server, schema):
    store = create_store(f"{postgres_server}?schema={schema}", read_only=True)
    with pytest.raises(StoreUnavailable, match="schema version 0"):
        await store.open()
    with psycopg.connect(postgres_server) as db:
        exists = db.execute("SELECT to_regnamespace(%s)", (schema,)).fetchone()
    assert exists == (None,)


def test_store_urls_name_a_database_and_may_name_a_schema():
    assert split_url("postgresql://u@h:5/db?schema=es_x&sslmode=require") == (
        "postgresql://u@h:5/db?sslmode=require",
        "es_x",
    )
    assert split_url("postgres://u@h/db")[1] == "effect_sidecar"
    assert redacted("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"


async def test_both_sql_stores_have_the_same_tables_and_columns(
    nodes, postgres_server, schema, tmp_path
):
    await nodes(1)
    with psycopg.connect(postgres_server) as db:
        on_postgres = set(
            db.execute(
                "SELECT table_name, column_name FROM information_schema.columns"
                " WHERE table_schema = %s AND table_name <> 'schema_version'",
                (schema,),
            ).fetchall()
        )
    async with create_store(f"sqlite:///{tmp_path}/effects.db"):
        pass
    with contextlib.closing(sqlite3.connect(tmp_path / "effects.db")) as lite:
        tables = [r[0] for r in lite.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        on_sqlite = {
            (table, row[1])
            for table in tables
            for row in lite.execute(f"PRAGMA table_info({table})")
        }
    assert on_postgres == on_sqlite
