"""POST /v1/tasks/{task}/effects/{effect_key}/resolve: a human settles an effect."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from yarl import URL

from sidecar.domain.effects import abandonment
from sidecar.domain.model import EffectState
from tests.unit.control.test_tasks_routes import problem_of

KEYS = ["acme/app#thing:x", "test.things.blocked:POST /v1/charges#9f2c"]
COMPLETED = {
    "outcome": "completed",
    "response": {"status": 201, "headers": {"X-Thing": "42"}, "body": {"id": "thing_42"}},
    "note": "found it in the dashboard",
    "by": "alice@ops",
}


def path(key: str, task: str = "312") -> URL:
    return URL(f"/v1/tasks/{task}/effects/{quote(key, safe='')}/resolve", encoded=True)


async def blocked(store, clock, key: str, *, release: bool = True) -> None:
    a = await store.claim("312", "worker-a", 60)
    await store.record_pending(
        "312", key, a.attempt_id, a.generation, kind="http", rule="no.such.rule",
        fingerprint="f", idempotency_key=f"{a.attempt_id}:k", request={},
    )  # fmt: skip
    await store.transition_effect("312", key, a.attempt_id, a.generation, EffectState.UNKNOWN)
    if release:
        await store.release("312", a.attempt_id, a.generation)
        clock.advance(91)  # the default rule window: timeout_s 30 + 2 x settle_s 30


@pytest.mark.parametrize("key", KEYS)
async def test_completed_with_an_encoded_key(client, memory_store, clock, key):
    await blocked(memory_store, clock, key)
    response = await client.post(path(key), json=COMPLETED)
    assert response.status == 200, await response.text()
    body = await response.json()
    assert (body["effect_key"], body["outcome"], body["state"]) == (key, "completed", "completed")
    assert body["effect"]["response"]["status"] == 201
    assert body["effect"]["events"][-1]["event"] == "resolved"
    assert "alice@ops" in body["effect"]["events"][-1]["detail"]
    stored = await memory_store.effect("312", key)
    assert stored.response.body == b'{"id":"thing_42"}'
    assert ("X-Thing", "42") in stored.response.headers


async def test_a_slash_left_unencoded_works_too(client, memory_store, clock):
    await blocked(memory_store, clock, KEYS[0])
    url = URL("/v1/tasks/312/effects/acme/app%23thing%3Ax/resolve", encoded=True)
    response = await client.post(url, json={"outcome": "failed", "note": "n", "by": "b"})
    assert response.status == 200, await response.text()


async def test_abandoned(client, memory_store, clock):
    await blocked(memory_store, clock, KEYS[0])
    body = {"outcome": "abandoned", "note": "customer cancelled", "by": "bob"}
    response = await client.post(path(KEYS[0]), json=body)
    assert (await response.json())["state"] == "failed"
    refusal = abandonment(await memory_store.effect("312", KEYS[0]))
    assert (refusal.by, refusal.note) == ("bob", "customer cancelled")
    again = await client.post(path(KEYS[0]), json=body)
    found = await problem_of(again, 409, "not_waiting_for_a_human")
    assert found["effect_key"] == KEYS[0]


async def test_not_while_its_sender_is_live(client, memory_store, clock):
    await blocked(memory_store, clock, KEYS[0], release=False)
    response = await client.post(path(KEYS[0]), json={"outcome": "failed", "note": "n", "by": "b"})
    found = await problem_of(response, 409, "not_waiting_for_a_human")
    assert found["state"] == "unknown"
    assert "has not ended" in found["detail"]


async def test_not_before_its_request_could_land(client, memory_store, clock):
    await blocked(memory_store, clock, KEYS[0])
    clock.advance(-31)
    response = await client.post(path(KEYS[0]), json={"outcome": "failed", "note": "n", "by": "b"})
    found = await problem_of(response, 409, "not_waiting_for_a_human")
    assert found["retry_after_s"] == pytest.approx(30)


async def test_unknown_task_or_effect(client, memory_store, clock):
    body = {"outcome": "failed", "note": "n", "by": "b"}
    await problem_of(await client.post(path("k", task="999"), json=body), 404, "not_found")
    await blocked(memory_store, clock, KEYS[0])
    await problem_of(await client.post(path("other"), json=body), 404, "not_found")


@pytest.mark.parametrize(
    "body",
    [
        {"outcome": "failed", "by": "b"},  # no note
        {"outcome": "failed", "note": "", "by": "b"},
        {"outcome": "failed", "note": "n", "by": "  "},
        {"outcome": "done", "note": "n", "by": "b"},
        {"outcome": "failed", "note": "n", "by": "b", "response": {"status": 200}},
        {"outcome": "completed", "note": "n", "by": "b", "response": {"status": "201"}},
        {"outcome": "completed", "note": "n", "by": "b", "response": {"status": 99}},
        {"outcome": "failed", "note": "n", "by": "b", "extra": 1},
        {"outcome": "failed", "note": "a\x00b", "by": "b"},
    ],
)
async def test_bad_bodies_are_422(client, memory_store, clock, body):
    await blocked(memory_store, clock, KEYS[0])
    found = await problem_of(await client.post(path(KEYS[0]), json=body), 422, "invalid_request")
    assert found["errors"]
    assert (await memory_store.effect("312", KEYS[0])).state is EffectState.UNKNOWN


async def test_completed_without_evidence_is_refused(client, memory_store, clock):
    await blocked(memory_store, clock, KEYS[0])
    body = {"outcome": "completed", "note": "n", "by": "b"}
    found = await problem_of(await client.post(path(KEYS[0]), json=body), 422, "invalid_request")
    assert "needs the response" in found["detail"]
    assert found["errors"][0]["loc"] == ["response"]


async def test_not_json_is_400(client, memory_store, clock):
    await blocked(memory_store, clock, KEYS[0])
    await problem_of(await client.post(path(KEYS[0]), data=b"{"), 400, "invalid_request")


async def test_documented_in_openapi(client):
    document = await (await client.get("/openapi.json")).json()
    route = document["paths"]["/v1/tasks/{task}/effects/{effect_key}/resolve"]["post"]
    assert "not_waiting_for_a_human" in route["responses"]["409"]["description"]
    names = [p["name"] for p in route["parameters"]]
    assert names == ["task", "effect_key"]
