"""Claim, heartbeat, release and task state over HTTP, with every refusal."""

from __future__ import annotations

import pytest

from tests.unit.conftest import claim

PROBLEM = "application/problem+json"


async def problem_of(response, status: int, code: str) -> dict:
    assert response.status == status, await response.text()
    assert response.content_type == PROBLEM
    body = await response.json()
    assert body["code"] == code
    assert body["status"] == status
    assert body["type"].endswith(code)
    assert body["title"]
    assert body["detail"]
    return body


async def test_claim_answers_attempt_generation_and_lease(client, clock):
    body = await claim(client)
    assert body["task"] == "312"
    assert body["attempt_id"] == "att-0001"
    assert body["generation"] == 1
    assert body["last_checkpoint"] is None
    assert body["lease_expires_at"].startswith("2026-01-01T14:00:02")


async def test_a_second_worker_gets_lease_held_with_holder_and_expiry(client):
    await claim(client)
    response = await client.post("/v1/tasks/312/claim", json={"worker": "worker-b", "ttl_s": 2})
    body = await problem_of(response, 409, "lease_held")
    assert body["holder"] == "worker-a"
    assert body["holder_attempt_id"] == "att-0001"
    assert "lease_expires_at" in body


async def test_after_expiry_the_new_claim_returns_the_last_checkpoint(client, clock):
    first = await claim(client)
    await client.post(
        "/v1/tasks/312/checkpoints",
        json={"attempt_id": first["attempt_id"], "generation": 1, "stage": "READ_COMPLETE"},
    )
    clock.advance(2)
    second = await claim(client, worker="worker-b")
    assert second["generation"] == 2
    assert second["previous_attempt_id"] == first["attempt_id"]
    assert second["last_checkpoint"]["stage"] == "READ_COMPLETE"


async def test_heartbeat_extends_and_release_frees_the_task(client, clock):
    first = await claim(client)
    token = {"attempt_id": first["attempt_id"], "generation": 1}
    clock.advance(1.5)
    response = await client.post("/v1/tasks/312/heartbeat", json=token | {"ttl_s": 10})
    assert response.status == 200
    assert (await response.json())["lease"]["expires_at"].startswith("2026-01-01T14:00:11.5")
    response = await client.post("/v1/tasks/312/release", json=token)
    assert response.status == 200
    assert (await response.json())["lease"]["released_at"] is not None
    again = await client.post("/v1/tasks/312/release", json=token)
    assert again.status == 200, "a repeated release is idempotent"
    await claim(client, worker="worker-b")


@pytest.mark.parametrize("route", ["heartbeat", "release"])
async def test_stale_heartbeat_and_release_are_refused(client, clock, route):
    first = await claim(client)
    clock.advance(2)
    await claim(client, worker="worker-b")
    response = await client.post(
        f"/v1/tasks/312/{route}", json={"attempt_id": first["attempt_id"], "generation": 1}
    )
    body = await problem_of(response, 409, "stale_generation")
    assert body["current_generation"] == 2


@pytest.mark.parametrize("route", ["heartbeat", "release"])
async def test_heartbeat_and_release_of_an_unknown_task_are_not_found(client, route):
    response = await client.post(
        f"/v1/tasks/999/{route}", json={"attempt_id": "att-x", "generation": 1}
    )
    await problem_of(response, 404, "not_found")


async def test_task_state_shows_attempts_checkpoint_effects_and_refusals(client, clock):
    first = await claim(client)
    clock.advance(2)
    await claim(client, worker="worker-b")
    await client.post(
        "/v1/tasks/312/checkpoints",
        json={"attempt_id": first["attempt_id"], "generation": 1, "stage": "LATE"},
    )
    response = await client.get("/v1/tasks/312")
    assert response.status == 200
    body = await response.json()
    assert [a["worker"] for a in body["attempts"]] == ["worker-a", "worker-b"]
    assert body["attempts"][0]["end_reason"] == "expired"
    assert body["lease"]["worker"] == "worker-b"
    assert body["lease"]["live"] is True
    assert body["effects"] == {"pending": 0, "completed": 0, "failed": 0, "unknown": 0}
    assert [r["operation"] for r in body["refused_writes"]] == ["checkpoint"]


