"""Listing tasks and effects across tasks over HTTP, a page at a time."""

from __future__ import annotations

from sidecar.domain.model import EffectState
from tests.unit.conftest import claim
from tests.unit.control.test_tasks_routes import problem_of


async def _record(store, task: str, attempt_id: str, key: str) -> None:
    await store.record_pending(
        task, key, attempt_id, 1, kind="http", rule="things.create", fingerprint="f",
        idempotency_key=None, request={"method": "POST"},
    )  # fmt: skip


async def test_tasks_are_listed_newest_first_a_page_at_a_time(client, clock):
    for n in range(5):
        await claim(client, task=f"task-{n}")
        clock.advance(1)
    first = await (await client.get("/v1/tasks?limit=3")).json()
    assert [t["task"] for t in first["tasks"]] == ["task-4", "task-3", "task-2"]
    assert first["tasks"][0]["state"] == "leased"
    assert "attempts" not in first["tasks"][0], "a listing has no attempts: GET the task"
    rest = await (await client.get(f"/v1/tasks?cursor={first['next_cursor']}")).json()
    assert [t["task"] for t in rest["tasks"]] == ["task-1", "task-0"]
    assert rest["next_cursor"] is None


async def test_what_waits_for_a_human_is_one_query_away(client, memory_store):
    a = await claim(client, task="312")
    await _record(memory_store, "312", a["attempt_id"], "pr#1")
    await _record(memory_store, "312", a["attempt_id"], "pr#2")
    await memory_store.transition_effect("312", "pr#2", a["attempt_id"], 1, EffectState.UNKNOWN)
    await claim(client, task="313")
    waiting = await (await client.get("/v1/effects?state=unknown")).json()
    assert [(e["task"], e["key"]) for e in waiting["effects"]] == [("312", "pr#2")]
    assert waiting["effects"][0]["events"][0]["event"] == "pending"
    tasks = await (await client.get("/v1/tasks?state=waiting")).json()
    assert [(t["task"], t["waiting_for_human"]) for t in tasks["tasks"]] == [("312", 1)]


async def test_bad_filters_are_400(client):
    for query in (
        "/v1/tasks?state=running",
        "/v1/effects?state=stuck",
        "/v1/effects?task=a%0A",
        "/v1/tasks?limit=0",
        "/v1/effects?cursor=WyJ0YXNrcyIsWzEsImEiXV0",  # a tasks cursor
    ):
        await problem_of(await client.get(query), 400, "invalid_request")
