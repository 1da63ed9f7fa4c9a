"""``sidecar tasks done|reopen``, ``sidecar prune`` and ``sidecar effects --jsonl`` on a store."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from contextlib import closing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.domain.model import EffectState, RecordedResponse
from sidecar.store import create_store
from sidecar.store.rows import to_us

OLD = datetime.now(UTC) - timedelta(days=40)


async def _fill(url: str) -> None:
    async with create_store(url) as store:
        for task, state in (("done-1", EffectState.COMPLETED), ("waiting-1", EffectState.UNKNOWN)):
            a = await store.claim(task, "worker-a", 60)
            await store.append_checkpoint(task, a.attempt_id, a.generation, "PLAN", {})
            await store.record_pending(
                task, f"{task}#k", a.attempt_id, a.generation, kind="http", rule="r",
                fingerprint="f", idempotency_key=None, request={"method": "POST"},
            )  # fmt: skip
            answer = RecordedResponse(201, (), b"") if state is EffectState.COMPLETED else None
            await store.transition_effect(
                task, f"{task}#k", a.attempt_id, a.generation, state, response=answer
            )
            await store.release(task, a.attempt_id, a.generation)
        await store.claim("live-1", "worker-b", 3600)


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path}/effects.db"
    asyncio.run(_fill(url))
    return url


def _age(url: str, *tasks: str) -> None:
    """Set the tasks' last update back 40 days, in the file."""
    with closing(sqlite3.connect(url.removeprefix("sqlite:///"))) as db, db:
        for task in tasks:
            db.execute("UPDATE tasks SET updated_at = ? WHERE task = ?", (to_us(OLD), task))


def _tasks(url: str, capsys) -> dict[str, dict]:
    capsys.readouterr()
    assert main(["tasks", "--store", url, "--json"]) == 0
    return {t["task"]: t for t in json.loads(capsys.readouterr().out)}


def test_done_then_reopen_in_the_store(store_url, capsys):
    assert main(["tasks", "done", "done-1", "--note", "merged", "--store", store_url]) == 0
    said = capsys.readouterr().out
    assert "done-1 is done" in said
    assert "merged" in said
    assert "tasks reopen done-1" in said
    listed = _tasks(store_url, capsys)
    assert listed["done-1"]["state"] == "done"
    assert listed["done-1"]["done"]["note"] == "merged"
    assert main(["tasks", "--state", "done", "--store", store_url]) == 0
    table = capsys.readouterr().out
    assert "done-1" in table
    assert "waiting-1" not in table
    # a live lease: an operator cannot mark it done
    assert main(["tasks", "done", "live-1", "--store", store_url]) == 4  # lease held
    assert "lease" in capsys.readouterr().err
    assert main(["tasks", "reopen", "done-1", "--by", "bob", "--store", store_url]) == 0
    assert "can be claimed again" in capsys.readouterr().out
    assert _tasks(store_url, capsys)["done-1"]["state"] == "free"


def test_prune_dry_run_then_prune(store_url, capsys):
    assert main(["tasks", "done", "done-1", "--store", store_url]) == 0
    _age(store_url, "done-1", "waiting-1", "live-1")
    capsys.readouterr()
    assert main(["prune", "--older-than", "30d", "--dry-run", "--store", store_url]) == 0
    out = capsys.readouterr().out
    assert "would delete done-1: effect_events=2 effects=1 checkpoints=1" in out
    assert "kept waiting-1: an effect waits for a human" in out
    assert "kept live-1: its lease is live" in out
    assert "1 task(s) would be deleted" in out
    assert set(_tasks(store_url, capsys)) == {"done-1", "waiting-1", "live-1"}

    assert main(["prune", "--older-than", "30d", "--store", store_url]) == 0
    captured = capsys.readouterr()
    assert "deleted done-1" in captured.out
    assert "VACUUM" in captured.err
    assert set(_tasks(store_url, capsys)) == {"waiting-1", "live-1"}
    assert main(["effects", "done-1", "--store", store_url]) == 1  # never claimed now


def test_prune_wants_a_duration(store_url, capsys):
    with pytest.raises(SystemExit) as usage:
        main(["prune", "--older-than", "soon", "--store", store_url])
    assert usage.value.code == 2


def test_effects_jsonl_exports_every_task_newest_first(store_url, capsys):
    capsys.readouterr()
    assert main(["effects", "--jsonl", "--store", store_url]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["task"] for e in lines] == ["waiting-1", "done-1"]
    assert [ev["event"] for ev in lines[1]["events"]] == ["pending", "completed"]
    assert main(["effects", "--jsonl", "--task", "done-1", "--store", store_url]) == 0
    assert [json.loads(x)["key"] for x in capsys.readouterr().out.splitlines()] == ["done-1#k"]
    assert main(["effects", "--jsonl", "--since", "1h", "--store", store_url]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    future = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    assert main(["effects", "--jsonl", "--since", future, "--store", store_url]) == 0
    assert capsys.readouterr().out == ""
    assert main(["effects", "--store", store_url]) == 2  # no TASK, no --jsonl
    assert "--jsonl" in capsys.readouterr().err