async def test_unknown_task_is_not_found(client):
    await problem_of(await client.get("/v1/tasks/999"), 404, "not_found")


@pytest.mark.parametrize(
    ("payload", "status", "field"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 422, None),
        (b'{"worker": "a", "ttl_s": 2, "extra": 1}', 422, "extra"),
        (b'{"worker": "a"}', 422, "ttl_s"),
        (b'{"worker": "a", "ttl_s": "soon"}', 422, "ttl_s"),
        (b'{"worker": "a", "ttl_s": 0}', 422, "ttl_s"),
        (b'{"worker": "a", "ttl_s": 1e9}', 422, "ttl_s"),
        (b'{"worker": "", "ttl_s": 2}', 422, "worker"),
        (b'{"worker": "has space", "ttl_s": 2}', 422, "worker"),
    ],
)
async def test_malformed_claims_are_invalid_request(client, payload, status, field):
    response = await client.post("/v1/tasks/312/claim", data=payload)
    body = await problem_of(response, status, "invalid_request")
    if field is not None:
        assert [e["loc"] for e in body["errors"]] == [[field]]


async def test_invalid_task_ids_are_invalid_request(client):
    response = await client.post("/v1/tasks/a%20b/claim", json={"worker": "a", "ttl_s": 2})
    await problem_of(response, 400, "invalid_request")


async def test_a_value_the_store_cannot_hold_is_refused_at_the_door_and_bricks_nothing(client):
    first = await claim(client)
    token = {"attempt_id": first["attempt_id"], "generation": 1}
    # A lone surrogate (valid JSON, not encodable as UTF-8) in a checkpoint's outputs.
    lone = (
        b'{"attempt_id": "att-0001", "generation": 1, "stage": "S", "outputs": {"note": "\\udc00"}}'
    )
    response = await client.post(
        "/v1/tasks/312/checkpoints", data=lone, headers={"Content-Type": "application/json"}
    )
    body = await problem_of(response, 422, "invalid_request")
    assert body["errors"][0]["loc"] == ["outputs", "note"]
    assert "surrogate" in body["errors"][0]["msg"]

    response = await client.post("/v1/tasks/312/heartbeat", json=token | {"generation": 1 << 63})
    await problem_of(response, 422, "invalid_request")
    response = await client.post("/v1/tasks/312/heartbeat", json=token | {"attempt_id": "a\x00b"})
    await problem_of(response, 422, "invalid_request")

    # Nothing of it was written: the task reads, and its holder goes on.
    assert (await client.get("/v1/tasks/312")).status == 200
    assert (await client.get("/v1/tasks/312/checkpoints")).status == 200
    response = await client.post(
        "/v1/tasks/312/checkpoints", json=token | {"stage": "S", "outputs": {"note": "ok"}}
    )
    assert response.status == 201


async def test_hostile_shapes_are_client_errors_not_500s(client):
    deep = b'{"worker": "a", "ttl_s": 2, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    response = await client.post(
        "/v1/tasks/312/claim", data=deep, headers={"Content-Type": "application/json"}
    )
    await problem_of(response, 400, "invalid_request")
    # Python's "$" would take a trailing newline: task "312\n" must not be created.
    response = await client.post("/v1/tasks/312%0A/claim", json={"worker": "a", "ttl_s": 2})
    await problem_of(response, 400, "invalid_request")
    for ttl in ("60", True):
        response = await client.post("/v1/tasks/312/claim", json={"worker": "a", "ttl_s": ttl})
        await problem_of(response, 422, "invalid_request")
    assert (await client.get("/v1/tasks/312")).status == 404
