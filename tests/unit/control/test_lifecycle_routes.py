"""POST /v1/tasks/{task}/done and /reopen, and what a done task answers."""

from __future__ import annotations

from tests.unit.conftest import claim
from tests.unit.control.test_tasks_routes import problem_of


async def test_the_holder_marks_done_then_a_claim_gets_task_done(client):
    held = await claim(client)
    token = {"attempt_id": held["attempt_id"], "generation": held["generation"]}
    response = await client.post("/v1/tasks/312/done", json=token | {"note": "merged"})
    assert response.status == 200, await response.text()
    body = await response.json()
    assert body["done"]["by"] == held["attempt_id"]
    assert body["done"]["note"] == "merged"
    assert body["lease"]["released_at"] is not None
    refused = await client.post("/v1/tasks/312/claim", json={"worker": "worker-b", "ttl_s": 2})
    problem = await problem_of(refused, 409, "task_done")
    assert problem["task"] == "312"
    assert problem["note"] == "merged"
    assert "reopen" in problem["detail"]
    shown = await (await client.get("/v1/tasks/312")).json()
    assert shown["done"]["note"] == "merged"


async def test_an_operator_cannot_mark_done_while_a_lease_is_live(client, clock):
    await claim(client)
    response = await client.post("/v1/tasks/312/done", json={"by": "alice"})
    await problem_of(response, 409, "lease_held")
    clock.advance(3)
    response = await client.post("/v1/tasks/312/done", json={"by": "alice", "note": "stuck"})
    assert response.status == 200
    assert (await response.json())["done"]["by"] == "alice"


async def test_a_stale_token_and_half_a_token_are_refused(client):
    first = await claim(client)
    await claim(client)  # the same worker again: first is superseded
    token = {"attempt_id": first["attempt_id"], "generation": first["generation"]}
    await problem_of(await client.post("/v1/tasks/312/done", json=token), 409, "stale_generation")
    half = {"attempt_id": first["attempt_id"]}
    await problem_of(await client.post("/v1/tasks/312/done", json=half), 422, "invalid_request")
    await problem_of(await client.post("/v1/tasks/nope/done", json={}), 404, "not_found")


async def test_reopen_lets_claims_through(client, clock):
    await claim(client)
    clock.advance(3)
    await client.post("/v1/tasks/312/done", json={"by": "alice"})
    bad = await client.post("/v1/tasks/312/reopen", json={"note": " ", "by": "bob"})
    await problem_of(bad, 422, "invalid_request")
    await problem_of(await client.post("/v1/tasks/312/reopen", json={}), 422, "invalid_request")
    response = await client.post("/v1/tasks/312/reopen", json={"note": "again", "by": "bob"})
    body = await response.json()
    assert body["done"] is None
    assert body["reopened"]["by"] == "bob"
    again = await claim(client, worker="worker-b")
    assert again["generation"] == 2


async def test_the_task_list_filters_and_shows_done(client, clock):
    await claim(client, task="a")
    await claim(client, task="b")
    clock.advance(3)
    await client.post("/v1/tasks/a/done", json={"by": "alice"})
    listed = await (await client.get("/v1/tasks", params={"state": "done"})).json()
    assert [(t["task"], t["state"]) for t in listed["tasks"]] == [("a", "done")]
    assert listed["tasks"][0]["done"]["by"] == "alice"
    free = await (await client.get("/v1/tasks", params={"state": "free"})).json()
    assert [t["task"] for t in free["tasks"]] == ["b"]


async def test_openapi_knows_the_routes_and_task_done(client):
    document = await (await client.get("/openapi.json")).json()
    assert "/v1/tasks/{task}/done" in document["paths"]
    assert "/v1/tasks/{task}/reopen" in document["paths"]
    claim_op = document["paths"]["/v1/tasks/{task}/claim"]["post"]
    assert "task_done" in str(claim_op["responses"]["409"])
