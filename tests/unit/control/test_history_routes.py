"""Checkpoints and the effect audit trail over HTTP."""

from __future__ import annotations

import io
import json

from sidecar.domain.model import EffectState, RecordedResponse
from tests.unit.conftest import claim
from tests.unit.control.test_tasks_routes import problem_of


async def test_checkpoints_are_created_numbered_and_listed(client):
    first = await claim(client)
    token = {"attempt_id": first["attempt_id"], "generation": 1}
    for stage, outputs in [("READ_COMPLETE", {}), ("PATCH_GENERATED", {"patch_hash": "abc123"})]:
        response = await client.post(
            "/v1/tasks/312/checkpoints", json=token | {"stage": stage, "outputs": outputs}
        )
        assert response.status == 201
    assert (await response.json())["seq"] == 2
    listed = await (await client.get("/v1/tasks/312/checkpoints")).json()
    assert [(c["seq"], c["stage"], c["outputs"]) for c in listed["checkpoints"]] == [
        (1, "READ_COMPLETE", {}),
        (2, "PATCH_GENERATED", {"patch_hash": "abc123"}),
    ]


async def test_a_stale_checkpoint_is_refused_and_not_written(client, clock):
    first = await claim(client)
    clock.advance(2)
    second = await claim(client, worker="worker-b")
    response = await client.post(
        "/v1/tasks/312/checkpoints",
        json={"attempt_id": first["attempt_id"], "generation": 1, "stage": "PATCH_APPLIED"},
    )
    await problem_of(response, 409, "stale_generation")
    response = await client.post(
        "/v1/tasks/312/checkpoints",
        json={"attempt_id": second["attempt_id"], "generation": 2, "stage": "PATCH_APPLIED"},
    )
    assert response.status == 201
    listed = await (await client.get("/v1/tasks/312/checkpoints")).json()
    assert [c["generation"] for c in listed["checkpoints"]] == [2]


async def test_a_forged_generation_is_refused(client):
    first = await claim(client)
    response = await client.post(
        "/v1/tasks/312/checkpoints",
        json={"attempt_id": first["attempt_id"], "generation": 7, "stage": "X"},
    )
    body = await problem_of(response, 409, "stale_generation")
    assert "never issued" in body["detail"]


async def test_checkpoint_body_is_validated(client):
    await claim(client)
    response = await client.post(
        "/v1/tasks/312/checkpoints",
        json={"attempt_id": "att-0001", "generation": "one", "stage": "", "outputs": []},
    )
    body = await problem_of(response, 422, "invalid_request")
    assert {e["loc"][0] for e in body["errors"]} == {"generation", "stage", "outputs"}


async def test_oversized_bodies_are_refused_with_413(client):
    await claim(client)
    huge = {"attempt_id": "att-0001", "generation": 1, "stage": "X", "outputs": {"x": "a" * 2**21}}
    body = io.BytesIO(json.dumps(huge).encode())
    response = await client.post("/v1/tasks/312/checkpoints", data=body)
    await problem_of(response, 413, "payload_too_large")


async def test_histories_of_an_unknown_task_are_not_found(client):
    await problem_of(await client.get("/v1/tasks/999/checkpoints"), 404, "not_found")
    await problem_of(await client.get("/v1/tasks/999/effects"), 404, "not_found")


async def test_effects_show_which_attempt_did_what(client, memory_store, clock):
    first = await claim(client)
    await memory_store.record_pending(
        "312",
        "pr:agent/312->main",
        first["attempt_id"],
        1,
        kind="http",
        rule="github.pulls.create",
        fingerprint="sha256:aa",
        idempotency_key="att-0001:1234",
        request={"method": "POST", "url": "https://api.github.com/repos/o/r/pulls"},
    )
    await memory_store.transition_effect(
        "312",
        "pr:agent/312->main",
        first["attempt_id"],
        1,
        EffectState.COMPLETED,
        response=RecordedResponse(201, (), b'{"number": 1}'),
    )
    clock.advance(2)
    second = await claim(client, worker="worker-b")
    await memory_store.note_effect("312", "pr:agent/312->main", second["attempt_id"], 2, "replayed")
    body = await (await client.get("/v1/tasks/312/effects")).json()
    (effect,) = body["effects"]
    assert effect["state"] == "completed"
    assert effect["origin_attempt_id"] == first["attempt_id"]
    assert effect["response"]["status"] == 201
    assert effect["response"]["body_bytes"] == len(b'{"number": 1}')
    assert [(e["event"], e["attempt_id"]) for e in effect["events"]] == [
        ("pending", first["attempt_id"]),
        ("completed", first["attempt_id"]),
        ("replayed", second["attempt_id"]),
    ]
    summary = await (await client.get("/v1/tasks/312")).json()
    assert summary["effects"]["completed"] == 1


async def _record(store, task: str, attempt_id: str, key: str) -> None:
    await store.record_pending(
        task,
        key,
        attempt_id,
        1,
        kind="http",
        rule="r",
        fingerprint="f",
        idempotency_key=None,
        request={"method": "POST"},
    )


async def test_the_effect_log_is_answered_a_page_at_a_time(client, memory_store):
    first = await claim(client)
    keys = [f"k{n:03d}" for n in range(250)]
    for key in keys:
        await _record(memory_store, "312", first["attempt_id"], key)
    seen, pages, cursor = [], 0, None
    while True:
        query = "" if cursor is None else f"?cursor={cursor}"
        body = await (await client.get(f"/v1/tasks/312/effects{query}")).json()
        pages += 1
        seen += [e["key"] for e in body["effects"]]
        assert all(e["events"][0]["event"] == "pending" for e in body["effects"])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert pages == 3, "100 + 100 + 50"
    assert seen == keys


async def test_a_page_can_be_smaller(client, memory_store):
    first = await claim(client)
    for key in ("a", "b", "c"):
        await _record(memory_store, "312", first["attempt_id"], key)
    body = await (await client.get("/v1/tasks/312/effects?limit=2")).json()
    assert [e["key"] for e in body["effects"]] == ["a", "b"]
    rest = await (await client.get(f"/v1/tasks/312/effects?cursor={body['next_cursor']}")).json()
    assert [e["key"] for e in rest["effects"]] == ["c"]
    assert rest["next_cursor"] is None


async def test_bad_page_parameters_are_400(client, memory_store):
    await claim(client)
    for query in ("limit=0", "limit=501", "limit=ten", "cursor=%%%", "cursor=bm90anNvbg"):
        response = await client.get(f"/v1/tasks/312/effects?{query}")
        await problem_of(response, 400, "invalid_request")
    checkpoints = await (await client.get("/v1/tasks/312/checkpoints?limit=1")).json()
    assert checkpoints["next_cursor"] is None
    # A cursor of one list is refused by another, never read as a wrong position.
    foreign = __import__("sidecar.control.pages", fromlist=["x"]).next_cursor("checkpoints", 1)
    await problem_of(
        await client.get(f"/v1/tasks/312/effects?cursor={foreign}"), 400, "invalid_request"
    )
