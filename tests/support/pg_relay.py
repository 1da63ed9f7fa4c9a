"""The PostgreSQL relay in process, as ``sidecar serve`` assembles it
(``serving.pg_relay``), in front of a scratch database on the real PostgreSQL, with a
SQLite effect log in a temporary directory: what the pgwire unit tests run against, with
psycopg as the agent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psycopg

from sidecar.config import Settings
from sidecar.domain.model import EffectState
from sidecar.pgwire import serving
from sidecar.pgwire.mirror import Mirrors
from sidecar.pgwire.relay import Relay as RelayServer
from sidecar.recording.bindings import Bindings
from sidecar.rules import RuleSet, load_rules
from sidecar.runtime.clock import SystemClock
from sidecar.runtime.metrics import Metrics
from sidecar.store import Store, create_store
from tests.support.postgres import ScratchDatabase

#: The rules most of those tests run under: keyed statements, DDL, INSERTs into ledger.
RULES = r"""
rules:
  - name: pg.keyed
    match: {sql: {comment: true}}
    effect: non_idempotent
  - name: pg.ddl
    match: {sql: {kind: [CREATE, ALTER, DROP]}}
    effect: non_idempotent
  - name: pg.ledger
    match: {sql: {kind: [INSERT], regex: "\\bledger\\b"}}
    effect: non_idempotent
"""


def rules_of(tmp_path: Path, text: str) -> RuleSet:
    """``text`` as a rule file in ``tmp_path``, loaded."""
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    return load_rules([path])


@dataclass
class Relay:
    """The relay in front of the scratch database, and the store its effect log is in."""

    port: int
    database: ScratchDatabase
    store: Store
    mirrors: Mirrors
    server: RelayServer  # the relay itself, to stop

    async def connect(self, attempt_id: str | None, task: str = "312") -> psycopg.AsyncConnection:
        options = (
            "" if attempt_id is None else f"-c sidecar.task={task} -c sidecar.attempt={attempt_id}"
        )
        return await psycopg.AsyncConnection.connect(
            f"postgresql://postgres@127.0.0.1:{self.port}/{self.database.name}",
            options=options,
            autocommit=True,
        )

    async def run(self, attempt_id: str | None, *statements: str) -> list[str]:
        """Each statement on one connection of the attempt; their command tags."""
        async with await self.connect(attempt_id) as connection:
            tags = []
            for sql in statements:
                cursor = await connection.execute(sql)
                tags.append(cursor.statusmessage)
            return tags

    async def effects(self) -> dict[str, EffectState]:
        await self.mirrors.settle()
        return {e.key: e.state for e in await self.store.effects("312")}

    async def events(self, key: str) -> list[tuple[str, str]]:
        await self.mirrors.settle()
        return [
            (e.event, e.attempt_id) for e in await self.store.effect_events("312") if e.key == key
        ]


@asynccontextmanager
async def relay_on(
    tmp_path: Path, rules: RuleSet, database: ScratchDatabase
) -> AsyncIterator[Relay]:
    """A relay, with its own effect log in ``tmp_path``, in front of ``database``."""
    store = create_store(f"sqlite:///{tmp_path}/effects.db")
    await store.open()
    bindings = Bindings(store, SystemClock())
    store.observer = bindings
    mirrors = Mirrors()
    server = urlsplit(database.url)
    settings = Settings(
        data_dir=tmp_path,
        pg_upstream=f"postgresql://{server.hostname}:{server.port or 5432}",
        store_retry_s=0.1,
    )
    running = serving.pg_relay(settings, rules, bindings, store, Metrics(), mirrors)
    _, port = await running.start("127.0.0.1", 0)
    yield Relay(port, database, store, mirrors, running)
    await running.stop()
    await mirrors.settle()
    await store.close()


async def new_attempt(store: Store, worker: str = "worker-a") -> str:
    """Claim task 312 for ``worker``, the previous holder's lease given up."""
    view = await store.task_view("312")
    if view is not None and view.state.lease is not None and view.state.lease.released_at is None:
        lease = view.state.lease
        await store.release("312", lease.attempt_id, lease.generation)
    return (await store.claim("312", worker, 60)).attempt_id


def records(database: ScratchDatabase) -> list[tuple[str, str, str]]:
    """The records in the agent's database (none while the sidecar's table is not there)."""
    if database.value("SELECT to_regclass('effect_sidecar.effects') IS NULL"):
        return []
    return [
        (row[0], row[1], row[2])
        for row in database.rows(
            "SELECT key, attempt_id, command_tag FROM effect_sidecar.effects ORDER BY recorded_at"
        )
    ]


async def still_running(database: ScratchDatabase, text: str, within_s: float) -> int:
    """How many server processes run ``text`` once they stopped, or ``within_s`` passed."""
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND state = 'active' AND position(%s in query) > 0 AND pid <> pg_backend_pid()"
    )
    for _ in range(int(within_s * 10)):
        if not database.value(sql, text):
            return 0
        await asyncio.sleep(0.1)
    return int(database.value(sql, text))
