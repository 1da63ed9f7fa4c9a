"""Done, reopen and prune with a real `sidecar serve` and the CLI, as an operator runs them."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import urllib.error
import urllib.request
from contextlib import closing
from datetime import UTC, datetime, timedelta

import pytest

from sidecar.domain.model import EffectState
from sidecar.store import create_store
from sidecar.store.rows import to_us
from tests.acceptance.conftest import run_sidecar as sidecar

pytestmark = pytest.mark.acceptance


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


async def _waiting_task(url: str) -> None:
    """A task with an effect whose outcome a human must settle, written beside the sidecar."""
    async with create_store(url) as store:
        a = await store.claim("waits", "worker-w", 60)
        await store.record_pending(
            "waits", "k", a.attempt_id, a.generation, kind="http", rule="r",
            fingerprint="f", idempotency_key=None, request={},
        )  # fmt: skip
        await store.transition_effect("waits", "k", a.attempt_id, a.generation, EffectState.UNKNOWN)
        await store.release("waits", a.attempt_id, a.generation)


def test_done_refuses_claims_until_reopened_and_prune_keeps_what_waits(sidecar_process):
    _, url, data = sidecar_process
    status, claim = post(f"{url}/v1/tasks/312/claim", {"worker": "worker-a", "ttl_s": 60})
    assert status == 200
    token = {"attempt_id": claim["attempt_id"], "generation": claim["generation"]}
    assert post(f"{url}/v1/tasks/312/checkpoints", token | {"stage": "PLAN"})[0] == 201
    assert post(f"{url}/v1/tasks/312/release", token)[0] == 200

    done = sidecar("tasks", "done", "312", "--note", "merged", "--control", url)
    assert done.returncode == 0, done.stderr
    assert "312 is done" in done.stdout
    status, problem = post(f"{url}/v1/tasks/312/claim", {"worker": "worker-b", "ttl_s": 60})
    assert (status, problem["code"]) == (409, "task_done")
    ran = sidecar("exec", "--control", url, "--task", "312", "--", sys.executable, "-c", "")
    assert ran.returncode == 1, ran.stderr
    assert "marked done" in ran.stderr
    assert "tasks reopen 312" in ran.stderr

    reopened = sidecar("tasks", "reopen", "312", "--note", "one more", "--control", url)
    assert reopened.returncode == 0, reopened.stderr
    status, again = post(f"{url}/v1/tasks/312/claim", {"worker": "worker-b", "ttl_s": 60})
    assert status == 200
    assert again["last_checkpoint"]["stage"] == "PLAN"
    token = {"attempt_id": again["attempt_id"], "generation": again["generation"]}
    status, shown = post(f"{url}/v1/tasks/312/done", token | {"note": "finished"})
    assert status == 200
    assert shown["done"]["note"] == "finished"

    store_url = f"sqlite:///{data}/effects.db"
    asyncio.run(_waiting_task(store_url))
    archive = sidecar("effects", "--jsonl", "--control", url)
    assert archive.returncode == 0, archive.stderr
    assert [json.loads(x)["task"] for x in archive.stdout.splitlines()] == ["waits"]
    old = to_us(datetime.now(UTC) - timedelta(days=40))
    with closing(sqlite3.connect(data / "effects.db", timeout=10)) as db, db:
        db.execute("UPDATE tasks SET updated_at = ? WHERE task IN ('312', 'waits')", (old,))

    dry = sidecar("prune", "--older-than", "30d", "--dry-run", "--data-dir", str(data))
    assert dry.returncode == 0, dry.stderr
    assert "would delete 312: " in dry.stdout
    assert "kept waits: an effect waits for a human" in dry.stdout
    listing = sidecar("tasks", "--control", url, "--json")
    assert {t["task"] for t in json.loads(listing.stdout)} == {"312", "waits"}

    pruned = sidecar("prune", "--older-than", "30d", "--data-dir", str(data))
    assert pruned.returncode == 0, pruned.stderr
    assert "deleted 312: " in pruned.stdout
    assert "1 task(s) deleted" in pruned.stdout
    listing = sidecar("tasks", "--control", url, "--json")
    assert [t["task"] for t in json.loads(listing.stdout)] == ["waits"]
    gone = sidecar("tasks", "312", "--control", url)
    assert gone.returncode == 1
    assert "never been claimed" in gone.stderr
