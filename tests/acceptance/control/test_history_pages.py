"""A long effect log is read a page at a time from a running sidecar, at a bounded cost.

The store holds 50,000 effects (one recorded through the store, the rest copied from it
in SQL, which is quicker than recording them); the route answers 100 of them with a
cursor, quickly, without the process growing by the log.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import urllib.request
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from sidecar.store.sqlite import SQLiteStore
from sidecar.testing.processes import Child
from tests.acceptance.memory import resident_mib

pytestmark = pytest.mark.acceptance

EFFECTS = 50_000


async def _one_effect(db: Path) -> None:
    store = SQLiteStore(f"sqlite:///{db}")
    await store.open()
    try:
        claim = await store.claim("312", "worker-a", 60)
        await store.record_pending(
            "312",
            "k000000",
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


def _copies(db: Path, n: int) -> None:
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            """
            WITH RECURSIVE i(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM i WHERE n < ?)
            INSERT INTO effects
            SELECT task, printf('k%06d', n), state, kind, rule, origin_attempt_id, attempt_id,
                   generation, fingerprint, idempotency_key, request, response_status,
                   response_headers, response_body, detail, created_at + n, updated_at + n
            FROM effects, i WHERE key = 'k000000'
            """,
            (n - 1,),
        )
        conn.execute(
            """
            INSERT INTO effect_events (task, key, event, attempt_id, generation, at, detail)
            SELECT e.task, e.key, 'pending', e.attempt_id, e.generation, e.created_at, NULL
            FROM effects AS e WHERE e.key != 'k000000'
            """
        )


@pytest.fixture
def long_log(tmp_path: Path) -> Iterator[tuple[Child, str]]:
    data = tmp_path / "data"
    data.mkdir()
    asyncio.run(_one_effect(data / "effects.db"))
    _copies(data / "effects.db", EFFECTS)
    child = Child.python(
        "sidecar",
        "serve",
        "--data-dir",
        str(data),
        "--control-listen",
        "127.0.0.1:0",
        "--proxy-listen",
        "127.0.0.1:0",
        stderr_path=tmp_path / "sidecar.log",
    )
    with child:
        url = child.wait_for(r"effect-sidecar ready control=(\S+)", timeout=30).group(1)
        yield child, url


def _get(url: str) -> tuple[dict, int, float]:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=30) as response:
        raw = response.read()
    return json.loads(raw), len(raw), time.monotonic() - started


def test_a_50k_effect_log_is_answered_100_at_a_time(long_log):
    child, url = long_log
    before = resident_mib(child.pid)
    page, size, seconds = _get(f"{url}/v1/tasks/312/effects")
    assert [e["key"] for e in page["effects"]] == [f"k{n:06d}" for n in range(100)]
    assert page["next_cursor"], "there is more"
    assert size < 512 * 1024, f"a page of {size} bytes"
    assert seconds < 2, f"answered in {seconds:.2f} s"

    seen = len(page["effects"])
    for _ in range(20):
        page, _, _ = _get(f"{url}/v1/tasks/312/effects?limit=500&cursor={page['next_cursor']}")
        seen += len(page["effects"])
    assert seen == 100 + 20 * 500
    assert page["effects"][-1]["key"] == f"k{seen - 1:06d}"
    growth = resident_mib(child.pid) - before
    assert growth < 40, f"the sidecar grew by {growth:.0f} MiB reading {seen} effects"
