"""A data dir whose SQLite store holds many tasks, written through the store API.

Each task is claimed (a worker of eight), gets a checkpoint and one recorded effect;
every third lease is released, every fiftieth effect is left ``unknown`` (waiting for a
human).  For the console's tests and its first-paint benchmark.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sidecar.domain.model import EffectState, RecordedResponse
from sidecar.store.sqlite import SQLiteStore

BATCH = 50  # concurrent writes: the store commits them in groups


def task_id(n: int) -> str:
    return f"task-{n:05d}"


async def _one(store: SQLiteStore, n: int) -> None:
    task = task_id(n)
    claim = await store.claim(task, f"worker-{n % 8}", 3600)
    a, g = claim.attempt_id, claim.generation
    await store.append_checkpoint(task, a, g, "READ_COMPLETE", {"files": n % 17})
    key = f"acme/app#thing:{n}"
    await store.record_pending(
        task, key, a, g, kind="http", rule="test.things.create", fingerprint=f"sha256:{n:064x}",
        idempotency_key=f"{a}:{n:016x}",
        request={"method": "POST", "url": "https://api.things.test/repos/acme/app/things"},
    )  # fmt: skip
    if n % 50 == 0:
        await store.transition_effect(task, key, a, g, EffectState.UNKNOWN, detail="timeout")
    else:
        answer = RecordedResponse(201, (("content-type", "application/json"),), b'{"id": 1}')
        await store.transition_effect(task, key, a, g, EffectState.COMPLETED, response=answer)
    if n % 3 == 0:
        await store.release(task, a, g)


async def _seed(db: Path, tasks: int) -> None:
    store = SQLiteStore(f"sqlite:///{db}")
    await store.open()
    try:
        for start in range(0, tasks, BATCH):
            await asyncio.gather(*(_one(store, n) for n in range(start, min(tasks, start + BATCH))))
    finally:
        await store.close()


def seed(data_dir: Path, tasks: int) -> None:
    """Make ``data_dir`` hold ``tasks`` tasks (ids :func:`task_id`)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(_seed(data_dir / "effects.db", tasks))
