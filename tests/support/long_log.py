"""A data dir whose SQLite store holds one task with a long effect log, made quickly.

One effect is recorded through the store (so every column is as the sidecar writes it);
the rest are copied from it in SQL with consecutive keys and times, each with its
``pending`` audit event.  For tests and benchmarks of the list routes.
"""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path

from sidecar.store.sqlite import SQLiteStore

TASK = "312"


def key(n: int) -> str:
    """The key of the n-th effect (0-based), in the order they are listed."""
    return f"k{n:06d}"


async def _first_effect(db: Path) -> None:
    store = SQLiteStore(f"sqlite:///{db}")
    await store.open()
    try:
        claim = await store.claim(TASK, "worker-a", 3600)
        await store.record_pending(
            TASK,
            key(0),
            claim.attempt_id,
            claim.generation,
            kind="http",
            rule="test.things.create",
            fingerprint="sha256:00",
            idempotency_key=None,
            request={"method": "POST", "url": "https://api.things.test/things", "pad": "x" * 800},
        )
    finally:
        await store.close()


def seed(data_dir: Path, effects: int) -> None:
    """Make ``data_dir`` hold task 312 with ``effects`` effects (keys :func:`key`)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    db = data_dir / "effects.db"
    asyncio.run(_first_effect(db))
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            """
            WITH RECURSIVE i(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM i WHERE n < ?)
            INSERT INTO effects
            SELECT task, printf('k%06d', n), state, kind, rule, origin_attempt_id, attempt_id,
                   generation, fingerprint, idempotency_key, request, response_status,
                   response_headers, response_body, detail, created_at + n, updated_at + n
            FROM effects, i WHERE key = ?
            """,
            (effects - 1, key(0)),
        )
        conn.execute(
            """
            INSERT INTO effect_events (task, key, event, attempt_id, generation, at, detail)
            SELECT e.task, e.key, 'pending', e.attempt_id, e.generation, e.created_at, NULL
            FROM effects AS e WHERE e.key != ?
            """,
            (key(0),),
        )
